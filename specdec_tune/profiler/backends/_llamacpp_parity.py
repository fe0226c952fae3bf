"""Our engine run the way llama-server schedules speculative decoding, to compare acceptance exactly.

Greedy outputs of llama-server and of our engine are the same token ids (f32 GGUF files converted
from the same weights), but llama-server's counters count other cycles than our ``speculative()``
loop, for three reasons read in llama.cpp 0c1e57098 (vendored by llama-cpp-python 0.3.36):

1. The first output token comes from the prefill, undrafted (``tools/server/server-context.cpp``:
   drafts are made for slots already *generating*), while our loop drafts the first token too.
2. It drafts at most ``n_remaining - 1`` tokens (``server_slot::get_n_draft_max``: the remaining
   budget minus one, so that accepted tokens plus the target's own token never pass
   ``n_predict``), where our loop drafts up to the remaining budget and cuts the output after.
   With one token left it decodes without a draft, and such a step is not counted.
3. ``draft-simple``'s ``p_min`` (``--spec-draft-p-min``, ``common/speculative.cpp``) compares the
   probability of the draft's top token *after a top-k 10 sampler*: the draft sampler is
   ``top_k(10)`` then ``dist``, so the probability is renormalized over the ten most likely
   tokens, never below the full-vocabulary probability our engine's rule ``before`` reads. At the
   same θ llama.cpp therefore stops drafting later (or at the same place) than our engine.
   :class:`LlamacppDrafter` applies its rule. With θ = 0 (the default) the rules coincide.

Counters (``/metrics``, see ``profiler/backends/_llamacpp_server.py``) are vLLM's: a *draft* is a verify step
with at least one draft token; ``accepted_per_pos[i]`` counts drafts whose first i + 1 tokens were
accepted. :func:`engine_like_llamacpp` reproduces 1-3 with our own loop and returns counters in
those terms.

Precision. Both sides compute in float32 from the same weights, but in a different order (ggml's
CPU kernels vs torch's), so a logit can differ in its last bits. Where a model's two best logits are
that close, the argmax, hence a draft token or an output token, can differ; on the bundled pair it
happens at a draft position now and then (docs/results.md, llama.cpp against the engine). Such a request is not comparable exactly; :attr:`LlamacppDrafter.gaps` and
:func:`top2_gap` show the tie (:data:`TIE_GAP`), and a comparison excuses a request only with it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_tune.engine import CycleStats, DecodeConfig, Draft, autoregressive, build_drafter, forward_with_cache
from specdec_tune.engine import make_cache, speculative
from specdec_tune.profiler.backends._vllm import SpecCounters, counters_from_steps

DRAFT_TOP_K = 10  # common/speculative.cpp: the draft-simple sampler's top_k
TIE_GAP = 1e-4  # two logits closer than this (about 100 float32 ulps at |logit| ~ 10) may swap order
TIE_P = 1e-5  # a probability this close to p_min may fall on either side of it


class LlamacppDrafter:
    """A greedy draft model with draft-simple's stop rule: stop before the first token whose
    probability, renormalized over the draft's top :data:`DRAFT_TOP_K` logits, is below ``p_min``.

    It drafts with the engine's own :class:`ModelDrafter` (θ = 0) and reads the logits that drafter
    computed (its per-position forward is wrapped to keep them), so tokens and numbers are the
    engine's; only the confidence and the stop rule are llama.cpp's.
    """

    def __init__(self, draft_model: torch.nn.Module, max_len: int, p_min: float, top_k: int = DRAFT_TOP_K) -> None:
        if not 0.0 <= p_min < 1.0:
            raise ValueError(f"p_min must be in [0, 1), got {p_min}")
        self.inner = build_drafter(draft_model, max_len=max_len)
        self.p_min, self.top_k = p_min, top_k
        self._rows: list[torch.Tensor] = []
        self.gaps: list[float] = []  # per drafted position: best minus second-best draft logit
        self.p_margins: list[float] = []  # per position compared with p_min: |p - p_min|
        forward = self.inner._forward  # the drafter's one forward per drafted position
        self.inner._forward = lambda ids: self._keep(forward(ids))

    def _keep(self, logits: torch.Tensor) -> torch.Tensor:
        self._rows.append(logits)
        return logits

    @property
    def forwards(self) -> int:
        return self.inner.forwards

    def confidence(self, logits: torch.Tensor) -> torch.Tensor:
        """``[L, vocab]`` logits -> ``[L]`` top probability over the top-k logits (llama.cpp's p)."""
        top = logits.float().topk(min(self.top_k, logits.shape[-1]), dim=-1).values
        return torch.exp(top[:, 0] - torch.logsumexp(top, dim=-1))

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        self._rows = []
        draft = self.inner.propose(context, max_tokens)
        if draft.tokens.numel() == 0:
            return draft
        rows = torch.stack(self._rows[:draft.tokens.numel()]).float()
        top2 = rows.topk(2, dim=-1).values
        if self.p_min <= 0:
            self.gaps += (top2[:, 0] - top2[:, 1]).tolist()
            return draft
        conf = self.confidence(rows)
        low = (conf < self.p_min).nonzero()
        keep = int(low[0, 0]) if low.numel() else draft.tokens.numel()
        self.p_margins += (conf[:keep + 1] - self.p_min).abs().tolist()
        self.gaps += (top2[:keep, 0] - top2[:keep, 1]).tolist()
        return Draft(tokens=draft.tokens[:keep], probs=None, confidence=conf[:keep],
                     stopped_by_threshold=keep < draft.tokens.numel())

    def observe(self, num_accepted: int) -> None:
        """Roll the inner drafter's cache back to the accepted prefix (it may hold cut tokens too)."""
        self.inner.observe(num_accepted)


@dataclass
class ParityRun:
    """Our engine's output and cycles for one prompt, scheduled as llama-server does."""

    token_ids: list[int]  # the prefill token + the cycles' tokens, n_predict of them
    cycles: list[CycleStats]

    def counters(self, positions: int) -> SpecCounters:
        return counters_from_steps([c.accepted for c in self.cycles], [c.drafted for c in self.cycles], positions)


def engine_like_llamacpp(target: torch.nn.Module, drafter, prompt_ids: torch.Tensor, n_predict: int,
                         n_max: int) -> ParityRun:
    """Greedy speculative decoding with our loop, cycles aligned with llama-server's verify steps.

    Args:
        target: the target model (our engine's forward).
        drafter: a fresh drafter (:class:`LlamacppDrafter`, or the engine's own for comparison).
        prompt_ids: ``[T]`` prompt ids.
        n_predict: llama-server's ``n_predict`` (EOS ignored).
        n_max: ``--spec-draft-n-max``.
    """
    cfg = DecodeConfig(max_new_tokens=1, eos_token_id=None)
    first = autoregressive(target, prompt_ids, cfg).token_ids
    if n_predict <= 2:  # at most one token after the prefill's: it is decoded without a draft (reason 2)
        rest = autoregressive(target, prompt_ids, DecodeConfig(max_new_tokens=n_predict, eos_token_id=None))
        return ParityRun(rest.token_ids, [])
    context = torch.cat([prompt_ids, torch.tensor(first, dtype=prompt_ids.dtype, device=prompt_ids.device)])
    # Our loop drafts min(N, budget - produced); a budget of n_predict - 2 after the prefill token makes
    # that min(N, remaining - 1), llama-server's n_draft_max (reason 2). The loop stops with one token
    # left, which llama-server decodes without a draft (not a counted step).
    res = speculative(target, drafter, context, DecodeConfig(max_new_tokens=n_predict - 2, num_speculative_tokens=n_max,
                                                             eos_token_id=None))
    tail = autoregressive(target, prompt_ids, DecodeConfig(max_new_tokens=n_predict, eos_token_id=None)).token_ids
    out = list(first) + res.token_ids
    # Greedy tokens do not depend on the schedule: the loop's tokens must be plain decoding's prefix.
    assert out == tail[:len(out)], "speculative greedy output differs from plain greedy decoding"
    return ParityRun(tail, list(res.cycles))


def top2_gap(model: torch.nn.Module, ids: list[int]) -> float:
    """Best minus second-best next-token logit of ``model`` after ``ids`` (a full forward, float32)."""
    with torch.inference_mode():
        logits = forward_with_cache(model, torch.tensor([ids]), make_cache(model, len(ids) + 1),
                                    logits_to_keep=1).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


@dataclass(frozen=True)
class PromptParity:
    """llama-server against our engine (scheduled as llama-server does) on one prompt. Where they
    differ, ``gap`` is the smallest logit gap (best minus second best) that could explain it and
    ``p_margin`` the smallest distance of a draft probability from p_min (``None`` where not looked at)."""

    server: SpecCounters
    engine: SpecCounters
    same_output: bool
    gap: float | None = None
    p_margin: float | None = None

    @property
    def equal(self) -> bool:
        return self.same_output and self.server == self.engine

    @property
    def explained(self) -> bool:
        """Equal, or different only where float32 cannot decide (module docstring, Precision)."""
        return self.equal or (self.gap is not None and self.gap < TIE_GAP) or (
            self.p_margin is not None and self.p_margin < TIE_P)

    @property
    def verdict(self) -> str:
        if self.equal:
            return "equal"
        where = f"logit gap {self.gap:.1e}" + (f", p - p_min {self.p_margin:.1e}" if self.p_margin is not None else "")
        return f"float32 tie ({where})" if self.explained else f"DIFFERS (closest: {where}; no tie)"


def compare_prompt(target: torch.nn.Module, prompt_ids: list[int], server_tokens: list[int],
                   server: SpecCounters, run: ParityRun, drafter: LlamacppDrafter, n_max: int) -> PromptParity:
    """Compare one prompt; a difference is looked for a float32 tie: at the first differing output
    token (the target's two best logits there), else in the draft (its logit gaps, and its
    probabilities' distance from p_min)."""
    engine = run.counters(n_max)
    server = SpecCounters(server.drafts, server.draft_tokens, server.accepted, server.padded(n_max))
    same = server_tokens == run.token_ids
    if same and server == engine:
        return PromptParity(server, engine, True)
    if not same:
        k = next(i for i, (a, b) in enumerate(zip(server_tokens, run.token_ids)) if a != b)
        return PromptParity(server, engine, False, gap=top2_gap(target, list(prompt_ids) + run.token_ids[:k]))
    return PromptParity(server, engine, True, gap=min(drafter.gaps, default=float("inf")),
                        p_margin=min(drafter.p_margins) if drafter.p_margins else None)
