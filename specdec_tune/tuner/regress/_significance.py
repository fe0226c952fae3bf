"""Statistics of a regression comparison (scipy.stats; pure functions, no I/O).

Speed metrics compare per-prompt samples (one per prompt and repeat). Prompts differ far more from
each other (length, acceptance) than one prompt differs between two runs, so each prompt's values
are first *aligned*: divided by that prompt's pooled median over both sides' repeats (Hodges &
Lehmann's aligned ranks). The Mann-Whitney U test then sees only the within-prompt change, and the
effect is the ratio of the medians of the aligned values with a bootstrap CI that resamples prompts
with all their repeats (cluster bootstrap).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from specdec_tune.core.stats import bootstrap

#: z for a two-sided 1 % test and 80 % power: the minimum detectable change is (z_a + z_b)·SE.
_Z_ALPHA, _Z_POWER = 2.5758, 0.8416


@dataclass(frozen=True)
class SpeedTest:
    """A speed comparison: ratio current/baseline of the medians (1.0 = unchanged)."""

    ratio: float
    ci: tuple[float, float]
    p_value: float
    n_baseline: int
    n_current: int
    se_log: float  # bootstrap standard error of log(ratio)


def _as_lists(values: dict[str, float | Sequence[float]]) -> dict[str, list[float]]:
    return {k: [float(x) for x in (v if isinstance(v, (list, tuple)) else [v]) if x > 0] for k, v in values.items()}


def align(baseline: dict[str, float | Sequence[float]], current: dict[str, float | Sequence[float]]
          ) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt aligned samples, ``[prompts, repeats]`` per side.

    Each prompt's values (one per repeat, both sides) are divided by that prompt's pooled median, so
    only the within-prompt change remains. With one value per side the two aligned values would
    mirror each other around 1 (b = 2 - a) and Mann-Whitney would treat a sign test as 2n
    independent samples; several repeats per side keep the samples close to exchangeable.
    """
    b, c = _as_lists(baseline), _as_lists(current)
    keys = [k for k in b if k in c and b[k] and c[k]]
    if not keys:
        return np.empty((0, 0)), np.empty((0, 0))
    ra, rc = min(len(b[k]) for k in keys), min(len(c[k]) for k in keys)
    xa = np.array([b[k][:ra] for k in keys])
    xc = np.array([c[k][:rc] for k in keys])
    med = np.median(np.concatenate([xa, xc], axis=1), axis=1, keepdims=True)
    return xa / med, xc / med


def stratified_u_pvalue(xa: np.ndarray, xb: np.ndarray) -> float:
    """Two-sided p-value of the Mann-Whitney U statistics summed over prompts (van Elteren's test).

    One U per prompt (``scipy.stats.mannwhitneyu`` on that prompt's repeats), standardised with the
    exact null mean m·n/2 and variance m·n·(m+n+1)/12 (ties are measured times: negligible), summed
    with van Elteren's weights 1/(m+n+1). Pooling all prompts into one Mann-Whitney test would treat
    values tied together by their prompt as independent and give too small p-values.
    """
    m, n = xb.shape[1], xa.shape[1]
    w = 1.0 / (m + n + 1)
    num, var = 0.0, 0.0
    for a_row, b_row in zip(xa, xb):
        u = float(stats.mannwhitneyu(b_row, a_row, alternative="two-sided").statistic)
        num += w * (u - m * n / 2)
        var += w * w * m * n * (m + n + 1) / 12
    if var <= 0:
        return 1.0
    return float(2 * stats.norm.sf(abs(num) / math.sqrt(var)))


def median_ratio(baseline: dict[str, float | Sequence[float]], current: dict[str, float | Sequence[float]]) -> float:
    """Ratio current/baseline of the medians of the prompt-aligned samples (:func:`align`); NaN with
    fewer than two prompts on both sides."""
    xa, xb = align(baseline, current)
    if xa.shape[0] < 2:
        return math.nan
    return float(np.median(xb.ravel()) / np.median(xa.ravel()))


