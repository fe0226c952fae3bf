"""Drafters: a small draft model, and n-gram prompt lookup. Both satisfy ``types.Drafter``; :func:`build_drafter`
also makes the suffix drafter (``engine.suffix_drafter``).

Draft-model cache bookkeeping: the drafter's KV cache holds a prefix of the context. Each
``propose`` feeds only the context tokens the cache has not seen (normally the bonus/recovered token,
plus the last draft token when every draft token was accepted), then one token per drafted position.
``observe`` rolls the cache back to the accepted prefix, so no token is ever recomputed.
"""
from __future__ import annotations

from typing import Any

import torch

from specdec_tune.core.schedules import stops_before
from specdec_tune.core.speculative import SpeculativeConfig, with_fields
from specdec_tune.core.suffix_cache import SuffixCache
from specdec_tune.engine.kvcache import forward_with_cache, make_cache
from specdec_tune.engine.suffix_drafter import SuffixDrafter, cache_for
from specdec_tune.engine.types import Draft


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax at ``temperature`` (> 0), in float32 at least for a stable sampling distribution."""
    return torch.softmax(logits.float() / temperature, dim=-1) if logits.dtype != torch.float64 else torch.softmax(logits / temperature, dim=-1)


class ModelDrafter:
    """Drafts with a causal LM that shares the target's vocabulary.

    Threshold θ, rule ``"before"`` (default; exact in sampling mode): before drafting a position the
    draft distribution there is computed, and drafting stops when :func:`~specdec_tune.core.schedules.stops_before`
    holds: the *top* probability (kinds ``per-token`` and ``adaptive``), or the drafted prefix's
    probability times it (kind ``cumulative``), is below θ; otherwise the token is sampled (argmax
    when greedy). The stop decision never depends on the token that would be drawn, so speculative
    sampling stays exact. Kind ``adaptive`` moves θ between cycles in :meth:`observe`
    (:class:`~specdec_tune.core.schedules.AdaptiveThreshold`: up after a rejection, down after a fully
    accepted draft). Rule ``"hf"`` (transformers 5.23 ``ConfidenceCriteria``,
    ``generation/stopping_criteria.py``: ``p = probs[0, input_ids[0, -1]]``, stop when
    ``p < assistant_confidence_threshold``; per-token only): the token is drawn and proposed, and
    drafting stops after it when *its own* probability is below θ. In greedy mode both rules read the
    same number (the argmax token's probability is the top probability).

    The recorded confidence of each proposed token is the number the rule compares with θ at its
    position: the top probability (rule before), the proposed token's probability (rule hf).
    """

    def __init__(self, model: torch.nn.Module, max_len: int, spec: SpeculativeConfig | None = None, *,
                 temperature: float = 0.0, generator: torch.Generator | None = None, **speculative: Any) -> None:
        """``spec`` (or its θ fields by name: ``threshold``, ``threshold_rule``, ``threshold_kind``,
        ``threshold_step``) sets the stop rule; ``max_len`` is the longest context the cache holds."""
        spec = with_fields(spec, speculative, "ModelDrafter")
        self.model = model
        self.cache = make_cache(model, max_len)
        self.temperature = temperature
        self.threshold = spec.threshold
        self.threshold_rule = spec.threshold_rule
        self.threshold_kind = spec.threshold_kind
        self.adaptive = spec.adaptive
        self._levels = self.adaptive.levels() if self.adaptive else ()
        self._level = self.adaptive.start_index if self.adaptive else 0
        self.generator = generator
        self._base_len = 0  # context length at the last propose
        self._proposed = 0  # tokens proposed by the last propose (the adaptive kind's verdict)
        self.forwards = 0  # draft forwards run by the last propose

    @property
    def current_threshold(self) -> float:
        """θ the next proposal runs with (the adaptive kind's current level, else the θ given)."""
        return self._levels[self._level] if self.adaptive else self.threshold

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = forward_with_cache(self.model, ids[None], self.cache, logits_to_keep=1)
        return out.logits[0, -1]  # [vocab]

    def _first(self, context: torch.Tensor) -> torch.Tensor:
        """The first drafted position's logits: one forward over what the cache has not seen."""
        return self._forward(context[self.cache.get_seq_length():])

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        """Draft up to ``max_tokens`` tokens after ``context`` (``[T]``)."""
        self._base_len = context.shape[0]
        logits = self._first(context)
        self.forwards = 1
        theta = self.current_threshold
        tokens, rows, confs, stopped = self._draft(logits, max_tokens, theta)
        self._proposed = len(tokens)
        return self._draft_record(context.device, tokens, rows, confs, stopped, theta)

    def _draft(self, logits: torch.Tensor, max_tokens: int,
               theta: float) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], bool]:
        """The drafting loop: (tokens, rows: greedy logits / sampling q, confidences, stopped by θ)."""
        tokens: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []  # greedy: logits rows; sampling: q rows
        confs: list[torch.Tensor] = []
        sampling, check, hf = self.temperature > 0, theta > 0, self.threshold_rule == "hf"
        kind = self.threshold_kind
        prefix = 1.0  # Π q(x_j) of this cycle's drafted tokens (the cumulative kind's prefix probability)
        stopped = False
        for i in range(max_tokens):
            if sampling:
                q = probs_from_logits(logits, self.temperature)
                if check and not hf:
                    conf = q.max()
                    if stops_before(kind, theta, prefix, float(conf)):  # decided before sampling: exact
                        stopped = True
                        break
                tok = torch.multinomial(q, 1, generator=self.generator)[0]
                if check and hf:
                    conf = q[tok]
                if check and kind == "cumulative":
                    prefix *= float(q[tok])
                rows.append(q)
            else:
                tok = logits.argmax()
                rows.append(logits)
                if check:  # without a threshold the confidences are computed once, batched, after the loop
                    conf = torch.exp(logits[tok] - torch.logsumexp(logits, dim=-1))
                    if not hf and stops_before(kind, theta, prefix, float(conf)):  # a host sync per token is inherent to θ
                        rows.pop()
                        stopped = True
                        break
                    if kind == "cumulative":
                        prefix *= float(conf)
            if check:
                confs.append(conf)
            tokens.append(tok)
            if check and hf and float(conf) < theta:  # HF: proposed, then stop
                stopped = i + 1 < max_tokens
                break
            if i + 1 < max_tokens:
                logits = self._forward(tok[None])
                self.forwards += 1
        return tokens, rows, confs, stopped

    def _draft_record(self, device: torch.device, tokens: list[torch.Tensor], rows: list[torch.Tensor],
                      confs: list[torch.Tensor], stopped: bool, theta: float) -> Draft:
        """The :class:`Draft` of one proposal (confidences computed batched when no θ read them)."""
        sampling, hf = self.temperature > 0, self.threshold_rule == "hf"
        if not tokens:
            empty = torch.empty(0, dtype=torch.long, device=device)
            return Draft(tokens=empty, probs=None, confidence=torch.empty(0, device=device), stopped_by_threshold=stopped,
                         token_probs=torch.empty(0, device=device), threshold=theta)
        ids = torch.stack(tokens)  # [L]
        table = torch.stack(rows)  # [L, vocab]
        if confs:
            confidence = torch.stack(confs)
        elif sampling:
            # Rule before's confidence is the top probability; rule hf's, the proposed token's.
            confidence = table.gather(1, ids[:, None])[:, 0] if hf else table.max(dim=-1).values
        else:
            confidence = torch.exp(table.max(dim=-1).values - torch.logsumexp(table, dim=-1))
        token_probs = table.gather(1, ids[:, None])[:, 0].float() if sampling else confidence.float()  # [L]
        return Draft(tokens=ids, probs=table if sampling else None, confidence=confidence.float(),
                     stopped_by_threshold=stopped, token_probs=token_probs, threshold=theta)

    def observe(self, num_accepted: int) -> None:
        """Roll the cache back to the context plus the accepted draft tokens; move the adaptive θ."""
        keep = min(self.cache.get_seq_length(), self._base_len + num_accepted)
        self.cache.truncate(keep)
        if self.adaptive is not None:
            self._level = self.adaptive.next_index(self._level, self._proposed, num_accepted)


