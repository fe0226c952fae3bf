"""Drafters for a batch of sequences: a draft model stepping every row in one forward, and n-gram lookup per row.

Each row drafts what the B = 1 drafter (``engine.drafters``) drafts for its own sequence: the same stop
rule per row (θ of every kind and rule, ``core.schedules.stops_before``, decided from the draft's
distribution before a token is drawn, so sampling stays exact), its own budget, its own adaptive θ. What
differs is the cost: a draft step is one forward over every row still drafting (``engine.ragged``), rows
that stopped ride along as padding, so a batch cycle runs as many draft forwards as its longest-drafting
row needs (the model's ``max over rows``, docs/model.md). With θ the stop decisions are read to the host
once per step for the whole batch; without θ a proposal never synchronises.

Draft-cache bookkeeping per row is the B = 1 drafter's: ``propose`` first feeds the context tokens the row's
cache has not seen (one or two after a cycle, the whole prompt at the first), then one token per drafted
position but the last; ``observe`` rolls each row back to its context plus its accepted tokens.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specdec_tune.core.schedules import stops_before
from specdec_tune.core.speculative import SpeculativeConfig, with_fields
from specdec_tune.engine.drafters import NgramDrafter, probs_from_logits
from specdec_tune.engine.ragged import check_batchable, forward_ragged, make_ragged_cache
from specdec_tune.engine.types import Draft


@dataclass(frozen=True)
class BatchDraft:
    """One cycle's proposals for every row of the batch (row r's are its first ``lengths[r]`` columns).

    Attributes:
        tokens: ``[B, S]`` proposed ids, padded past each row's length.
        lengths: L per row.
        probs: ``[B, S, vocab]`` draft distributions q (sampling with a model draft), else ``None``.
        confidence: ``[B, S]`` the number θ is compared with at each position (``Draft.confidence``).
        token_probs: ``[B, S]`` each proposed token's own draft probability; ``None`` for n-gram.
        stopped: per row, θ ended its drafting before its budget.
        thresholds: per row, the θ its proposal ran with.
        forwards: per row, the draft forwards its own proposal needed (what B = 1 would have run).
    """

    tokens: torch.Tensor
    lengths: list[int]
    probs: torch.Tensor | None
    confidence: torch.Tensor
    token_probs: torch.Tensor | None
    stopped: list[bool]
    thresholds: list[float]
    forwards: list[int]

    @property
    def width(self) -> int:
        """The longest proposal (the verify forward's width is this + 1)."""
        return max(self.lengths, default=0)

    def row(self, r: int) -> Draft:
        """Row ``r``'s proposal as the B = 1 loop's :class:`Draft` (what its verifiers read)."""
        n = self.lengths[r]
        return Draft(tokens=self.tokens[r, :n], probs=None if self.probs is None else self.probs[r, :n],
                     confidence=self.confidence[r, :n], stopped_by_threshold=self.stopped[r],
                     token_probs=None if self.token_probs is None else self.token_probs[r, :n],
                     threshold=self.thresholds[r])


def empty_draft(rows: int, device: torch.device, thresholds: Sequence[float] | None = None,
                token_probs: bool = True) -> BatchDraft:
    """No proposal for any row (a plain step)."""
    none = torch.empty(rows, 0, device=device)
    return BatchDraft(none.long(), [0] * rows, None, none, none if token_probs else None, [False] * rows,
                      list(thresholds or [0.0] * rows), [0] * rows)


def padded(rows: Sequence[Sequence[int]], device: torch.device, width: int | None = None) -> torch.Tensor:
    """``[B, width]`` ids, each row's own first and zeros after (the padding token is never seen)."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = [list(r) + [0] * (width - len(r)) for r in rows]
    return torch.tensor(out, dtype=torch.long, device=device).reshape(len(rows), width)


class BatchModelDrafter:
    """A draft model drafting for B rows at once (module docstring)."""

    def __init__(self, model: torch.nn.Module, rows: int, max_len: int, spec: SpeculativeConfig | None = None, *,
                 temperature: float = 0.0, generator: torch.Generator | None = None, **speculative: Any) -> None:
        spec = with_fields(spec, speculative, "BatchModelDrafter")
        check_batchable(model)
        self.model = model
        self.cache = make_ragged_cache(model, rows, max_len)
        self.temperature = temperature
        self.generator = generator
        self.threshold, self.threshold_rule, self.threshold_kind = spec.threshold, spec.threshold_rule, spec.threshold_kind
        self.adaptive = spec.adaptive
        self._levels = self.adaptive.levels() if self.adaptive else ()
        self._level = [self.adaptive.start_index if self.adaptive else 0] * rows
        self._base = [0] * rows  # context length per row at the last propose
        self._proposed = [0] * rows
        self.forwards = 0  # batched draft forwards of the last proposal
        self.device = next(model.parameters()).device if any(True for _ in model.parameters()) else torch.device("cpu")

    @property
    def current_thresholds(self) -> list[float]:
        return [self._levels[i] for i in self._level] if self.adaptive else [self.threshold] * self.cache.rows

    def propose(self, contexts: Sequence[Sequence[int]], budgets: Sequence[int]) -> BatchDraft:
        """Up to ``budgets[r]`` tokens after each row's context (host lists of ids)."""
        self._base = [len(c) for c in contexts]
        feeds = [c[n:] for c, n in zip(contexts, self.cache.lengths)]
        logits = forward_ragged(self.model, padded(feeds, self.device), self.cache, [len(f) for f in feeds],
                                last=True)  # [B, vocab]
        self.forwards = 1
        thetas = self.current_thresholds
        draft = self._record(*self._draft(logits, list(budgets), thetas), thetas)
        self._proposed = list(draft.lengths)
        return draft

    def _draft(self, logits: torch.Tensor, budgets: list[int], thetas: list[float]) -> tuple:
        """The drafting steps: (per-step tokens, rows, confidences; lengths, stopped, forwards per row)."""
        rows = len(budgets)
        sampling, check, hf = self.temperature > 0, any(t > 0 for t in thetas), self.threshold_rule == "hf"
        live, lengths, stopped = [b > 0 for b in budgets], [0] * rows, [False] * rows
        fed, prefix = [int(b > 0) for b in budgets], [1.0] * rows
        toks: list[torch.Tensor] = []
        tables: list[torch.Tensor] = []
        confs: list[torch.Tensor | None] = []
        for _ in range(max(budgets, default=0)):
            q = probs_from_logits(logits, self.temperature) if sampling else None
            conf = None
            if check and not hf:  # decided before the token is drawn (exact when sampling)
                conf = q.max(-1).values if sampling else torch.exp(logits.max(-1).values - torch.logsumexp(logits, -1))
                top = conf.tolist()
                for r in range(rows):
                    if live[r] and stops_before(self.threshold_kind, thetas[r], prefix[r], top[r]):
                        live[r], stopped[r] = False, True
            if not any(live):
                break
            tok = torch.multinomial(q, 1, generator=self.generator)[:, 0] if sampling else logits.argmax(-1)
            own_h = None
            if check and (hf or self.threshold_kind == "cumulative"):  # the drawn token's own q
                own = q.gather(1, tok[:, None])[:, 0] if sampling else \
                    torch.exp(logits.gather(1, tok[:, None])[:, 0] - torch.logsumexp(logits, -1))
                conf = own if hf else conf
                own_h = own.tolist()
            toks.append(tok)
            tables.append(q if sampling else logits)
            confs.append(conf)
            self._step(live, lengths, stopped, (budgets, thetas, prefix), own_h, hf)
            cont = [live[r] and lengths[r] < budgets[r] for r in range(rows)]
            if any(cont):
                logits = forward_ragged(self.model, tok[:, None], self.cache, [int(c) for c in cont], last=False)[:, 0]
                self.forwards += 1
                fed = [f + int(c) for f, c in zip(fed, cont)]
            live = cont
        return toks, tables, confs, lengths, stopped, fed

    @staticmethod
    def _step(live: list[bool], lengths: list[int], stopped: list[bool], state: tuple, own: list[float] | None,
              hf: bool) -> None:
        """Every live row proposed this step's token (its own q in ``own`` where θ reads it): the cumulative
        kind multiplies it into the row's prefix, rule hf stops a row whose token was below θ."""
        budgets, thetas, prefix = state
        for r, alive in enumerate(live):
            if not alive:
                continue
            lengths[r] += 1
            if own is None:
                continue
            if hf and own[r] < thetas[r]:  # HF's rule: proposed, then stop
                live[r] = False
                stopped[r] = lengths[r] < budgets[r]
            elif not hf:
                prefix[r] *= own[r]

    def _record(self, toks, tables, confs, lengths, stopped, fed, thetas) -> BatchDraft:
        """The :class:`BatchDraft` of one proposal (confidences computed batched where no θ read them)."""
        rows = len(lengths)
        if not toks:
            draft = empty_draft(rows, self.device, thetas)
            return BatchDraft(draft.tokens, lengths, None, draft.confidence, draft.token_probs, stopped, thetas, fed)
        sampling, hf = self.temperature > 0, self.threshold_rule == "hf"
        ids = torch.stack(toks, 1)  # [B, S]
        table = torch.stack(tables, 1)  # [B, S, vocab]
        own = table.gather(2, ids[..., None])[..., 0] if sampling else None
        if confs[0] is not None:
            confidence = torch.stack(confs, 1)
        elif sampling:
            confidence = own if hf else table.max(-1).values
        else:
            confidence = torch.exp(table.max(-1).values - torch.logsumexp(table, -1))
        token_probs = own.float() if sampling else confidence.float()
        return BatchDraft(ids, lengths, table if sampling else None, confidence.float(), token_probs, stopped,
                          thetas, fed)

    def observe(self, accepted: Sequence[int | None]) -> None:
        """Roll each row back to its context plus its accepted tokens; move each row's adaptive θ (``None``:
        the row did not draft this cycle)."""
        self.cache.set_lengths([min(n, b + (a or 0)) for n, b, a in zip(self.cache.lengths, self._base, accepted)])
        if self.adaptive is not None:
            self._level = [lv if a is None else self.adaptive.next_index(lv, p, a)
                           for lv, p, a in zip(self._level, self._proposed, accepted)]

    def keep_rows(self, keep: Sequence[int]) -> None:
        """Only rows ``keep`` (ascending) go on."""
        self.cache.keep_rows(keep)
        self._base, self._proposed, self._level = ([xs[r] for r in keep] for xs in (self._base, self._proposed,
                                                                                   self._level))


class BatchNgramDrafter:
    """Prompt lookup per row (``engine.drafters.NgramDrafter``; no model, no forward)."""

    def __init__(self, rows: int, ngram_max: int = 3, ngram_min: int = 1, device: torch.device | str = "cpu") -> None:
        self.rows = [NgramDrafter(ngram_max, ngram_min) for _ in range(rows)]
        self.device = torch.device(device)
        self.forwards = 0

    def propose(self, contexts: Sequence[Sequence[int]], budgets: Sequence[int]) -> BatchDraft:
        found = [d.lookup(c, b) if b > 0 else [] for d, c, b in zip(self.rows, contexts, budgets)]
        tokens = padded(found, self.device)
        n = len(found)
        return BatchDraft(tokens, [len(f) for f in found], None, torch.ones(tokens.shape, device=self.device), None,
                          [False] * n, [0.0] * n, [0] * n)

    def observe(self, accepted: Sequence[int | None]) -> None:
        """Lookup keeps no per-cycle state (each row's index follows its context)."""

    def keep_rows(self, keep: Sequence[int]) -> None:
        self.rows = [self.rows[r] for r in keep]


BatchDrafter = BatchModelDrafter | BatchNgramDrafter


def build_batch_drafter(draft_model: torch.nn.Module | None, rows: int, spec: SpeculativeConfig | None = None, *,
                        max_len: int, temperature: float = 0.0, generator: torch.Generator | None = None,
                        device: torch.device | str = "cpu", **speculative: Any) -> BatchDrafter:
    """A fresh batch drafter: the draft model's (θ from ``spec``), or n-gram lookup when ``draft_model`` is None."""
    spec = with_fields(spec, speculative, "build_batch_drafter")
    if draft_model is None:
        return BatchNgramDrafter(rows, spec.ngram_max, spec.ngram_min, device)
    return BatchModelDrafter(draft_model, rows, max_len, spec, temperature=temperature, generator=generator)
