"""Decode loops: target-only autoregressive (the baseline) and speculative decoding (batch size 1).

Both loops own the target's KV cache (preallocated, rolled back by moving its length) and a
preallocated token buffer, so a step does constant Python work however long the sequence gets.
Invariant of the speculative loop: the target cache holds every token except the last emitted one;
a cycle feeds ``[last, d_1 .. d_L]`` to the target and reads L + 1 next-token distributions.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from specdec_tune.engine.decode_config import DecodeConfig
from specdec_tune.engine.draft_budget import DraftBudget, choose_budget
from specdec_tune.engine.drafters import probs_from_logits
from specdec_tune.engine.features import PlainForward, choose_target_forward
from specdec_tune.engine.kvcache import PreallocatedCache, forward_with_cache, make_cache
from specdec_tune.engine.types import CycleStats, Draft, Drafter, GenerationResult
from specdec_tune.engine.verifiers import Verdict, Verifier, choose_verifier

__all__ = ["DecodeConfig", "autoregressive", "speculative"]


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
    cache = make_cache(model, prompt_ids.shape[0] + config.plain_room)
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
    cache: PreallocatedCache | None = None,
    *,
    verifier: Verifier | None = None,
    budget: DraftBudget | None = None,
) -> GenerationResult:
    """Speculative decoding: draft up to N tokens, verify them in one target forward, accept a prefix.

    How a draft is judged, how long each may be and which target forward runs are objects chosen here,
    before the loop (``engine.verifiers``, ``engine.draft_budget``, ``engine.features``), so the loop never
    branches on the kind of decode. A new drafter is a new ``drafter`` object, not a new parameter. One
    that needs the target's hidden states (an EAGLE-3 head, ``engine.eagle_draft``) carries a feature
    store, and the forward chosen for it also writes the fed positions' hidden states there for the
    drafter's next ``propose`` (``engine.features.choose_target_forward``).

    Args:
        model: the target causal LM.
        drafter: a fresh drafter for this sequence (draft model, n-gram lookup, staged drafter, ...).
        prompt_ids: ``[T]`` prompt ids on the model's device.
        config: the decode's settings and its speculative configuration (``config.spec``: N, schedule,
            acceptance; θ is applied by the drafter).
        generator: random source for sampling mode.
        on_cycle: called after every cycle with its statistics (the profiler's hook for timing).
        cache: a target cache to reuse (reset here); one is allocated when absent or too small.
        verifier: replaces the configuration's verifier (:func:`engine.verifiers.choose_verifier`); tests
            plant wrong rules with it to show the exactness test has power, the profiler records each
            verified position's p and q.
        budget: replaces the configuration's schedule (:func:`engine.draft_budget.choose_budget`), e.g. a
            server's N per cycle as its load changes.
    """
    _check_prompt(prompt_ids)
    verifier = verifier or choose_verifier(config, prompt_ids)
    budget = budget or choose_budget(config.spec)
    forward = choose_target_forward(model, drafter)
    return _loop(forward, drafter, prompt_ids, config, verifier, budget, generator, on_cycle, cache)


def _loop(forward: PlainForward, drafter: Drafter, prompt_ids: torch.Tensor, config: DecodeConfig,
          verifier: Verifier, budget: DraftBudget, generator: torch.Generator | None,
          on_cycle: Callable[[CycleStats], None] | None, cache: PreallocatedCache | None) -> GenerationResult:
    """The speculative loop, with its strategies chosen (:func:`speculative`)."""
    limit, eos = config.max_new_tokens, config.eos_token_id
    cache, tokens = _prefill(forward, prompt_ids, config.room, cache)  # tokens: prompt + emitted
    length = prompt_ids.shape[0]
    out: list[int] = []
    cycles: list[CycleStats] = []
    eos_hit = False
    # Invariant: the target cache holds tokens[:length - 1]; the last emitted token is fed next.
    while not eos_hit and len(out) < limit:
        most = min(budget.limit(len(cycles)), limit - len(out))  # never draft past the limit
        draft = drafter.propose(tokens[:length], most) if most > 0 else _no_draft(tokens)
        n_draft = draft.length
        if n_draft:
            tokens[length:length + n_draft] = draft.tokens
        logits = forward(tokens[length - 1:length + n_draft], cache, n_draft + 1)  # [L + 1, vocab]
        verdict = verifier(draft, logits, generator)
        acc, nxt = verdict.accepted, verdict.next_token
        emitted, eos_hit = _emit(out, verdict.drafted[:acc] + [nxt], limit, eos)
        if emitted > acc:  # the accepted draft tokens are already in the buffer
            tokens[length + acc] = nxt
        cache.truncate(length + acc)  # the context plus the accepted tokens (rejected positions rolled back)
        length += emitted
        stats = _cycle_stats(drafter if most > 0 else None, verdict, emitted)
        if most > 0:
            drafter.observe(acc)
        budget.observe(n_draft, acc)
        cycles.append(stats)
        if on_cycle is not None:
            on_cycle(stats)
    finish(drafter, tokens[:length])
    return GenerationResult(prompt_tokens=prompt_ids.shape[0], token_ids=out, cycles=cycles, finished_by_eos=eos_hit)


def finish(drafter: object, sequence: torch.Tensor) -> None:
    """Show the finished sequence to a drafter that learns across requests (suffix decoding's global tree
    keeps the whole response); other drafters have no ``finish``."""
    done = getattr(drafter, "finish", None)
    if done is not None:
        done(sequence)


def _prefill(forward: PlainForward, prompt_ids: torch.Tensor, room: int,
             cache: PreallocatedCache | None) -> tuple[PreallocatedCache, torch.Tensor]:
    """A reset target cache holding all but the last prompt token, and a token buffer holding the prompt
    with ``room`` positions after it.

    The last prompt token is fed by the first cycle, so every generated token (the first included)
    goes through draft -> verify.
    """
    total = prompt_ids.shape[0] + room
    if cache is None or cache.max_len < total:
        cache = make_cache(forward.model, total)
    cache.truncate(0)
    tokens = torch.empty(total, dtype=torch.long, device=prompt_ids.device)  # [total]
    tokens[:prompt_ids.shape[0]] = prompt_ids
    if prompt_ids.shape[0] > 1:
        forward(prompt_ids[:-1], cache, 1)
    return cache, tokens


def _no_draft(tokens: torch.Tensor) -> Draft:
    """An empty draft: a cycle whose N is 0 verifies only the last token (a plain step)."""
    return Draft(tokens=tokens.new_empty(0), probs=None, confidence=torch.empty(0, device=tokens.device))


def _cycle_stats(drafter: Drafter | None, verdict: Verdict, emitted: int) -> CycleStats:
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