class NgramDrafter:
    """Prompt lookup: propose the tokens that followed the most recent earlier occurrence of the
    context's last n tokens (n from ``ngram_max`` down to ``ngram_min``). No model, no cost.

    The index (n-gram -> position of its latest continuation) is extended incrementally with the new
    context tokens, so a proposal costs O(ngram_max + max_tokens), not O(context length).
    """

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.forwards = 0
        self._ids: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}

    def _extend(self, new_ids: list[int]) -> None:
        for tok in new_ids:
            j = len(self._ids)  # position of tok: it continues every n-gram ending at j - 1
            for n in range(self.ngram_min, min(self.ngram_max, j) + 1):
                self._index[tuple(self._ids[j - n:j])] = j
            self._ids.append(tok)

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        if context.shape[0] < len(self._ids):  # a new sequence: start over
            self._ids, self._index = [], {}
        found = self._found(context[len(self._ids):].tolist(), max_tokens)
        tokens = torch.tensor(found, dtype=torch.long, device=context.device)
        return Draft(tokens=tokens, probs=None, confidence=torch.ones(len(found), device=context.device))

    def lookup(self, context: list[int], max_tokens: int) -> list[int]:
        """:meth:`propose` on a host list of the context's ids, returning the proposed ids (the batched
        engine keeps each sequence's tokens on the host)."""
        if len(context) < len(self._ids):
            self._ids, self._index = [], {}
        return self._found(context[len(self._ids):], max_tokens)

    def _found(self, new_ids: list[int], max_tokens: int) -> list[int]:
        """The context extended by ``new_ids``; the continuation of its longest matched suffix."""
        self._extend(new_ids)
        ids, total = self._ids, len(self._ids)
        for n in range(min(self.ngram_max, total), self.ngram_min - 1, -1):
            start = self._index.get(tuple(ids[total - n:]))
            if start is not None:
                return ids[start:start + max_tokens]
        return []

    def observe(self, num_accepted: int) -> None:
        """Prompt lookup keeps no per-cycle state (the index follows the context)."""


