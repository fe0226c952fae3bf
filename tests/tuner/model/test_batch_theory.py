"""The batch-speculative-decoding rejection formula (seed 003, Theorem 3 setting) against the engine.

The formula (``tuner.model.batch_rejections``) is checked against the engine's own ``chains:M``
tree decoding of a Markov-chain target and draft (bigram models at temperature 1, where p and q are
the transition matrices), as the seed's figure checks its theorem against simulation. Power: the
same simulation rejects the formula of a wrong rule (M independent single-draft tests, 1 - (1 - β)^M,
which ignores that each later sibling meets the residual) and the value for M - 1 chains.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_tune.engine import DecodeConfig
from specdec_tune.engine.tree_decode import tree_speculative
from specdec_tune.engine.tree_draft import TreeDrafter
from specdec_tune.core.trees import parse_tree
from specdec_tune.tuner.model import _batch_theory, batch_rejection_limit, batch_rejections
from tests.support.stub_models import Bigram

VOCAB, TOKENS, DEPTH, RUNS = 6, 24, 3, 1000


def markov_pair(seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(VOCAB) * 0.6, size=VOCAB)
    Q = rng.dirichlet(np.ones(VOCAB) * 0.6, size=VOCAB)
    return P, Q


def simulate(P: np.ndarray, Q: np.ndarray, m: int, runs: int = RUNS, seed: int = 0) -> np.ndarray:
    """Rejections per run of the engine's chains:M tree decoding over TOKENS tokens."""
    target, draft = Bigram(torch.tensor(np.log(P))), Bigram(torch.tensor(np.log(Q)))
    gen = torch.Generator().manual_seed(seed)
    cfg = DecodeConfig(max_new_tokens=TOKENS, num_speculative_tokens=DEPTH, temperature=1.0)
    prompt = torch.tensor([0])
    out = np.zeros(runs)
    with torch.no_grad():
        for i in range(runs):
            drafter = TreeDrafter(draft, 64, parse_tree(f"chains:{m}"), temperature=1.0, generator=gen)
            res = tree_speculative(target, drafter, prompt, cfg, gen)
            # a cycle ends in a rejection when its path is shorter than the tree's depth and the
            # recovered token was emitted (not cut by the TOKENS limit)
            out[i] = sum(c.accepted < c.drafted // m and c.emitted == c.accepted + 1 for c in res.cycles)
    return out


_EXACT_SIBLINGS = _batch_theory.sibling_acceptance


def naive_siblings(p, q, m):
    """A wrong rule's law: each sibling tested against p itself (β_m = β_1 for every m), so all M are
    rejected with probability TV^M, and the single-draft residual is kept."""
    betas, r = _EXACT_SIBLINGS(p, q, 1)
    return np.full(m, betas[0]), r


@pytest.mark.slow
@pytest.mark.parametrize("m", [1, 2, 5])
def test_rejection_formula_matches_engine_simulation(m):
    P, Q = markov_pair()
    sims = simulate(P, Q, m)
    mean, se = sims.mean(), sims.std(ddof=1) / np.sqrt(len(sims))
    exact = batch_rejections(P, Q, 0, TOKENS, m, DEPTH)
    z = (mean - exact) / se
    print(f"\nM={m}: simulated {mean:.3f} ± {se:.3f}, formula {exact:.3f} (z = {z:+.2f})")
    assert abs(z) < 4, f"M={m}: simulation {mean:.3f} ± {se:.3f} disagrees with the formula {exact:.3f}"
    if m >= 2:
        previous = batch_rejections(P, Q, 0, TOKENS, m - 1, DEPTH)
        print(f"  M - 1 chains {previous:.3f} (z = {(mean - previous) / se:+.1f})")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_batch_theory, "sibling_acceptance", naive_siblings)
            wrong = batch_rejections(P, Q, 0, TOKENS, m, DEPTH)
        print(f"  naive independent siblings {wrong:.3f} (z = {(mean - wrong) / se:+.1f})")
        assert abs(mean - wrong) / se > 4, f"the naive value {wrong:.3f} was not rejected: no power"


def test_rejections_fall_with_m_to_a_positive_limit_and_m1_is_theorem_1():
    P, Q = markov_pair()
    values = [batch_rejections(P, Q, 0, TOKENS, m, DEPTH) for m in range(1, 9)]
    assert all(a > b for a, b in zip(values, values[1:]))
    limit, reached = batch_rejection_limit(P, Q, 0, TOKENS, DEPTH)
    assert 0 < limit < values[-1] and reached > 8
    # M = 1 with unbounded depth: Theorem 1, E[N_rej] = Σ_n E_{x ~ p}[TV(p(.|x), q(.|x))]
    tv = 0.5 * np.abs(P - Q).sum(axis=1)
    dist, theorem1 = np.eye(VOCAB)[0], 0.0
    for _ in range(TOKENS):
        theorem1 += float(dist @ tv)
        dist = dist @ P
    assert batch_rejections(P, Q, 0, TOKENS, 1, None) == pytest.approx(theorem1, rel=1e-12)
