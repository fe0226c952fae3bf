"""Speculative sampling with an EAGLE-3 head keeps the target's distribution (issue 39), chains and trees.

The bars of ``tests/engine/test_sampling.py`` and ``tests/engine/test_tree_sampling.py``: the exact joint law of the first
two emitted tokens of a tiny Llama target (vocabulary 6), a chi-square test over many seeded runs, and shown
power: the same statistic rejects planted wrong rules. Besides the verifier's classic bug (resampling from p
instead of the residual), a head-specific one: a drafter that hands the verifier the previous chain step's
q (the row its first pass computed) for the second drafted token. The head's draft vocabulary (4 of the 6
ids) leaves q = 0 on two tokens, so the d2t mapping is on the path too. ``pytest -s`` prints the p-values.
"""
from __future__ import annotations

import pytest
import torch

from specdec_tune.core.trees import parse_tree
from specdec_tune.engine import DecodeConfig, EagleDrafter, EagleTreeDrafter, SamplingVerifier, speculative
from specdec_tune.engine.tree_decode import TreeSamplingVerifier, tree_speculative
from specdec_tune.engine.types import Draft
from tests.support.eagle_stub import lean, random_head, tiny_target
from tests.engine.test_sampling import TEMP, VOCAB, chi2_pvalue, target_joint, wrong_verify
from tests.engine.test_tree_sampling import wrong_resample_p

SAMPLES = 1500
PROMPT = torch.tensor([3, 1, 0, 4, 2])


@pytest.fixture(scope="module")
def setup():
    target = tiny_target(vocab=VOCAB, seed=3)
    head = random_head(target, draft_vocab=4, seed=5, scale=0.6)
    return lean(target), head, target_joint(target, PROMPT)


class StaleRowDrafter(EagleDrafter):
    """Bug on purpose: the second drafted token's q is the first's (the row of the first pass)."""

    def propose(self, context, max_tokens):
        d = super().propose(context, max_tokens)
        if d.probs is None or d.length < 2:
            return d
        probs = d.probs.clone()
        probs[1] = probs[0]
        return Draft(d.tokens, probs, d.confidence, d.stopped_by_threshold, d.token_probs, d.threshold)


def chain_pairs(setup, n: int, verify_fn=None, drafter_cls=EagleDrafter) -> torch.Tensor:
    target, head, _ = setup
    counts = torch.zeros(VOCAB, VOCAB)
    gen = torch.Generator().manual_seed(1234)
    cfg = DecodeConfig(max_new_tokens=2, num_speculative_tokens=n, temperature=TEMP)
    accepted = 0
    with torch.no_grad():
        for _ in range(SAMPLES):
            drafter = drafter_cls(head, 32, temperature=TEMP, generator=gen)
            verifier = None if verify_fn is None else SamplingVerifier(TEMP, verify_fn)
            res = speculative(target, drafter, PROMPT, cfg, gen, verifier=verifier)
            counts[res.token_ids[0], res.token_ids[1]] += 1
            accepted += sum(c.accepted for c in res.cycles)
    assert accepted > SAMPLES // 10, "the head's drafts are rarely accepted: the test would not exercise acceptance"
    return counts


def tree_pairs(setup, tree: str, depth: int, verify_fn=None) -> torch.Tensor:
    target, head, _ = setup
    counts = torch.zeros(VOCAB, VOCAB)
    gen = torch.Generator().manual_seed(1234)
    cfg = DecodeConfig(max_new_tokens=2, num_speculative_tokens=depth, temperature=TEMP)
    spec = parse_tree(tree)
    with torch.no_grad():
        for _ in range(SAMPLES):
            drafter = EagleTreeDrafter(head, 40, spec, temperature=TEMP, generator=gen)
            verifier = None if verify_fn is None else TreeSamplingVerifier(TEMP, verify_fn)
            res = tree_speculative(target, drafter, PROMPT, cfg, gen, verifier=verifier)
            counts[res.token_ids[0], res.token_ids[1]] += 1
    return counts


# The fast tier runs N = 2 against the head-specific planted bug; the verifier's classic bug (shown for
# every drafter in tests/engine/test_sampling.py) is planted here in the slow tier, at N = 1 and 2.
@pytest.mark.parametrize("n,planted", [(2, ("stale q row",)),
                                       pytest.param(2, ("wrong verifier",), marks=pytest.mark.slow),
                                       pytest.param(1, ("wrong verifier",), marks=pytest.mark.slow)])
def test_eagle_chain_sampling_matches_target_distribution(setup, n, planted):
    probs = setup[2]
    good = chi2_pvalue(chain_pairs(setup, n), probs)
    runs = {"wrong verifier": lambda: chain_pairs(setup, n, verify_fn=wrong_verify),
            "stale q row": lambda: chain_pairs(setup, n, drafter_cls=StaleRowDrafter)}
    bad = {k: chi2_pvalue(runs[k](), probs) for k in planted}
    print(f"\nEAGLE-3 chain N={n}: exact p={good:.3g}; " + "; ".join(f"{k} p={v:.3g}" for k, v in bad.items()))
    assert good > 1e-3, f"exact sampler rejected (p = {good:.2e})"
    for k, v in bad.items():
        assert v < 1e-6, f"{k} not detected (p = {v:.2e}): the test has no power"


@pytest.mark.slow
@pytest.mark.parametrize("tree,depth", [("topk:2-1", 2), ("chains:2", 2)])
def test_eagle_tree_sampling_matches_target_distribution(setup, tree, depth):
    probs = setup[2]
    good = chi2_pvalue(tree_pairs(setup, tree, depth), probs)
    bad = chi2_pvalue(tree_pairs(setup, tree, depth, verify_fn=wrong_resample_p), probs)
    print(f"\nEAGLE-3 tree {tree} depth {depth}: exact p={good:.3g}; resample p p={bad:.3g}")
    assert good > 1e-3, f"exact tree sampler rejected (p = {good:.2e})"
    assert bad < 1e-6, f"resampling from p not detected (p = {bad:.2e}): the test has no power"
