"""Sampling with several drafts is exact: token trees (M >= 2 drafts per node) and staged drafting emit
the target's distribution.

The machinery is ``tests/engine/test_sampling.py``'s: bigram target and draft (the engine's whole loop at
microseconds a forward), the exact joint law of the first two emitted tokens, and a chi-square test
over many runs. Each variant has shown power: the same statistic rejects planted wrong rules, each a
mistake a multi-draft implementation can make:

- *no residual*: every sibling is tested against p itself instead of the residual left by the
  siblings rejected before it (SpecInfer's rule updates the residual after each rejection);
- *resample p*: when every sibling is rejected, the token is drawn from p instead of the residual;
- *staged wrong q*: the staged drafter hands the outer verifier the inner drafter's q instead of
  the draft model's, so the outer ratio p/q uses the wrong proposal;
- *inner accepts all*: the inner stage skips its rejection test, so the drafted tokens are not
  distributed as the draft's q the outer verifier is told.

``pytest -s`` prints every p-value.
"""
from __future__ import annotations

import pytest
import torch

from specdec_tune.engine import DecodeConfig, ModelDrafter, NgramDrafter, speculative
from specdec_tune.engine.staged import StagedDrafter
from specdec_tune.engine.tree_decode import TreeSamplingVerifier, tree_speculative
from specdec_tune.engine.tree_draft import TreeDrafter
from specdec_tune.engine.tree_verify import TreeVerdict, verify_tree_sampling
from specdec_tune.engine.types import Draft
from specdec_tune.core.trees import parse_tree
from tests.support.stub_models import Bigram
from tests.engine.test_sampling import DRAFT_ROWS, TEMP, VOCAB, chi2_pvalue, pair, target_joint  # noqa: F401 (pair: the fixture)

SAMPLES = 1500


def wrong_no_residual(tree, target_probs, generator=None) -> TreeVerdict:
    """Bug on purpose: each sibling is tested against p, never against the updated residual."""
    tokens, shape, path, row = tree.tokens.tolist(), tree.shape, [], 0
    while True:
        p = target_probs[row]
        last_q = None
        for child in shape.children[row]:
            x = tokens[child]
            q = tree.probs[child] if tree.probs is not None else torch.nn.functional.one_hot(
                torch.tensor(x), p.shape[0]).to(p.dtype)
            if float(torch.rand((), generator=generator)) * float(q[x]) < float(p[x]):
                path.append(child)
                row = child + 1
                break
            last_q = q
        else:
            residual = p if last_q is None else (p - last_q).clamp_min(0)
            residual = residual / residual.sum() if residual.sum() > 0 else p
            return TreeVerdict(tuple(path), int(torch.multinomial(residual, 1, generator=generator)))


def wrong_resample_p(tree, target_probs, generator=None) -> TreeVerdict:
    """Bug on purpose: the right acceptances, but after rejecting every sibling the token comes from p."""
    verdict = verify_tree_sampling(tree, target_probs, generator)
    row = verdict.path[-1] + 1 if verdict.path else 0
    if tree.shape.children[row]:  # the node had children and all were rejected
        return TreeVerdict(verdict.path, int(torch.multinomial(target_probs[row], 1, generator=generator)))
    return verdict


def tree_pairs(target, draft, prompt, tree: str, depth: int, verify_fn=None) -> torch.Tensor:
    """Counts of the first two emitted tokens over SAMPLES tree-decoding runs, ``[V, V]``."""
    counts = torch.zeros(VOCAB, VOCAB)
    gen = torch.Generator().manual_seed(1234)
    cfg = DecodeConfig(max_new_tokens=2, num_speculative_tokens=depth, temperature=TEMP)
    spec = parse_tree(tree)
    multi = 0
    with torch.no_grad():
        for _ in range(SAMPLES):
            drafter = TreeDrafter(draft, 32, spec, rank_accept=(0.5, 0.3, 0.2), temperature=TEMP, generator=gen)
            verifier = None if verify_fn is None else TreeSamplingVerifier(TEMP, verify_fn)
            res = tree_speculative(target, drafter, prompt, cfg, gen, verifier=verifier)
            counts[res.token_ids[0], res.token_ids[1]] += 1
            multi += any(r > 0 for c in res.cycles for r in c.path_ranks)
    assert multi > 0, f"{tree}: no run accepted a sibling other than the first"
    return counts


# depth 2 drafts both tokens; depth 1 with two tokens observes the bonus token after an accepted draft
TREE_VARIANTS = [("chains:2", 2), ("chains:3", 1), ("topk:2-2", 2), ("sequoia:4", 2), ("eagle:2:4", 2)]


