"""Speculative sampling is exact: the first two generated tokens follow the target's distribution.

The test has power: the same statistic rejects a verifier with a classic bug (resampling from p
instead of the residual max(p - q, 0) after a rejection).
"""
from __future__ import annotations

import copy

import torch
from scipy import stats

from specdec_tune.engine import DecodeConfig, ModelDrafter, speculative
from specdec_tune.engine.types import VerifyResult
from tests.tiny import tiny_llama

VOCAB = 6
TEMP = 1.0
SAMPLES = 1500


def target_joint(target, prompt) -> torch.Tensor:
    """Exact P(x1, x2 | prompt) of the target at temperature TEMP, ``[V, V]``."""
    with torch.no_grad():
        p1 = torch.softmax(target(prompt[None]).logits[0, -1] / TEMP, -1)
        ctx = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
        p2 = torch.softmax(target(ctx).logits[:, -1] / TEMP, -1)
    return p1[:, None] * p2


def wrong_verify(draft_tokens, draft_probs, target_probs, generator) -> VerifyResult:
    """Bug on purpose: after a rejection, sample from p (not from the residual)."""
    n = draft_tokens.shape[0]
    idx = torch.arange(n)
    ratio = target_probs[idx, draft_tokens] / draft_probs[idx, draft_tokens]
    u = torch.rand(n, generator=generator, dtype=ratio.dtype)
    num = int((u < ratio).to(torch.int64).cumprod(0).sum())
    nxt = int(torch.multinomial(target_probs[num], 1, generator=generator))
    return VerifyResult(num, nxt)


def sample_pairs(target, draft, prompt, verify_fn=None) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    gen = torch.Generator().manual_seed(1234)
    cfg = DecodeConfig(max_new_tokens=2, num_speculative_tokens=2, temperature=TEMP)
    with torch.no_grad():
        for _ in range(SAMPLES):
            drafter = ModelDrafter(draft, 32, temperature=TEMP, generator=gen)
            out = speculative(target, drafter, prompt, cfg, gen, verify_fn=verify_fn).token_ids
            counts[out[0], out[1]] += 1
    return counts


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = (probs * counts.sum()).flatten().double()
    observed = counts.flatten().double()
    # Pool cells with small expectation into one so the chi-square approximation holds.
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    return float(stats.chisquare(obs[keep].numpy(), exp[keep].numpy() * obs[keep].sum().item() / exp[keep].sum().item()).pvalue)


def test_speculative_sampling_matches_target_distribution():
    target = tiny_llama(VOCAB, layers=2, seed=3, sharpness=4.0)
    # The draft is an over-confident copy of the target (its logits x3): q overlaps p but puts too much
    # mass on p's favourite tokens, which is where resampling from p instead of the residual shows.
    draft = copy.deepcopy(target)
    draft.lm_head.weight.mul_(3.0)
    prompt = torch.tensor([1, 2, 3])
    probs = target_joint(target, prompt)
    good = chi2_pvalue(sample_pairs(target, draft, prompt), probs)
    bad = chi2_pvalue(sample_pairs(target, draft, prompt, verify_fn=wrong_verify), probs)
    assert good > 1e-3, f"exact sampler rejected (p = {good:.2e})"
    assert bad < 1e-6, f"buggy verifier not detected (p = {bad:.2e}): the test has no power"