def build_drafter(
    draft_model: torch.nn.Module | None,
    spec: SpeculativeConfig | None = None,
    *,
    max_len: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    suffix_cache: SuffixCache | None = None,
    **speculative: Any,
) -> ModelDrafter | NgramDrafter | SuffixDrafter:
    """A fresh drafter for one sequence: a draft model's (θ from ``spec``), an EAGLE-3 head's
    (``engine.eagle_draft``), or when ``draft_model`` is None suffix decoding (``spec.drafter == "suffix"``:
    bound to ``suffix_cache``, the serving history shared with the other requests; a fresh one when None) or
    else n-gram lookup (``spec``'s n-gram sizes). ``spec``'s fields may be given by name instead."""
    from specdec_tune.engine.eagle import EagleHead

    spec = with_fields(spec, speculative, "build_drafter")
    if draft_model is None and spec.is_suffix:
        return SuffixDrafter(suffix_cache if suffix_cache is not None else cache_for(spec), spec)
    if draft_model is None:
        return NgramDrafter(ngram_max=spec.ngram_max, ngram_min=spec.ngram_min)
    kind = ModelDrafter
    if isinstance(draft_model, EagleHead):
        from specdec_tune.engine.eagle_draft import EagleDrafter as kind
    return kind(draft_model, max_len, spec, temperature=temperature, generator=generator)
