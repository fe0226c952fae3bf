"""The suffix drafter (engine/suffix_drafter.py) in the decode loops: exact.

Exactness: greedy outputs equal target-only decoding (chains and trees, a global tree shared across
requests); sampling keeps the target's joint law of the first two tokens (``tests/engine/test_sampling.py``'s
chi-square) with shown power: the same statistic rejects a verifier that resamples from p after rejecting a
point-mass draft, and a drafter that hands the verifier its frequency estimates as if they were its
proposal distribution q (suffix decoding's drafts are deterministic: q is one-hot).
"""
from __future__ import annotations

import pytest
import torch

from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.core.suffix_cache import SuffixCache
from specdec_tune.engine import DecodeConfig, SamplingVerifier, SuffixDrafter, autoregressive, build_drafter, speculative
from specdec_tune.engine import suffix_cache_for, tree_speculative
from specdec_tune.engine.tree_decode import TreeSamplingVerifier
from specdec_tune.engine.tree_verify import TreeVerdict
from specdec_tune.engine.types import Draft, VerifyResult
from tests.engine.test_sampling import TEMP, VOCAB, chi2_pvalue, target_joint
from tests.support.stub_models import Bigram

# --------------------------------------------------------------------------- the drafter in the loops


@pytest.fixture(scope="module")
def bigram():
    g = torch.Generator().manual_seed(11)
    return Bigram(torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64) * 2.0)


PROMPTS = [[3, 1, 0, 3, 1, 2, 3, 1], [0, 0, 5, 4, 0, 0, 5], [2, 3], [5, 4, 5, 4, 5], [1]]


@pytest.mark.parametrize("tree", ["", "suffix"])
def test_greedy_is_target_only_decoding(bigram, tree):
    spec = SpeculativeConfig("suffix", 5, tree=tree, suffix_max_tree_depth=6, suffix_min_token_prob=0.0)
    cache = suffix_cache_for(spec)  # one serving history: later requests draft from earlier responses too
    accepted = 0
    for prompt in PROMPTS * 2:
        ids = torch.tensor(prompt)
        config = DecodeConfig(24, spec)
        drafter = build_drafter(None, spec, max_len=0, suffix_cache=cache)
        loop = tree_speculative if tree else speculative
        out = loop(bigram, drafter, ids, config)
        assert out.token_ids == autoregressive(bigram, ids, config).token_ids
        accepted += sum(c.accepted for c in out.cycles)
    assert accepted > 50  # the drafts were used, not empty
    assert cache.cached_requests == 2 * len(PROMPTS)


def test_finish_keeps_the_whole_response(bigram):
    spec = SpeculativeConfig("suffix", 3)
    cache = suffix_cache_for(spec)
    ids = torch.tensor([3, 1, 0])
    out = speculative(bigram, build_drafter(None, spec, max_len=0, suffix_cache=cache), ids, DecodeConfig(9, spec))
    probe = cache.start_request([9])
    # The response's last token came from the last cycle, which no proposal saw; finish added it.
    assert cache.global_tree.total == len(out.token_ids)
    assert cache.speculate(probe, out.token_ids[-3:-1], 1, 1.0, 0.0).tokens != ()


def test_cache_must_fit_the_configuration():
    with pytest.raises(ValueError, match="suffix cache"):
        SuffixDrafter(SuffixCache(8, 10), SpeculativeConfig("suffix", 3))


# --------------------------------------------------------------------------- sampling stays exact

SAMPLES = 1500
PROMPT = torch.tensor([3, 1, 0, 3, 1, 2, 3, 1])


class EstimateAsQ(SuffixDrafter):
    """Bug on purpose: hands the verifier the frequency estimate as q (mass D(N) on the token, the rest
    spread evenly), though the token was not drawn from that distribution."""

    def propose(self, context, max_tokens):
        d = super().propose(context, max_tokens)
        rows = []
        for tok, p in zip(d.tokens.tolist(), d.confidence.tolist()):
            q = torch.full((VOCAB,), (1 - p) / (VOCAB - 1), dtype=torch.float64)
            q[tok] = p
            rows.append(q)
        return Draft(d.tokens, torch.stack(rows) if rows else None, d.confidence)


def resample_p(draft_tokens, draft_probs, target_probs, generator) -> VerifyResult:
    """Bug on purpose: after rejecting a point-mass draft, draw from p instead of p without that token."""
    n = draft_tokens.shape[0]
    u = torch.rand(n, generator=generator, dtype=target_probs.dtype)
    ok = (u < target_probs[torch.arange(n), draft_tokens]).to(torch.int64)
    num = int(ok.cumprod(0).sum())
    return VerifyResult(num, int(torch.multinomial(target_probs[num], 1, generator=generator)))


def tree_resample_p(tree, target_probs, generator=None) -> TreeVerdict:
    """Bug on purpose (trees): the first child tested against p, and on rejection the token drawn from p."""
    kids = tree.shape.children[0]
    if kids:
        x = int(tree.tokens[kids[0]])
        if float(torch.rand((), generator=generator)) < float(target_probs[0][x]):
            return TreeVerdict((kids[0],), int(torch.multinomial(target_probs[kids[0] + 1], 1, generator=generator)))
    return TreeVerdict((), int(torch.multinomial(target_probs[0], 1, generator=generator)))


def suffix_pairs(target, tree: str = "", drafter_cls=SuffixDrafter, verify_fn=None, tree_fn=None) -> torch.Tensor:
    """Counts of the first two emitted tokens over SAMPLES requests sharing one serving history (so the
    drafts change as the global tree fills with earlier samples)."""
    spec = SpeculativeConfig("suffix", 2, tree=tree, suffix_max_tree_depth=6, suffix_min_token_prob=0.0,
                             suffix_max_spec_factor=2.0)
    cache = suffix_cache_for(spec)
    gen = torch.Generator().manual_seed(1234)
    config = DecodeConfig(2, spec, temperature=TEMP)
    counts = torch.zeros(VOCAB, VOCAB)
    with torch.no_grad():
        for _ in range(SAMPLES):
            drafter = drafter_cls(cache, spec)
            if tree:
                verifier = None if tree_fn is None else TreeSamplingVerifier(TEMP, tree_fn)
                out = tree_speculative(target, drafter, PROMPT, config, gen, verifier=verifier).token_ids
            else:
                verifier = None if verify_fn is None else SamplingVerifier(TEMP, verify_fn)
                out = speculative(target, drafter, PROMPT, config, gen, verifier=verifier).token_ids
            counts[out[0], out[1]] += 1
    return counts


@pytest.mark.parametrize("tree", ["", pytest.param("suffix", marks=pytest.mark.slow)])
def test_sampling_matches_target_distribution(bigram, tree):
    probs = target_joint(bigram, PROMPT)
    good = chi2_pvalue(suffix_pairs(bigram, tree), probs)
    controls = {"estimate as q": dict(drafter_cls=EstimateAsQ)} if not tree else {}
    controls["resample p"] = dict(tree_fn=tree_resample_p) if tree else dict(verify_fn=resample_p)
    bad = {k: chi2_pvalue(suffix_pairs(bigram, tree, **kw), probs) for k, kw in controls.items()}
    print(f"\nsuffix tree={tree!r}: exact p={good:.3g}; " + "; ".join(f"{k} p={v:.3g}" for k, v in bad.items()))
    assert good > 1e-3, f"exact sampler rejected (p = {good:.2e})"
    for k, v in bad.items():
        assert v < 1e-6, f"{k} not detected (p = {v:.2e}): the test has no power"
