"""Expected rejections of batch speculative decoding with M i.i.d. drafts (seed 003, Theorem 3 setting).

Yin et al. 2024 ("A Theoretical Perspective for Speculative Decoding Algorithm", NeurIPS, seed 003)
model decoding as a Markov chain over tokens, count *rejections* (emitted tokens that are not an
accepted draft token), prove E[N_rej] = Σ_n E[TV(p_n, q_n)] for one draft (Theorem 1), and study
batch speculative decoding, where M draft sequences are drawn i.i.d. from q and verified together
(Theorem 3): the rejections fall with M towards a limit, and their figure compares simulated and
theoretical rejections for M = 4 and 5. The stored copies of the paper available to this project
give its abstract and figures, not the statement of Theorem 3, so this module derives the quantity
for the algorithm the engine runs and checks it against simulation of that very engine
(``benchmarks/theorem3_check.py``, ``tests/tuner/model/test_batch_theory.py``); the derivation is self-contained:

The engine's ``chains:M`` tree (``specdec_tune.core.trees``) of depth K: at the start of a cycle the root
has M children drawn i.i.d. from q(. | x) and verified by recursive rejection sampling (SpecInfer;
``engine.tree_verify``): with r_0 = p, sibling m is accepted with probability
β_m = Σ_z min(r_{m-1}(z), q(z)), else r_m = norm(max(r_{m-1} - q, 0)). All M are rejected with
probability R_M = Π_{m=1..M} (1 - β_m), and then the emitted token is drawn from r_M; jointly,

    P(emit y, accepted | x, cycle start) = p(y) - R_M·r_M(y),  P(emit y, rejected) = R_M·r_M(y).

Below the root every node has one child: standard speculative sampling, P(y, accepted) = min(p, q)(y),
P(y, rejected) = max(p - q, 0)(y) (total TV(p, q)). After K accepted tokens the bonus token comes
from p with no rejection. So the pair (last token x, depth d of the next token) is itself a Markov
chain, and

    E[N_rej] = Σ_{n=1..T} Σ_{x, d} π_n(x, d) · P(reject | x, d),

with π_1 = δ(x_0, d = 1) and π_{n+1} pushed forward by the joint laws above (accept: d -> d + 1,
reject or bonus: d -> 1). For M = 1 and K ≥ T this is Theorem 1's Σ_n E[TV(p_n, q_n)] (the output is
distributed as p, so π_n's token marginal is p's). As M grows, R_M falls and the rejections tend to
the rejections below the root, a positive limit (:func:`batch_rejection_limit`).
"""
from __future__ import annotations

import math

import numpy as np


def sibling_acceptance(p: np.ndarray, q: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """β_1..β_m of m i.i.d. drafts from q verified against p by recursive rejection, and the residual
    r_m left when all m are rejected (``[m]``, ``[V]``)."""
    r = np.asarray(p, dtype=float)
    q = np.asarray(q, dtype=float)
    betas = np.zeros(m)
    for i in range(m):
        overlap = np.minimum(r, q)
        betas[i] = overlap.sum()
        rest = np.maximum(r - q, 0.0)
        total = rest.sum()
        if total <= 1e-15:  # r <= q everywhere: the sibling is accepted surely, r stays meaningless
            betas[i] = 1.0
            betas[i + 1:] = 1.0
            break
        r = rest / total
    return betas, r


def all_rejected(betas: np.ndarray) -> float:
    """R_M = Π (1 - β_m): every sibling rejected."""
    return float(np.prod(1.0 - betas))


def _step_laws(P: np.ndarray, Q: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per current token x: root accept/reject laws over y (M siblings) and chain accept/reject laws."""
    vocab = P.shape[0]
    root_acc, root_rej = np.zeros((vocab, vocab)), np.zeros((vocab, vocab))
    for x in range(vocab):
        betas, r = sibling_acceptance(P[x], Q[x], m)
        reject = all_rejected(betas)
        root_rej[x] = reject * r
        root_acc[x] = P[x] - root_rej[x]
    chain_acc = np.minimum(P, Q)
    chain_rej = np.maximum(P - Q, 0.0)
    return root_acc, root_rej, chain_acc, chain_rej


def batch_rejections(P: np.ndarray, Q: np.ndarray, start: int, tokens: int, m: int, depth: int | None = None) -> float:
    """Exact E[N_rej] of batch speculative decoding with ``m`` i.i.d. chains over ``tokens`` output tokens.

    Args:
        P: ``[V, V]`` target transition matrix, P[x, y] = p(y | x).
        Q: ``[V, V]`` draft transition matrix.
        start: the last prompt token x_0.
        tokens: T, output tokens counted.
        m: M >= 1 chains.
        depth: K, tokens per chain (``None``: K = T, drafting never stops for a bonus token).
    """
    P, Q = np.asarray(P, dtype=float), np.asarray(Q, dtype=float)
    if m < 1:
        raise ValueError(f"M must be >= 1, got {m}")
    k = tokens if depth is None else depth
    vocab = P.shape[0]
    root_acc, root_rej, chain_acc, chain_rej = _step_laws(P, Q, m)
    pi = np.zeros((vocab, k + 2))  # [x, d], d = 1..K+1 (index 0 unused)
    pi[start, 1] = 1.0
    total = 0.0
    for _ in range(tokens):
        nxt = np.zeros_like(pi)
        # depth 1: the M siblings at the root
        total += float(pi[:, 1] @ root_rej.sum(axis=1))
        nxt[:, 1] += pi[:, 1] @ root_rej
        nxt[:, 2] += pi[:, 1] @ root_acc
        for d in range(2, k + 1):  # one child per node below the root
            total += float(pi[:, d] @ chain_rej.sum(axis=1))
            nxt[:, 1] += pi[:, d] @ chain_rej
            nxt[:, d + 1] += pi[:, d] @ chain_acc
        nxt[:, 1] += pi[:, k + 1] @ P  # the bonus token: from p, no rejection
        pi = nxt
    return total


def batch_rejection_limit(P: np.ndarray, Q: np.ndarray, start: int, tokens: int, depth: int | None = None,
                          tol: float = 1e-10, max_m: int = 4096) -> tuple[float, int]:
    """lim_{M -> ∞} E[N_rej] (computed by doubling M until it moves less than ``tol``) and the M reached."""
    m, last = 1, math.inf
    while m <= max_m:
        value = batch_rejections(P, Q, start, tokens, m, depth)
        if abs(last - value) < tol:
            return value, m
        last, m = value, 2 * m
    return last, m // 2
