"""Decode loops: target-only autoregressive (the baseline) and speculative decoding (batch size 1).

Both loops own the target's KV cache (preallocated, rolled back by moving its length) and a
preallocated token buffer, so a step does constant Python work however long the sequence gets.
Invariant of the speculative loop: the target cache holds every token except the last emitted one;
a cycle feeds ``[last, d_1 .. d_L]`` to the target and reads L + 1 next-token distributions.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from specdec_tune.engine.drafters import probs_from_logits
from specdec_tune.engine.kvcache import PreallocatedCache, forward_with_cache, make_cache
from specdec_tune.engine.types import CycleStats, Draft, Drafter, GenerationResult, VerifyResult
from specdec_tune.engine.lossy import check_acceptance
from specdec_tune.engine.verify import SyntheticAcceptance, greedy_accept, synthetic_verdict, verify_lossy, verify_sampling
from specdec_tune.core.limits import MAX_SPECULATIVE_TOKENS
from specdec_tune.core.schedules import SCHEDULES, THRESHOLD_RULES, AdaptiveThreshold
from specdec_tune.core.schedules import check_threshold_kind, next_num_speculative


@dataclass(frozen=True)
class DecodeConfig:
    """Settings of one decode call (validated on construction)."""

    max_new_tokens: int
    num_speculative_tokens: int = 4
    threshold: float = 0.0
    schedule: str = "constant"
    temperature: float = 0.0
    eos_token_id: int | None = None
    threshold_rule: str = "before"  # 'before' (exact; ours) or 'hf' (transformers'); see ModelDrafter
    # Synthetic acceptance: conditional α_1, α_2, ... (the last repeats), seeded by synthetic_seed and the
    # prompt; greedy only (verify.SyntheticAcceptance). None: the target decides.
    synthetic_acceptance: tuple[float, ...] | None = None
    synthetic_seed: int = 0
    threshold_kind: str = "per-token"  # 'per-token' | 'cumulative' | 'adaptive' (specdec_tune.core.schedules)
    threshold_step: float = 0.05  # the adaptive kind's step (θ moves within schedules.ADAPTIVE_BOUNDS)
    acceptance: str = "exact"  # 'exact' | 'opt' (Decoding-OPT) | 'uno' (Decoding-UNO): engine.lossy
    epsilon: float = 0.0  # over-acceptance ε of 'opt' and 'uno' (sampling only)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got {self.num_speculative_tokens}")
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold must be in [0, 1), got {self.threshold}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.threshold_rule not in THRESHOLD_RULES:
            raise ValueError(f"threshold_rule must be one of {', '.join(THRESHOLD_RULES)}, got {self.threshold_rule!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        rates = self.synthetic_acceptance
        if rates is not None:
            if not rates or any(not 0.0 <= a <= 1.0 for a in rates):
                raise ValueError(f"synthetic acceptance rates must be 1 or more values in [0, 1], got {list(rates)}")
            if self.temperature > 0:
                raise ValueError("synthetic acceptance decodes greedily (temperature 0)")
        check_threshold_kind(self.threshold_kind, self.threshold_rule)
        check_acceptance(self.acceptance, self.epsilon)
        if self.acceptance != "exact" and self.temperature == 0:
            raise ValueError(f"acceptance {self.acceptance!r} is a sampling rule; temperature must be > 0")
        if self.threshold_kind == "adaptive":
            AdaptiveThreshold(self.threshold, self.threshold_step)  # raises ValueError naming the bad value


VerifyFn = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Generator | None], VerifyResult]


def _forward(model: torch.nn.Module, ids: torch.Tensor, cache, keep: int) -> torch.Tensor:
    """Target/draft forward over ``ids`` ``[k]`` with the cache; logits of the last ``keep`` positions."""
    return forward_with_cache(model, ids[None], cache, logits_to_keep=keep).logits[0]


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(probs_from_logits(logits, temperature), 1, generator=generator))


def _emit(out: list[int], new: list[int], limit: int, eos: int | None) -> tuple[int, bool]:
    """Append ``new`` to ``out`` up to EOS (inclusive) and ``limit`` tokens; return (count, hit_eos)."""
    count = 0
    for tok in new:
        if len(out) >= limit:
            break
        out.append(tok)
        count += 1
        if tok == eos:
            return count, True
    return count, False


def autoregressive(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    config: DecodeConfig,
    generator: torch.Generator | None = None,
    on_cycle: Callable[[CycleStats], None] | None = None,
) -> GenerationResult:
    """Target-only decoding with a KV cache: the reference for correctness and speed.

    Args:
        model: the target causal LM.
        prompt_ids: ``[T]`` prompt token ids on the model's device.
        config: max_new_tokens, temperature and eos are used.
        on_cycle: called after each token is picked (one "cycle" of plain decoding: nothing drafted,
            one token emitted), so the profiler can time token arrivals as it does speculative cycles.
    """
    _check_prompt(prompt_ids)
    cache = make_cache(model, prompt_ids.shape[0] + config.max_new_tokens + 1)
    out: list[int] = []
    logits = _forward(model, prompt_ids, cache, 1)[-1]
    eos_hit = False
    buf = torch.empty(1, dtype=torch.long, device=prompt_ids.device)
    positions = prompt_ids.shape[0]  # the first token comes out of the prefill
    while True:
        tok = _pick(logits, config.temperature, generator)  # the step's host synchronisation
        out.append(tok)
        if on_cycle is not None:
            on_cycle(CycleStats(drafted=0, accepted=0, emitted=1, confidences=(), outcomes=(),
                                target_positions=positions))
        positions = 1
        if tok == config.eos_token_id:
            eos_hit = True
            break
        if len(out) >= config.max_new_tokens:
            break
        buf.fill_(tok)
        logits = _forward(model, buf, cache, 1)[-1]
    return GenerationResult(prompt_tokens=prompt_ids.shape[0], token_ids=out, finished_by_eos=eos_hit)


def speculative(
    model: torch.nn.Module,
    drafter: Drafter,
    prompt_ids: torch.Tensor,
    config: DecodeConfig,
    generator: torch.Generator | None = None,
    on_cycle: Callable[[CycleStats], None] | None = None,
    verify_fn: VerifyFn | None = None,
    cache: PreallocatedCache | None = None,
    n_for_cycle: Callable[[int], int] | None = None,
) -> GenerationResult:
    """Speculative decoding: draft up to N tokens, verify them in one target forward, accept a prefix.

    Args:
        model: the target causal LM.
        drafter: a fresh drafter for this sequence (draft model or n-gram).
        prompt_ids: ``[T]`` prompt ids on the model's device.
        config: N, threshold (applied by the drafter), schedule, temperature, limits.
        generator: random source for sampling mode.
        on_cycle: called after every cycle with its statistics (the profiler's hook for timing).
        verify_fn: replaces the sampling verifier (``verify_sampling``, or ``verify_lossy`` with the config's
            acceptance and ε); tests use it to show the exactness test has power, the profiler to read
            each verified position's p and q.
        cache: a target cache to reuse (reset here); one is allocated when absent or too small.
        n_for_cycle: cycle index -> its most draft tokens (a server's N as its load changes; 0: a plain step).
    """
    _check_prompt(prompt_ids)
    n_max = config.num_speculative_tokens
    verify_s = verify_fn or (verify_sampling if config.acceptance == "exact" else
                             partial(verify_lossy, epsilon=config.epsilon, method=config.acceptance))
    synthetic = _synthetic(prompt_ids, config)  # None unless synthetic acceptance
    cache, tokens = _prefill(model, prompt_ids, config, cache)  # tokens: prompt + emitted
    length = prompt_ids.shape[0]
    out: list[int] = []
    cycles: list[CycleStats] = []
    eos_hit = False
    n_cur = n_max
    # Invariant: the target cache holds tokens[:length - 1]; the last emitted token is fed next.
    while not eos_hit and len(out) < config.max_new_tokens:
        budget = min(n_cur, config.max_new_tokens - len(out),  # never draft past the limit
                     n_max if n_for_cycle is None else n_for_cycle(len(cycles)))
        draft = drafter.propose(tokens[:length], budget) if budget > 0 else _no_draft(tokens)
        n_draft = draft.length
        feed = tokens[length - 1:length + n_draft]  # [L + 1]: last emitted, d_1 .. d_L
        if n_draft:
            tokens[length:length + n_draft] = draft.tokens
        logits = _forward(model, feed, cache, n_draft + 1)  # [L + 1, vocab]
        verdict = _verdict(draft, logits, config, verify_s, generator, synthetic)
        acc, nxt = verdict.accepted, verdict.next_token
        emitted, eos_hit = _emit(out, verdict.drafted[:acc] + [nxt], config.max_new_tokens, config.eos_token_id)
        if emitted > acc:  # the accepted draft tokens are already in the buffer
            tokens[length + acc] = nxt
        # Target cache: keep the context plus the accepted tokens (rejected positions rolled back).
        cache.truncate(length + acc)
        length += emitted
        stats = _cycle_stats(drafter if budget > 0 else None, verdict, emitted)
        if budget > 0:
            drafter.observe(acc)
        cycles.append(stats)
        if on_cycle is not None:
            on_cycle(stats)
        # The one schedule rule (specdec_tune.core.schedules): HF's heuristic, capped at the N given.
        n_cur = next_num_speculative(config.schedule, n_cur, n_max, n_draft, acc)
    return GenerationResult(prompt_tokens=prompt_ids.shape[0], token_ids=out, cycles=cycles, finished_by_eos=eos_hit)


@dataclass(frozen=True)
class _Verdict:
    """One cycle's verification, read back to the host."""

    accepted: int  # length of the accepted prefix (0..L)
    next_token: int  # the target's bonus or recovered token
    drafted: list[int]  # [L] the draft's token ids
    confidences: list[float]  # [L] the draft's confidence per token
    token_probs: list[float]  # [L] each drafted token's own draft probability (the confidences when greedy)
    threshold: float  # θ of this cycle
    target_probs: list[float] = field(default_factory=list)  # [L] p(x_i) of each drafted token (sampling)


def _prefill(
    model: torch.nn.Module, prompt_ids: torch.Tensor, config: DecodeConfig, cache: PreallocatedCache | None
) -> tuple[PreallocatedCache, torch.Tensor]:
    """A reset target cache holding all but the last prompt token, and a token buffer holding the prompt.

    The last prompt token is fed by the first cycle, so every generated token (the first included)
    goes through draft -> verify.
    """
    total = prompt_ids.shape[0] + config.max_new_tokens + config.num_speculative_tokens + 2
    if cache is None or cache.max_len < total:
        cache = make_cache(model, total)
    cache.truncate(0)
    tokens = torch.empty(total, dtype=torch.long, device=prompt_ids.device)  # [total]
    tokens[:prompt_ids.shape[0]] = prompt_ids
    if prompt_ids.shape[0] > 1:
        _forward(model, prompt_ids[:-1], cache, 1)
    return cache, tokens


def _synthetic(prompt_ids: torch.Tensor, config: DecodeConfig) -> SyntheticAcceptance | None:
    """The synthetic acceptance of this decode (None: the target decides), seeded from
    ``synthetic_seed`` and the prompt, so every prompt draws its own acceptances and a repeat of a
    prompt draws the same (one host read of the prompt per decode)."""
    if config.synthetic_acceptance is None:
        return None
    ids = prompt_ids.tolist()
    return SyntheticAcceptance(config.synthetic_acceptance,
                               config.synthetic_seed * 1_000_003 + sum((i + 1) * t for i, t in enumerate(ids)))


def _verdict(
    draft: Draft, logits: torch.Tensor, config: DecodeConfig, verify_s: VerifyFn, generator: torch.Generator | None,
    synthetic: SyntheticAcceptance | None = None,
) -> _Verdict:
    """Verify ``draft`` against the target's ``[L + 1, vocab]`` logits (sampling, greedy or synthetic)."""
    if config.temperature > 0:
        target_probs = probs_from_logits(logits, config.temperature)  # [L + 1, vocab]
        result = verify_s(draft.tokens, draft.probs, target_probs, generator)
        token_probs = draft.token_probs.tolist() if draft.token_probs is not None else []
        p_drafted = target_probs[torch.arange(draft.length, device=logits.device), draft.tokens].tolist()  # [L]
        return _Verdict(result.num_accepted, result.next_token, draft.tokens.tolist(), draft.confidence.tolist(),
                        token_probs, draft.threshold, p_drafted)
    if synthetic is None:
        verdict = greedy_accept(draft.tokens, logits)
    else:
        verdict = synthetic_verdict(logits, synthetic.draw(draft.length))
    # The cycle's one host synchronisation: verdict, draft tokens and confidences in one copy
    # (float64 holds every token id exactly). A greedy draft token is the argmax: its own probability
    # is its confidence.
    n_draft = draft.length
    host = torch.cat([verdict.double(), draft.tokens.double(), draft.confidence.double()]).tolist()
    confidences = host[2 + n_draft:]
    return _Verdict(int(host[0]), int(host[1]), [int(t) for t in host[2:2 + n_draft]], confidences,
                    confidences if draft.token_probs is not None else [], draft.threshold)


def _no_draft(tokens: torch.Tensor) -> Draft:
    """An empty draft: a cycle whose N is 0 verifies only the last token (a plain step)."""
    return Draft(tokens=tokens.new_empty(0), probs=None, confidence=torch.empty(0, device=tokens.device))


def _cycle_stats(drafter: Drafter | None, verdict: _Verdict, emitted: int) -> CycleStats:
    """The cycle's record; ``drafter.forwards`` counts the draft forwards of its last proposal (none
    when the cycle did not call the drafter)."""
    n_draft = len(verdict.drafted)
    return CycleStats(
        drafted=n_draft,
        accepted=verdict.accepted,
        emitted=emitted,
        confidences=tuple(verdict.confidences),
        outcomes=tuple(i < verdict.accepted for i in range(n_draft)),
        draft_forwards=getattr(drafter, "forwards", 0) if drafter is not None else 0,
        target_positions=n_draft + 1,
        token_probs=tuple(verdict.token_probs),
        threshold=verdict.threshold,
        target_probs=tuple(verdict.target_probs),
    )


def _check_prompt(prompt_ids: torch.Tensor) -> None:
    if prompt_ids.ndim != 1 or prompt_ids.shape[0] == 0:
        raise ValueError(f"prompt must be a non-empty 1-D tensor of token ids, got shape {tuple(prompt_ids.shape)}")
