"""Batched speculative sampling keeps every sequence's target distribution.

Three sequences with different prompts (so different target distributions) are decoded together, each
drafting and accepting on its own; the first two tokens of each row are counted over many batches and
compared with that row's exact target joint by a chi-square test. The same statistic has shown power: it
rejects the classic verifier bug (resampling from p instead of the residual) and a batching bug planted
here (each row verified against its neighbour's logits, what a row mix-up after compaction would do).
Run with ``pytest -s`` to see the p-values.
"""
from __future__ import annotations

import pytest
import torch
from scipy import stats

from specdec_tune.engine import SamplingVerifier
from specdec_tune.engine import batch_decode
from specdec_tune.engine.batch_decode import DecodeConfig, batch_speculative
from specdec_tune.engine.batch_drafters import BatchModelDrafter
from specdec_tune.engine.types import VerifyResult
from tests.engine.test_sampling import DRAFT_ROWS  # its draft: rows whose top probabilities spread over 0.28..0.90
from tests.support.stub_batch import RaggedBigram

VOCAB = 6
TEMP = 1.0
BATCHES = 1500
PROMPTS = [torch.tensor([3, 1, 0]), torch.tensor([2, 5]), torch.tensor([4])]


@pytest.fixture(scope="module")
def pair():
    g = torch.Generator().manual_seed(7)
    target = RaggedBigram(torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64) * 1.2)
    draft = RaggedBigram(torch.tensor(DRAFT_ROWS, dtype=torch.float64).log())
    return target, draft


def joint(target: RaggedBigram, prompt: torch.Tensor) -> torch.Tensor:
    """Exact P(x1, x2 | prompt) of a bigram target, ``[V, V]``."""
    p = torch.softmax(target.table / TEMP, -1)
    return p[int(prompt[-1])][:, None] * p


def wrong_verify(draft_tokens, draft_probs, target_probs, generator) -> VerifyResult:
    """Bug on purpose: after a rejection, sample from p (not from the residual)."""
    n = draft_tokens.shape[0]
    if n == 0:
        return VerifyResult(0, int(torch.multinomial(target_probs[0], 1, generator=generator)))
    idx = torch.arange(n)
    ratio = target_probs[idx, draft_tokens] / draft_probs[idx, draft_tokens]
    num = int((torch.rand(n, generator=generator, dtype=ratio.dtype) < ratio).long().cumprod(0).sum())
    return VerifyResult(num, int(torch.multinomial(target_probs[num], 1, generator=generator)))


def counts(target, draft, *, n: int, theta: float, kind: str = "per-token", rule: str = "before",
           verifier=None) -> list[torch.Tensor]:
    """Per row, counts of its first two emitted tokens over BATCHES batches, ``[V, V]``."""
    out = [torch.zeros(VOCAB, VOCAB) for _ in PROMPTS]
    gen = torch.Generator().manual_seed(1234)
    config = DecodeConfig(max_new_tokens=2, num_speculative_tokens=n, temperature=TEMP, threshold=theta,
                          threshold_kind=kind, threshold_rule=rule, threshold_step=0.3)
    with torch.no_grad():
        for _ in range(BATCHES):
            drafter = BatchModelDrafter(draft, len(PROMPTS), 16, config.spec, temperature=TEMP, generator=gen)
            for r, res in enumerate(batch_speculative(target, drafter, PROMPTS, config, gen, verifier=verifier)):
                out[r][res.token_ids[0], res.token_ids[1]] += 1
    return out


def pvalue(observed: torch.Tensor, probs: torch.Tensor) -> float:
    expected = (probs * observed.sum()).flatten().double()
    obs = observed.flatten().double()
    small = expected < 5  # pooled, so the chi-square approximation holds
    o = torch.cat([obs[~small], obs[small].sum()[None]])
    e = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = e > 0
    return float(stats.chisquare(o[keep].numpy(), e[keep].numpy() * o[keep].sum().item() / e[keep].sum().item()).pvalue)


def _neighbours(verifiers, draft, logits, generator):
    """Bug on purpose: every row verified against the next row's logits."""
    return _rows(verifiers, draft, logits.roll(1, dims=0), generator)


_rows = batch_decode.verify_rows
VARIANTS = [(2, 0.0, "per-token", "before"),
            *(pytest.param(*v, marks=pytest.mark.slow) for v in [(1, 0.0, "per-token", "before"),
                                                                (2, 0.3, "per-token", "before"),
                                                                (2, 0.3, "per-token", "hf"),
                                                                (2, 0.15, "cumulative", "before"),
                                                                (1, 0.3, "adaptive", "before")])]


@pytest.mark.parametrize("n,theta,kind,rule", VARIANTS)
def test_each_row_keeps_its_target_distribution(pair, monkeypatch, n, theta, kind, rule):
    target, draft = pair
    probs = [joint(target, p) for p in PROMPTS]
    good = [pvalue(c, q) for c, q in zip(counts(target, draft, n=n, theta=theta, kind=kind, rule=rule), probs)]
    wrong = [pvalue(c, q) for c, q in zip(counts(target, draft, n=n, theta=theta, kind=kind, rule=rule,
                                                  verifier=SamplingVerifier(TEMP, wrong_verify)), probs)]
    monkeypatch.setattr(batch_decode, "verify_rows", _neighbours)
    mixed = [pvalue(c, q) for c, q in zip(counts(target, draft, n=n, theta=theta, kind=kind, rule=rule), probs)]
    print(f"\nN={n} θ={theta} {kind} {rule}: exact p={[f'{p:.3g}' for p in good]}; wrong verifier "
          f"p={[f'{p:.2g}' for p in wrong]}; rows mixed up p={[f'{p:.2g}' for p in mixed]}")
    assert min(good) > 1e-3 / len(PROMPTS), f"an exact row was rejected: {good}"
    assert min(wrong) < 1e-6, f"the wrong verifier was not detected: {wrong}"
    assert min(mixed) < 1e-6, f"rows verified against their neighbours were not detected: {mixed}"
