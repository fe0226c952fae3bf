"""Lossy acceptance (Yin et al. 2024, Theorems 4-5): ε = 0 is the exact rule, the bias formulas hold,
and the engine emits what they say (chi-square, with shown power)."""
from __future__ import annotations

import pytest
import torch

from specdec_tune.engine import DecodeConfig, ModelDrafter, speculative
from specdec_tune.engine.lossy import bias_and_rejection, emitted_distribution, least_bias, pareto_bias
from specdec_tune.engine.verify import verify_lossy, verify_sampling
from tests.engine.test_sampling import SAMPLES, TEMP, VOCAB, chi2_pvalue, pair  # noqa: F401 - pair is a fixture


def _random_pq(seed: int, rows: int = 64, vocab: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 2, -1)
    return p, q


@pytest.mark.parametrize("method", ["opt", "exact"])
def test_zero_epsilon_is_todays_exact_rule(method):
    """With ε = 0, OPT draws the same verdict and token as ``verify_sampling`` from the same random
    stream, on drafts of every length and with point-mass drafts: it *is* the exact rule. UNO at ε = 0
    is not (it resamples from p), and this comparison catches it."""
    differs = 0
    for seed in range(300):
        p, q = _random_pq(seed, rows=5, vocab=7)
        length = seed % 5
        g = torch.Generator().manual_seed(seed)
        tokens = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(length)]) if length else \
            torch.empty(0, dtype=torch.long)
        for draft_probs in (q[:length], None):
            want = verify_sampling(tokens, draft_probs, p[:length + 1], torch.Generator().manual_seed(seed))
            got = verify_lossy(tokens, draft_probs, p[:length + 1], torch.Generator().manual_seed(seed),
                               epsilon=0.0, method=method)
            assert got == want, (seed, length)
            uno = verify_lossy(tokens, draft_probs, p[:length + 1], torch.Generator().manual_seed(seed),
                               epsilon=0.0, method="uno")
            differs += uno != want
    assert differs > 10  # the comparison has power: a resampling from p is seen


@pytest.mark.parametrize("epsilon", [0.0, 0.02, 0.1, 0.4])
def test_theorem_4_and_5_on_random_distributions(epsilon):
    """OPT's bias equals Theorem 4's least bias Σ max(q b - p, 0), no other resampling distribution does
    better, rejection + bias = TV(p, q) (Theorem 5's front), and UNO is at least as biased."""
    p, q = _random_pq(int(epsilon * 100) + 1)
    bias, r = bias_and_rejection(p, q, epsilon, "opt")
    torch.testing.assert_close(bias, least_bias(p, q, epsilon))
    tv = 0.5 * (p - q).abs().sum(-1)
    torch.testing.assert_close(r + bias, tv)
    torch.testing.assert_close(pareto_bias(p, q, r), bias)
    uno, r_uno = bias_and_rejection(p, q, epsilon, "uno")
    torch.testing.assert_close(r_uno, r)  # same b: same rejections
    assert bool((uno >= bias - 1e-12).all()) and float((uno - bias).max()) > 1e-3
    # any other resampling distribution P: the emitted q·b + r·P is no closer to p (Theorem 4's optimality)
    accepted_mass = emitted_distribution(p, q, epsilon, "uno")[0] - r[:, None] * p  # q·b, [rows, vocab]
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        other = torch.softmax(torch.randn(p.shape, generator=g, dtype=torch.float64) * 3, -1)
        emitted = accepted_mass + r[:, None] * other
        assert bool((0.5 * (emitted - p).abs().sum(-1) >= bias - 1e-12).all())
    if epsilon == 0:
        assert float(bias.abs().max()) < 1e-12 and float(uno.min()) > 0  # exact; UNO biased even at ε = 0


def _lossy_joint(target, draft, prompt, epsilon: float, method: str) -> torch.Tensor:
    """P(x1, x2) emitted by lossy decoding with N = 2 and two tokens: both positions are verified, so the
    joint is A_1(x1)·A_2(x2 | x1) with A from ``emitted_distribution`` (bigram models: a row per token)."""
    with torch.no_grad():
        def probs(model, ctx):
            return torch.softmax(model(ctx[None]).logits[0, -1] / TEMP, -1)
        a1, _ = emitted_distribution(probs(target, prompt), probs(draft, prompt), epsilon, method)
        rows = []
        for x in range(VOCAB):
            ctx = torch.cat([prompt, torch.tensor([x])])
            rows.append(emitted_distribution(probs(target, ctx), probs(draft, ctx), epsilon, method)[0])
    return a1[:, None] * torch.stack(rows)


def _sample_lossy(target, draft, prompt, epsilon: float, method: str) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    gen = torch.Generator().manual_seed(4321)
    cfg = DecodeConfig(max_new_tokens=2, num_speculative_tokens=2, temperature=TEMP, acceptance=method, epsilon=epsilon)
    with torch.no_grad():
        for _ in range(SAMPLES):
            out = speculative(target, ModelDrafter(draft, 32, temperature=TEMP, generator=gen), prompt, cfg, gen).token_ids
            counts[out[0], out[1]] += 1
    return counts


@pytest.mark.parametrize("method,epsilon", [("opt", 0.05), *(pytest.param(m, e, marks=pytest.mark.slow) for m, e in
                                                                [("uno", 0.05), ("opt", 0.1), ("uno", 0.1), ("uno", 0.0)])])
def test_engine_emits_the_computed_lossy_distribution(pair, method, epsilon):
    """The engine's lossy decoding follows the distribution the bias is computed from (chi-square p > 1e-3),
    and the statistic has power: the target's own joint (what exact decoding emits) and the other
    method's joint are rejected (p < 1e-6), so the computed bias is real and OPT and UNO differ."""
    target, draft, prompt, exact = pair
    counts = _sample_lossy(target, draft, prompt, epsilon, method)
    good = chi2_pvalue(counts, _lossy_joint(target, draft, prompt, epsilon, method))
    other = "uno" if method == "opt" else "opt"
    bad = {"target (exact)": chi2_pvalue(counts, exact),
           f"{other} ε={epsilon}": chi2_pvalue(counts, _lossy_joint(target, draft, prompt, epsilon, other))}
    print(f"\n{method} ε={epsilon}: computed p={good:.3g}; " + "; ".join(f"{k} p={v:.3g}" for k, v in bad.items()))
    assert good > 1e-3, f"the engine does not emit the computed distribution (p = {good:.2e})"
    for k, v in bad.items():
        assert v < 1e-6, f"{k} not rejected (p = {v:.2e}): the test has no power"


def test_lossy_configuration_is_checked():
    with pytest.raises(ValueError, match="temperature"):
        DecodeConfig(max_new_tokens=4, acceptance="opt", epsilon=0.1)
    with pytest.raises(ValueError, match="acceptance"):
        DecodeConfig(max_new_tokens=4, temperature=1.0, acceptance="lossy", epsilon=0.1)
    with pytest.raises(ValueError, match="epsilon"):
        DecodeConfig(max_new_tokens=4, temperature=1.0, acceptance="exact", epsilon=0.1)
    with pytest.raises(ValueError, match="epsilon"):
        DecodeConfig(max_new_tokens=4, temperature=1.0, acceptance="opt", epsilon=1.5)
