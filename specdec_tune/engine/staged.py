"""Staged speculative decoding: the draft model's own decoding is itself speculated.

Spector & Re 2023 ("Accelerating LLM Inference with Staged Speculative Decoding", seed 004,
Section 3.2): the draft model is a transformer too, so its autoregressive steps can be sped up the
same way, by a yet smaller model or an n-gram model. :class:`StagedDrafter` is an ordinary
``Drafter`` for the outer loop (``engine.decode.speculative``); inside ``propose`` it runs an inner
speculative loop in which the draft model is the verifier: the inner drafter proposes up to
``inner_n`` tokens, the draft model scores ``[last, e_1 .. e_g]`` in one forward, and the inner
verdict (``engine.verify``: greedy prefix, or exact rejection sampling) appends the accepted tokens
and the draft's own next token. Every token it proposes is therefore distributed exactly as the
draft model's (greedy: it *is* the draft's greedy token), and the row of draft probabilities it
carries is the draft's distribution at that position, so the outer verification against the
target stays exact: the output is the target's.

Draft-cache invariant, as in the outer loop: the draft cache holds every drafted-stream token except
the last one. ``observe`` rolls both caches back to the outer context plus the accepted tokens.
The inner n-gram lookup (``NgramDrafter``) rebuilds its index when the context it is given is
shorter than what it has seen, and is only ever given committed prefixes otherwise, so it needs
no rollback. θ does not apply to staged drafting (it runs θ = 0).
"""
from __future__ import annotations

import torch

from specdec_tune.engine.drafters import probs_from_logits
from specdec_tune.engine.kvcache import forward_with_cache, make_cache
from specdec_tune.engine.types import Draft, Drafter
from specdec_tune.engine.verify import greedy_accept, verify_sampling


class StagedDrafter:
    """A draft model whose decoding is speculated by ``inner`` (a smaller model's drafter or n-gram).

    Args:
        model: the draft model (verifier of the inner stage).
        inner: the inner drafter (``ModelDrafter`` of a smaller model, or ``NgramDrafter``), built
            with the same temperature and generator.
        inner_n: the most tokens the inner drafter proposes per inner cycle.
        max_len: positions the draft cache must hold.
        temperature: 0 = greedy.
        generator: random source for sampling.
    """

    def __init__(self, model: torch.nn.Module, inner: Drafter, inner_n: int, max_len: int, *,
                 temperature: float = 0.0, generator: torch.Generator | None = None) -> None:
        if inner_n < 1:
            raise ValueError(f"inner_n must be >= 1, got {inner_n}")
        self.model = model
        self.inner = inner
        self.inner_n = inner_n
        self.cache = make_cache(model, max_len + inner_n + 2)
        self.temperature = temperature
        self.generator = generator
        self.forwards = 0  # draft-model forwards of the last proposal
        self.inner_forwards = 0  # inner-model forwards of the last proposal (0 for n-gram)
        self.fed_tokens = 0  # tokens the draft model's forwards carried in the last proposal
        self._base = 0

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        """Draft up to ``max_tokens`` tokens after ``context`` (``[T]``), distributed as the draft's."""
        self._base = base = context.shape[0]
        self.forwards = self.inner_forwards = self.fed_tokens = 0
        stream = torch.empty(base + max_tokens + self.inner_n + 1, dtype=torch.long, device=context.device)
        stream[:base] = context
        length = base
        rows: list[torch.Tensor] = []  # the draft's distribution (or logits, greedy) at each drafted position
        while length - base < max_tokens:
            budget = min(self.inner_n, max_tokens - (length - base) - 1)
            guess = self.inner.propose(stream[:length], budget) if budget > 0 else None
            self.inner_forwards += getattr(self.inner, "forwards", 0) if guess is not None else 0
            g = guess.length if guess is not None else 0
            # [.. g + 1]: what the cache has not seen (normally the stream's last token), e_1 .. e_g
            feed = stream[self.cache.get_seq_length():length + g]
            if g:
                stream[length:length + g] = guess.tokens
            logits = forward_with_cache(self.model, feed[None], self.cache, logits_to_keep=g + 1).logits[0]  # [g + 1, V]
            self.forwards += 1
            self.fed_tokens += feed.shape[0]
            acc, nxt, table = self._inner_verdict(guess, logits)
            stream[length + acc] = nxt
            rows.extend(table[:acc + 1].unbind(0))
            self.cache.truncate(length + acc)  # the stream minus its last token (the draft's invariant)
            if guess is not None:
                self.inner.observe(acc)
            length += acc + 1
        count = max_tokens
        tokens = stream[base:base + count]
        table = torch.stack(rows[:count])  # [L, vocab]
        self.cache.truncate(min(self.cache.get_seq_length(), base + count - 1))
        if self.temperature > 0:
            return Draft(tokens=tokens, probs=table, confidence=table.max(dim=-1).values.float())
        confidence = torch.exp(table.max(dim=-1).values - torch.logsumexp(table, dim=-1))
        return Draft(tokens=tokens, probs=None, confidence=confidence.float())

    def _inner_verdict(self, guess: Draft | None, logits: torch.Tensor) -> tuple[int, int, torch.Tensor]:
        """(accepted, the draft's next token, rows) of one inner cycle; rows are ``[g + 1, vocab]``
        logits (greedy) or the draft's q (sampling)."""
        empty = logits.new_empty(0, dtype=torch.long)
        tokens = guess.tokens if guess is not None else empty
        if self.temperature == 0:
            acc, nxt = greedy_accept(tokens, logits).tolist()
            return acc, nxt, logits
        q = probs_from_logits(logits, self.temperature)
        probs = guess.probs if guess is not None else None
        result = verify_sampling(tokens, probs, q, self.generator)
        return result.num_accepted, result.next_token, q

    def observe(self, num_accepted: int) -> None:
        """Roll the draft cache (and the inner model's) back to the context plus the accepted tokens."""
        keep = self._base + num_accepted
        self.cache.truncate(min(self.cache.get_seq_length(), keep))
        inner_cache = getattr(self.inner, "cache", None)
        if inner_cache is not None:
            inner_cache.truncate(min(inner_cache.get_seq_length(), keep))
