"""Lossy acceptance: over-accept draft tokens by ε and pay in bias (pure functions, no timing, no I/O).

Yin, Chen, Huang and Wang, "A Theoretical Perspective for Speculative Decoding Algorithm" (NeurIPS 2024,
OpenReview wSqpNeMVLU, arXiv 2411.00841; seed 003), Section 4. The paper swaps the letters (its p is the
draft); here p = target and q = draft, as everywhere in this project.

A rejection-based step draws x ~ q, accepts it with probability b(x), and otherwise emits a token drawn
from a resampling distribution P. It emits

    A(x) = q(x) b(x) + r P(x),      r = 1 - Σ_y q(y) b(y)   (the rejection probability)

Exact speculative sampling is b = min(1, p/q), P = norm(max(p - q, 0)): A = p, r = TV(p, q).
*Over-acceptance* raises b above min(1, p/q); we use the ε family b(x) = min(1, (p(x) + ε) / q(x)),
so ε = 0 is the exact rule (the paper's experiment sweeps an over-acceptance ε; its exact
parametrisation could not be read from the sources at hand, see docs/model.md, Lossy acceptance).

- Theorem 4: for a given b, the P that minimises the bias TV(A, p) is P* = norm(max(p - q b, 0)), and
  the least bias is Loss*(b) = Σ_x max(q(x) b(x) - p(x), 0): the accepted mass above p cannot be
  undone, and P* fills exactly the deficit. *Decoding-OPT* is b with P*.
- *Decoding-UNO* (the paper's baseline) resamples from the target itself, P = p; it is biased even at
  ε = 0 (A = min(p, q) + TV·p).
- Theorem 5: along b ≥ min(1, p/q) the front is linear, r + Loss*(b) = TV(p, q); no algorithm lies
  below bias = max(0, TV(p, q) - r).

Shapes: ``p``, ``q`` are ``[..., vocab]`` distributions (any leading batch dimensions).
"""
from __future__ import annotations

import torch

from specdec_tune.core.speculative import ACCEPTANCE_RULES

# The acceptance rules and their check belong to the speculative configuration (core/speculative.py):
# exact (OPT at ε = 0), Decoding-OPT, Decoding-UNO.
METHODS = ACCEPTANCE_RULES


def acceptance_prob(p: torch.Tensor, q: torch.Tensor, epsilon: float) -> torch.Tensor:
    """b(x) = min(1, (p(x) + ε) / q(x)), ``[..., vocab]`` (1 where q(x) = 0: such a token is never drawn)."""
    safe = torch.where(q > 0, q, torch.ones_like(q))
    return torch.where(q > 0, ((p + epsilon) / safe).clamp(max=1.0), torch.ones_like(q))


def resample_distribution(p: torch.Tensor, q: torch.Tensor, b: torch.Tensor, method: str) -> torch.Tensor:
    """P after a rejection: Theorem 4's P* = norm(max(p - q b, 0)) (exact, opt) or the target p (uno).

    Where P* has no mass (no rejection can happen there, r = 0) p is returned, as ``verify_sampling`` does.
    """
    if method == "uno":
        return p
    residual = (p - q * b).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / torch.where(total > 0, total, torch.ones_like(total)), p)


def emitted_distribution(p: torch.Tensor, q: torch.Tensor, epsilon: float, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, r): the distribution one verified position emits, ``[..., vocab]``, and its rejection probability ``[...]``."""
    b = acceptance_prob(p, q, epsilon)
    accepted = q * b  # [..., vocab]
    r = (1.0 - accepted.sum(-1)).clamp_min(0)  # [...]
    return accepted + r[..., None] * resample_distribution(p, q, b, method), r


def bias_and_rejection(p: torch.Tensor, q: torch.Tensor, epsilon: float, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(TV(A, p), r) per position, ``[...]`` each: the bias and the rejection probability of one step."""
    emitted, r = emitted_distribution(p, q, epsilon, method)
    return 0.5 * (emitted - p).abs().sum(-1), r


def least_bias(p: torch.Tensor, q: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Theorem 4's Loss*(b) = Σ_x max(q(x) b(x) - p(x), 0), ``[...]`` (what Decoding-OPT attains)."""
    return (q * acceptance_prob(p, q, epsilon) - p).clamp_min(0).sum(-1)


def pareto_bias(p: torch.Tensor, q: torch.Tensor, rejection: torch.Tensor) -> torch.Tensor:
    """Theorem 5's front: the least bias any rejection-based step can have at rejection probability r,
    max(0, TV(p, q) - r), ``[...]``."""
    tv = 0.5 * (p - q).abs().sum(-1)
    return (tv - rejection).clamp_min(0)
