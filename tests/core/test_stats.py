"""The one bootstrap routine (``core/stats.py``, ``bootstrap``): every CI the package computes comes from it,
and where a CI is a one-level percentile bootstrap it is exactly scipy.stats.bootstrap's percentile interval
(scipy is the independent oracle here, not a copy of the rule); and the tokens/s and speedup CIs over
prompts (RateSamples)."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from specdec_tune.core.latency import LatencySamples, RequestLatency, latency_summary
from specdec_tune.core.stats import RESAMPLES, bootstrap
from specdec_tune.dashboard.trends import BOOTSTRAP_RESAMPLES, median_ci
from specdec_tune.tuner.regress import align, speed_test

PACKAGE = Path(__file__).resolve().parents[2] / "specdec_tune"


def test_bootstrap_draws_what_scipy_draws_and_gives_its_percentile_interval():
    x = np.random.default_rng(7).lognormal(0.0, 0.5, 9)
    ours = bootstrap(lambda picked, _: np.median(x[picked], axis=1), len(x), resamples=999, seed=3)
    theirs = sps.bootstrap((x,), np.median, n_resamples=999, method="percentile", vectorized=True,
                           rng=np.random.default_rng(3))
    assert np.array_equal(ours.replicates, theirs.bootstrap_distribution)  # the same resamples, in order
    assert ours.interval == pytest.approx(tuple(theirs.confidence_interval), rel=1e-12)


def test_the_latency_percentile_ci_is_scipys_bootstrap_over_prompts():
    """A p90 of per-prompt TTFTs (one request per prompt, so the median of repeats is the TTFT itself)."""
    rng = np.random.default_rng(11)
    ttft = rng.uniform(0.05, 0.4, 8)
    requests = tuple((RequestLatency((float(t), float(t) + 0.1), (1, 3)),) for t in ttft)
    summary = latency_summary(LatencySamples(tuple(f"p{i}" for i in range(8)), requests))
    theirs = sps.bootstrap((ttft,), lambda s, axis: np.quantile(s, 0.9, axis=axis), n_resamples=RESAMPLES,
                           method="percentile", vectorized=True, rng=np.random.default_rng(0))
    assert summary["ttft_s"]["p90"]["ci"] == pytest.approx(list(theirs.confidence_interval), rel=1e-12)


def test_the_regression_speed_ratio_ci_is_scipys_paired_bootstrap_over_prompts():
    """Prompts are resampled with all their repeats, both sides together (a paired cluster bootstrap)."""
    rng = np.random.default_rng(5)
    base = {f"p{i}": list(rng.uniform(50, 150) * rng.uniform(0.95, 1.05, 3)) for i in range(6)}
    cur = {k: [v * 0.93 * rng.uniform(0.97, 1.03) for v in vs] for k, vs in base.items()}
    xa, xb = align(base, cur)

    def ratio(a, b, axis):  # a, b: [repeats, B, prompts] after scipy moves the resampled axis last
        return np.median(b, axis=(0, 2)) / np.median(a, axis=(0, 2))

    theirs = sps.bootstrap((xa, xb), ratio, n_resamples=2000, paired=True, method="percentile", vectorized=True,
                           rng=np.random.default_rng(0))
    assert speed_test(base, cur).ci == pytest.approx(tuple(theirs.confidence_interval), rel=1e-12)


def test_the_dashboard_trend_ci_is_scipys_bootstrap_of_the_median():
    rates = list(np.random.default_rng(2).uniform(80, 120, 7))
    theirs = sps.bootstrap((np.asarray(rates),), np.median, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                           vectorized=True, rng=np.random.default_rng(0))
    assert median_ci(rates) == pytest.approx(tuple(theirs.confidence_interval), rel=1e-12)


def test_only_the_bootstrap_routine_draws_resamples():
    """No module but core/stats.py makes its own numpy generator: every resample comes from ``bootstrap``."""
    makers = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("default_rng", "RandomState"):
                makers.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert makers and all(m.startswith("core/stats.py:") for m in makers), makers


# --------------------------------------------------------------------------- rates' confidence intervals


def test_ci_of_constant_samples_has_zero_width():
    from specdec_tune.core.stats import RateSamples, tokens_per_s_ci

    s = RateSamples(("a", "b"), ((64, 64, 64), (64, 64, 64)), ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)))
    assert s.tokens_per_s == 128.0 and tokens_per_s_ci(s) == (128.0, 128.0)
    assert tokens_per_s_ci(s.to_json()) == (128.0, 128.0)  # the stored form reads back


def test_no_ci_from_one_prompt():
    """One prompt says nothing about the spread between prompts: no CI (was a zero-width interval at the
    point estimate with one repeat, and an interval of the repeats' noise alone with several), however
    many repeats; a speedup's CI likewise."""
    from specdec_tune.core.stats import RateSamples, ci_unavailable, speedup_ci, tokens_per_s_ci

    one = RateSamples(("a",), ((10,),), ((0.25,),))
    noisy = RateSamples(("a",), ((10, 10, 10),), ((0.25, 0.3, 0.2),))
    assert one.tokens_per_s == 40.0 and tokens_per_s_ci(one) is None and tokens_per_s_ci(noisy) is None
    assert speedup_ci(noisy, one) is None and tokens_per_s_ci(one.to_json()) is None
    assert ci_unavailable(1) == "no 95% CI from 1 prompt: a CI over prompts needs >= 2" and ci_unavailable(2) is None


def test_ci_covers_the_true_rate_about_95_percent_of_the_time():
    """Prompts with different speeds drawn from a known population: the interval must cover the true
    tokens/s (64 / E[seconds]) near its nominal rate. A CI that resampled only the repeats (ignoring
    which prompts were drawn) would cover far less often, so this has power."""
    import numpy as np

    from specdec_tune.core.stats import RateSamples, tokens_per_s_ci

    rng = np.random.default_rng(1)
    truth = 64 / 2.0  # seconds ~ Gamma(shape 8, scale 0.25): mean 2.0
    covered, narrow_covered, sims = 0, 0, 200
    for k in range(sims):
        base = rng.gamma(8.0, 0.25, size=20)
        secs = tuple(tuple(b * (1 + 0.01 * rng.standard_normal(3))) for b in base)
        s = RateSamples(tuple(map(str, range(20))), tuple((64.0,) * 3 for _ in range(20)), secs)
        lo, hi = tokens_per_s_ci(s, resamples=1000, seed=k)
        covered += lo <= truth <= hi
        # the wrong interval: repeats resampled within fixed prompts only
        reps = np.array(secs)[:, rng.integers(0, 3, size=(1000, 3))].mean(axis=2)  # [20, 1000]
        rates = 64 * 20 / reps.sum(axis=0)
        narrow_covered += np.quantile(rates, 0.025) <= truth <= np.quantile(rates, 0.975)
    assert 0.88 <= covered / sims <= 0.99
    assert narrow_covered / sims < 0.5


def test_speedup_ci_is_paired():
    from specdec_tune.core.stats import RateSamples, speedup_ci, tokens_per_s_ci

    base_secs = ((1.0, 1.1), (3.0, 2.9), (0.5, 0.6), (2.0, 2.2))
    ids, tokens = ("a", "b", "c", "d"), tuple((64.0, 64.0) for _ in range(4))
    base = RateSamples(ids, tokens, base_secs)
    fast = RateSamples(ids, tokens, tuple(tuple(x / 2 for x in row) for row in base_secs))
    lo, hi = tokens_per_s_ci(base)
    assert hi / lo > 1.3  # prompts differ a lot ...
    assert speedup_ci(fast, base) == pytest.approx((2.0, 2.0))  # ... but the pairing cancels it
    with pytest.raises(ValueError, match="same prompts"):
        speedup_ci(fast, RateSamples(("x", "b", "c", "d"), tokens, base_secs))
