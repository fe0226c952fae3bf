"""Drafters: a small draft model, and n-gram prompt lookup. Both satisfy ``types.Drafter``.

Draft-model cache bookkeeping: the drafter's KV cache holds a prefix of the context. Each
``propose`` feeds only the context tokens the cache has not seen (normally the bonus/recovered token,
plus the last draft token when every draft token was accepted), then one token per drafted position.
``observe`` rolls the cache back to the accepted prefix, so no token is ever recomputed.
"""
from __future__ import annotations

import torch

from specdec_tune.engine.kvcache import make_cache
from specdec_tune.engine.types import Draft


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax at ``temperature`` (> 0), in float32 at least for a stable sampling distribution."""
    return torch.softmax(logits.float() / temperature, dim=-1) if logits.dtype != torch.float64 else torch.softmax(logits / temperature, dim=-1)


class ModelDrafter:
    """Drafts with a causal LM that shares the target's vocabulary."""

    def __init__(
        self,
        model: torch.nn.Module,
        max_len: int,
        *,
        temperature: float = 0.0,
        threshold: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> None:
        self.model = model
        self.cache = make_cache(model, max_len)
        self.temperature = temperature
        self.threshold = threshold
        self.generator = generator
        self._base_len = 0  # context length at the last propose
        self.forwards = 0  # draft forwards run by the last propose

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids[None], past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]  # [vocab]

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        """Draft up to ``max_tokens`` tokens after ``context`` (``[T]``)."""
        self._base_len = context.shape[0]
        logits = self._forward(context[self.cache.get_seq_length():])
        self.forwards = 1
        tokens: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []  # greedy: logits rows; sampling: q rows
        confs: list[torch.Tensor] = []
        sampling = self.temperature > 0
        check = self.threshold > 0
        stopped = False
        for i in range(max_tokens):
            if sampling:
                q = probs_from_logits(logits, self.temperature)
                tok = torch.multinomial(q, 1, generator=self.generator)[0]
                rows.append(q)
                conf = q[tok]
            else:
                tok = logits.argmax()
                rows.append(logits)
                # Without a threshold the confidences are computed once, batched, after the loop.
                conf = torch.exp(logits[tok] - torch.logsumexp(logits, dim=-1)) if check else None
            if check:
                if float(conf) < self.threshold:  # a host sync per token is inherent to a threshold
                    rows.pop()
                    stopped = True
                    break
                confs.append(conf)
            tokens.append(tok)
            if i + 1 < max_tokens:
                logits = self._forward(tok[None])
                self.forwards += 1
        device = context.device
        if not tokens:
            empty = torch.empty(0, dtype=torch.long, device=device)
            return Draft(tokens=empty, probs=None, confidence=torch.empty(0, device=device), stopped_by_threshold=stopped)
        ids = torch.stack(tokens)  # [L]
        table = torch.stack(rows)  # [L, vocab]
        if check or sampling:
            confidence = torch.stack(confs) if check else table.gather(1, ids[:, None])[:, 0]
        else:
            confidence = torch.exp(table.max(dim=-1).values - torch.logsumexp(table, dim=-1))
        return Draft(tokens=ids, probs=table if sampling else None, confidence=confidence.float(), stopped_by_threshold=stopped)

    def observe(self, num_accepted: int) -> None:
        """Roll the cache back to the context plus the accepted draft tokens."""
        keep = min(self.cache.get_seq_length(), self._base_len + num_accepted)
        self.cache.truncate(keep)


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
        self._extend(context[len(self._ids):].tolist())
        ids, total = self._ids, len(self._ids)
        found: list[int] = []
        for n in range(min(self.ngram_max, total), self.ngram_min - 1, -1):
            start = self._index.get(tuple(ids[total - n:]))
            if start is not None:
                found = ids[start:start + max_tokens]
                break
        tokens = torch.tensor(found, dtype=torch.long, device=context.device)
        return Draft(tokens=tokens, probs=None, confidence=torch.ones(len(found), device=context.device))

    def observe(self, num_accepted: int) -> None:
        """Prompt lookup keeps no per-cycle state (the index follows the context)."""


def build_drafter(
    draft_model: torch.nn.Module | None,
    *,
    max_len: int,
    temperature: float = 0.0,
    threshold: float = 0.0,
    generator: torch.Generator | None = None,
    ngram_max: int = 3,
    ngram_min: int = 1,
) -> ModelDrafter | NgramDrafter:
    """A fresh drafter for one sequence: a draft model's, or n-gram lookup when ``draft_model`` is None."""
    if draft_model is None:
        return NgramDrafter(ngram_max=ngram_max, ngram_min=ngram_min)
    return ModelDrafter(draft_model, max_len, temperature=temperature, threshold=threshold, generator=generator)
