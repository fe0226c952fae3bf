"""Our engine run the way vLLM schedules speculative decoding, to compare acceptance counts exactly.

Greedy outputs of vLLM and of our engine are the same token ids, but vLLM's per-position counters
count different cycles than our ``speculative()`` loop, for three reasons read in vLLM 0.32.0's source:

1. The first output token comes from the prefill step, undrafted: vLLM's first verify step starts
   after it (``v1/core/sched/scheduler.py``: drafts exist only for running requests), while our loop
   drafts the first token too. So the cycles are shifted by one token.
2. vLLM drafts ``num_speculative_tokens`` (or the schedule's K) whatever is left of ``max_tokens`` and
   counts every accepted draft token (``num_accepted = len(sampled) - 1`` before the output is cut at
   ``max_tokens``), where our loop drafts at most the tokens still allowed.
3. vLLM's n-gram proposer (``v1/spec_decode/ngram_proposer.py``) takes the longest suffix match of
   ``prompt_lookup_min..max`` tokens at its *earliest* occurrence; our ``NgramDrafter`` takes the
   most recent one. Same length rule, different continuation, so different drafts.
   :class:`VllmNgramDrafter` implements vLLM's rule for the comparison.

A verify step with no draft token (n-gram, no match) is not a draft for vLLM and not counted.
:func:`engine_like_vllm` reproduces 1-2 with our own loop and returns counters in vLLM's terms.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_tune.engine import CycleStats, DecodeConfig, Draft, autoregressive, build_drafter, speculative
from specdec_tune.profiler.backends._vllm import SpecCounters, counters_from_steps


class VllmNgramDrafter:
    """Prompt lookup with vLLM's rule: longest suffix n-gram (n in min..max) that occurred before,
    continued from its earliest occurrence; up to ``max_tokens`` tokens, never past the context end."""

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.forwards = 0

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        ids = context.tolist()
        found = vllm_ngram_proposal(ids, self.ngram_min, self.ngram_max, max_tokens)
        return Draft(tokens=torch.tensor(found, dtype=torch.long, device=context.device), probs=None,
                     confidence=torch.ones(len(found), device=context.device))

    def observe(self, num_accepted: int) -> None:
        """Stateless: the proposal depends on the context only."""


def vllm_ngram_proposal(ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM's ``_find_longest_matched_ngram_and_propose_tokens`` in plain Python (O(T * max_n)).

    Occurrences end at least one token before the context's end (vLLM's KMP scans the reversed
    tokens from index 1), may overlap the suffix, and the longest n (capped at ``max_n``) wins, then
    the earliest start.
    """
    total = len(ids)
    if total < min_n or k <= 0:
        return []
    best_n, best_start = 0, -1
    for start in range(total - 1):
        limit = min(max_n, total - 1 - start)  # the window [start, start + n) ends by total - 2
        n = 0
        for cand in range(limit, 0, -1):
            if ids[start:start + cand] == ids[total - cand:]:
                n = cand
                break
        if n > best_n:  # strictly longer: ties keep the earlier start
            best_n, best_start = n, start
    if best_n < min_n:
        return []
    begin = best_start + best_n
    return ids[begin:begin + min(k, total - begin)]


@dataclass
class ParityRun:
    """Our engine's output and cycles for one prompt, scheduled as vLLM does."""

    token_ids: list[int]  # first (prefill) token + the cycles' tokens, cut at max_tokens / EOS
    cycles: list[CycleStats]

    def counters(self, positions: int) -> SpecCounters:
        return counters_from_steps([c.accepted for c in self.cycles], [c.drafted for c in self.cycles], positions)