def speed_test(baseline: dict[str, float | Sequence[float]], current: dict[str, float | Sequence[float]], *,
               resamples: int = 2000, seed: int = 0) -> SpeedTest:
    """Mann-Whitney U per prompt (summed: :func:`stratified_u_pvalue`) and a bootstrap CI of the ratio
    of the medians of the aligned samples.

    Args:
        baseline: prompt id -> value, or its values per repeat (e.g. tokens/s of each repeat).
        current: the same for the current run.
        resamples: bootstrap resamples (prompts drawn with replacement with all their repeats, both
            sides together: a cluster bootstrap).
        seed: bootstrap seed (fixed: the same data gives the same CI).
    """
    xa, xb = align(baseline, current)
    n = xa.shape[0]
    if n < 2:
        return SpeedTest(math.nan, (math.nan, math.nan), math.nan, n, n, math.nan)
    fa, fb = xa.ravel(), xb.ravel()
    ratio = float(np.median(fb) / np.median(fa))
    p = 1.0 if np.allclose(np.sort(fa), np.sort(fb)) else stratified_u_pvalue(xa, xb)

    def medians_ratio(picked: np.ndarray, _) -> np.ndarray:
        return np.median(xb[picked].reshape(len(picked), -1), axis=1) / np.median(xa[picked].reshape(len(picked), -1), axis=1)

    boot = bootstrap(medians_ratio, n, resamples=resamples, seed=seed)
    se = float(np.std(np.log(boot.replicates), ddof=1))
    return SpeedTest(ratio, boot.interval, p, n, n, se)


@dataclass(frozen=True)
class ProportionTest:
    """Two-proportion z-test of accepted/reached counts at one position."""

    baseline_rate: float
    current_rate: float
    ratio: float
    ci: tuple[float, float]  # 95 % Wald CI of the difference current - baseline
    p_value: float


def two_proportion(k1: int, n1: int, k2: int, n2: int) -> ProportionTest:
    """Baseline k1/n1 vs current k2/n2 (pooled z-test; p = 1 when both rates are 0 or both 1)."""
    if n1 <= 0 or n2 <= 0:
        return ProportionTest(math.nan, math.nan, math.nan, (math.nan, math.nan), math.nan)
    p1, p2 = k1 / n1, k2 / n2
    pooled = (k1 + k2) / (n1 + n2)
    var = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if var <= 0:
        p = 1.0 if p1 == p2 else 0.0
    else:
        p = float(2 * stats.norm.sf(abs(p2 - p1) / math.sqrt(var)))
    se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    ratio = p2 / p1 if p1 > 0 else (1.0 if p2 == 0 else math.inf)
    return ProportionTest(p1, p2, ratio, (p2 - p1 - 1.96 * se, p2 - p1 + 1.96 * se), p)


def bh_adjust(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (scipy.stats.false_discovery_control); NaN stays NaN."""
    finite = [i for i, p in enumerate(p_values) if not math.isnan(p)]
    out = [math.nan] * len(p_values)
    if finite:
        adj = stats.false_discovery_control([p_values[i] for i in finite], method="bh")
        for i, q in zip(finite, np.atleast_1d(adj)):
            out[i] = float(q)
    return out


def minimum_detectable_change(se_log: float) -> float:
    """Smallest relative change detected with 80 % power by a 1 % two-sided test, given SE of log(ratio)."""
    if not math.isfinite(se_log):
        return math.nan
    return 1.0 - math.exp(-(_Z_ALPHA + _Z_POWER) * se_log)


def proportion_mdc(rate: float, n: int) -> float:
    """Relative minimum detectable drop of a rate measured on n cycles (two equal samples)."""
    if n <= 0 or rate <= 0 or not math.isfinite(rate):
        return math.nan
    return (_Z_ALPHA + _Z_POWER) * math.sqrt(2 * rate * (1 - rate) / n) / rate
