"""The one bootstrap routine (``core/stats.py``, ``bootstrap``): every CI the package computes comes from it,
and where a CI is a one-level percentile bootstrap it is exactly scipy.stats.bootstrap's percentile interval
(scipy is the independent oracle here, not a copy of the rule)."""
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