def engine_like_vllm(target: torch.nn.Module, drafter, prompt_ids: torch.Tensor, max_tokens: int,
                     num_speculative_tokens: int, eos_token_id: int | None = None) -> ParityRun:
    """Greedy speculative decoding with our loop, cycles aligned with vLLM's verify steps.

    Args:
        target: the target model (our engine's forward).
        drafter: a fresh drafter (``ModelDrafter``, ``EagleDrafter``, ``NgramDrafter`` or :class:`VllmNgramDrafter`).
        prompt_ids: ``[T]`` prompt ids.
        max_tokens: vLLM's ``max_tokens``.
        num_speculative_tokens: K at the batch size measured (the schedule's K for B = 1).
        eos_token_id: stop token (``None`` with ``ignore_eos``).
    """
    first = autoregressive(target, prompt_ids, DecodeConfig(max_new_tokens=1, eos_token_id=eos_token_id)).token_ids
    if max_tokens == 1 or first[0] == eos_token_id:
        return ParityRun(first, [])
    context = torch.cat([prompt_ids, torch.tensor(first, dtype=prompt_ids.dtype, device=prompt_ids.device)])
    # A budget N beyond max_tokens: no draft is cut short by the limit, as in vLLM (reason 2).
    budget = max_tokens - 1 + num_speculative_tokens + 1
    res = speculative(target, drafter, context, DecodeConfig(max_new_tokens=budget, num_speculative_tokens=num_speculative_tokens,
                                                             eos_token_id=eos_token_id))
    out, kept = list(first), []
    for c in res.cycles:
        if len(out) >= max_tokens:
            break
        kept.append(c)
        out.extend(res.token_ids[len(out) - 1:len(out) - 1 + c.emitted])
    return ParityRun(out[:max_tokens], kept)


class VllmSuffixDrafter:
    """Our suffix drafter fed as vLLM's ``SuffixDecodingProposer`` feeds arctic's cache, for
    :func:`engine_like_vllm`: the request starts on its prompt alone (the prefill token joins as its first
    response token), and it stops learning after the proposal that follows the step reaching ``max_tokens``
    (vLLM adds that last step's tokens, all of them, then the request leaves the batch); the cycles our loop
    runs past that point are cut from the comparison, and their tokens must not reach the global tree."""

    def __init__(self, cache, spec, prompt_len: int, max_tokens: int) -> None:
        from specdec_tune.engine import SuffixDrafter

        self.inner = SuffixDrafter(cache, spec, prompt_tokens=prompt_len)
        self.forwards = 0
        self._end = prompt_len + max_tokens
        self._frozen = False

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        if self._frozen:
            return Draft(tokens=context[:0], probs=None, confidence=torch.ones(0, device=context.device))
        draft = self.inner.propose(context, max_tokens)
        self._frozen = context.shape[0] >= self._end
        return draft

    def observe(self, num_accepted: int) -> None:
        """The trees follow the context."""

    def finish(self, context: torch.Tensor) -> None:
        self.inner.finish(context[:len(self.inner._ids)] if self._frozen else context)


def fresh_drafter(kind: str, draft_model: torch.nn.Module | None, max_len: int, ngram_min: int = 1, ngram_max: int = 3):
    """A new drafter for one prompt: ``"model"`` (our ModelDrafter; an EAGLE-3 head's chain drafter when
    ``draft_model`` is a head, ``engine.eagle_draft``), ``"ngram"`` (ours: latest occurrence) or
    ``"vllm-ngram"`` (vLLM's rule: earliest occurrence).

    An EAGLE-3 head needs no rule of its own: vLLM's proposer (``v1/spec_decode/llm_base_proposer.py``,
    ``draft_sample_method`` "greedy") drafts the head's argmax chain from the target's hidden states of the
    tokens just verified, which is our chain drafter; reasons 1 and 2 above hold for it as for a draft
    model (``tests/tuner/servers/test_eagle_vllm.py`` checks the counts are equal)."""
    if kind == "model":
        return build_drafter(draft_model, max_len=max_len)
    if kind == "ngram":
        return build_drafter(None, max_len=max_len, ngram_min=ngram_min, ngram_max=ngram_max)
    if kind == "vllm-ngram":
        return VllmNgramDrafter(ngram_max=ngram_max, ngram_min=ngram_min)
    raise ValueError(f"drafter kind must be model, ngram or vllm-ngram, got {kind!r}")


def cycles_from_vllm(outputs) -> list[CycleStats]:
    """vLLM's per-request step records as our cycle records (drafted steps only: vLLM records no step
    without draft tokens, and its first token comes from the prefill), so the engine's aggregations
    (``acceptance_per_position``, tau) read vLLM measurements the same way as ours."""
    cycles = []
    for out in outputs:
        for a, d in zip(out.steps_accepted or [], out.steps_drafted or []):
            cycles.append(CycleStats(drafted=d, accepted=a, emitted=a + 1, confidences=(1.0,) * d,
                                     outcomes=tuple(i < a for i in range(d)), target_positions=d + 1))
    return cycles