@pytest.mark.parametrize("tree,depth", [pytest.param(*v, marks=() if v == ("sequoia:4", 2) else pytest.mark.slow)
                                        for v in TREE_VARIANTS])  # the fast tier keeps one
def test_tree_sampling_matches_target_distribution(pair, tree, depth):
    target, draft, prompt, probs = pair
    good = chi2_pvalue(tree_pairs(target, draft, prompt, tree, depth), probs)
    bad = {name: chi2_pvalue(tree_pairs(target, draft, prompt, tree, depth, fn), probs)
           for name, fn in (("no residual", wrong_no_residual), ("resample p", wrong_resample_p))}
    print(f"\n{tree} depth {depth}: exact p={good:.3g}; " + "; ".join(f"{k} p={v:.3g}" for k, v in bad.items()))
    assert good > 1e-3, f"exact tree sampler rejected (p = {good:.2e})"
    for name, p in bad.items():
        assert p < 1e-6, f"{name} not detected (p = {p:.2e}): the test has no power"


class WrongQStaged(StagedDrafter):
    """Bug on purpose: the proposal rows handed to the outer verifier are the inner drafter's q."""

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        draft = super().propose(context, max_tokens)
        inner = self.inner.model  # the inner bigram: its q at each drafted token's context
        prev = torch.cat([context[-1:], draft.tokens[:-1]])
        q = torch.softmax(inner.table[prev] / self.temperature, dim=-1)
        return Draft(draft.tokens, q, draft.confidence)


class AcceptAllStaged(StagedDrafter):
    """Bug on purpose: the inner stage accepts every inner token (no rejection test), so the drafted
    tokens are not distributed as the draft model's q that the outer verifier is told."""

    def _inner_verdict(self, guess, logits):
        acc, nxt, q = super()._inner_verdict(guess, logits)
        g = guess.length if guess is not None else 0
        if g and acc < g:
            return g, int(torch.multinomial(q[g], 1, generator=self.generator)), q
        return acc, nxt, q


def staged_pairs(target, draft, small, prompt, n: int, inner: str, cls=StagedDrafter) -> torch.Tensor:
    """Counts of the first two emitted tokens over SAMPLES staged runs; asserts the inner stage
    really speculated (fewer draft-model forwards than drafted tokens)."""
    counts = torch.zeros(VOCAB, VOCAB)
    gen = torch.Generator().manual_seed(99)
    cfg = DecodeConfig(max_new_tokens=2, num_speculative_tokens=n, temperature=TEMP)
    forwards = drafted = 0
    with torch.no_grad():
        for _ in range(SAMPLES):
            inner_drafter = NgramDrafter() if inner == "ngram" else ModelDrafter(small, 32, temperature=TEMP, generator=gen)
            staged = cls(draft, inner_drafter, 2, 32, temperature=TEMP, generator=gen)
            res = speculative(target, staged, prompt, cfg, gen)
            counts[res.token_ids[0], res.token_ids[1]] += 1
            forwards += sum(c.draft_forwards for c in res.cycles)
            drafted += sum(c.drafted for c in res.cycles)
    assert forwards < drafted, f"the inner stage never speculated ({forwards} forwards, {drafted} tokens)"
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("inner", ["model", "ngram"])
@pytest.mark.parametrize("n", [2])  # with two tokens observed, a larger N drafts the same
def test_staged_sampling_matches_target_distribution(pair, n, inner):
    target, draft, _, _ = pair
    prompt = torch.tensor([3, 1, 0, 3, 1, 0, 3, 1, 0])  # repeats, so n-gram lookup finds continuations
    probs = target_joint(target, prompt)
    small = Bigram(torch.tensor(DRAFT_ROWS, dtype=torch.float64).roll(1, dims=1).log())  # a worse draft of the draft
    good = chi2_pvalue(staged_pairs(target, draft, small, prompt, n, inner), probs)
    controls = {"inner accepts all": AcceptAllStaged}
    if inner == "model":
        controls["staged wrong q"] = WrongQStaged
    bad = {k: chi2_pvalue(staged_pairs(target, draft, small, prompt, n, inner, cls), probs) for k, cls in controls.items()}
    print(f"\nstaged ({inner}) N={n}: exact p={good:.3g}; " + "; ".join(f"{k} p={v:.3g}" for k, v in bad.items()))
    for k, v in bad.items():
        assert v < 1e-6, f"{k} not detected (p = {v:.2e}): the test has no power"
    assert good > 1e-3, f"exact staged sampler rejected (p = {good:.2e})"
