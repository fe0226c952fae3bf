"""Pure statistics helpers shared by the profiler (which measures) and the tuner (which predicts).

Neither room may import the other (docs/architecture.md, Import contracts), so what both need
lives here: no torch, no database, no timing. numpy only.

:func:`bootstrap` is the one bootstrap routine: every CI the package prints (tokens/s, speedups, latency
percentiles and gaps here and in ``core/latency.py``, the regression's speed ratios, the dashboard's
trends) is a percentile bootstrap over prompts drawn with replacement, computed by it. A measured rate or
speedup and its CI come from one estimator (:func:`speedup_estimate`): the point is the statistic on the
samples as measured, the CI that statistic's bootstrap, and the CI always contains the point.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def trimmed_mean(values: Sequence[float], cut: float = 0.01) -> float:
    """Mean without the slowest ``cut`` fraction (the rare stall of a shared machine).

    Throughput is a ratio of *expected* times (renewal-reward), and times inside a decode loop have a
    right tail that a measurement pays as well, so means, not medians, are what predictions need.
    """
    xs = sorted(values)
    keep = max(1, len(xs) - int(len(xs) * cut))
    return sum(xs[:keep]) / keep


# A sample above median + ROBUST_MADS · MAD is a one-off (a graph capture, a new cache slot, a GC pause)
# when such samples are rare: at most RARE of them, or one. A frequent slow tail is a cost the loop pays
# every so often (a shared CPU's preemptions: on a loaded 2-core VM a third of the mean of the draft's
# in-loop forwards) and stays, with trimmed_mean's 1 % trim. The MAD is floored at MIN_SPREAD of the
# median so that samples that are nearly all equal (a graphed forward) keep their ordinary spread: at the
# floor the cut lies 25 % above the median.
ROBUST_MADS = 5.0
MIN_SPREAD = 0.05
RARE = 0.02


def robust_mean(values: Sequence[float]) -> float:
    """Mean of the samples without rare one-off costs (:data:`RARE` samples above median + 5·MAD at most),
    for in-loop means from any number of samples: :func:`trimmed_mean`'s 1 % trims nothing below 100
    samples, so one 25 ms capture among 8 forwards of 1 ms made their mean 4 ms (docs/model.md, In-loop
    calibration). Where more samples lie above the cut, they are a recurring cost: the trimmed mean.

    Raises:
        ValueError: no samples.
    """
    xs = list(values)
    if not xs:
        raise ValueError("robust_mean of no samples")
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    cut = med + ROBUST_MADS * max(mad, MIN_SPREAD * abs(med))
    kept = sorted(x for x in xs if x <= cut)  # summed in order, as trimmed_mean does
    if len(xs) - len(kept) > max(1, int(RARE * len(xs))):
        return trimmed_mean(xs)
    return sum(kept) / len(kept)


# --------------------------------------------------------------------------- throughput CIs
#
# A measured throughput is Σ_p tokens_p / Σ_p seconds_p over prompts p, where seconds_p is the median
# of that prompt's repeats (robust to a load burst on a shared machine). Its uncertainty comes from
# which prompts were drawn and from timing noise, so the bootstrap resamples both levels: prompts
# with replacement, then each drawn prompt's repeats with replacement, and recomputes the same
# statistic (percentile interval). Resampling both levels is slightly conservative (it counts the
# timing noise twice, once inside the prompts' spread); with few repeats that is the honest side.

CONFIDENCE = 0.95
RESAMPLES = 4000
# A CI over prompts needs two prompts at least. From one prompt the spread between prompts, most of a rate's
# uncertainty, is unknown: resampling its repeats alone gives an interval that covers the truth far less often
# than it claims (tests/core/test_stats.py, test_ci_covers_the_true_rate_about_95_percent_of_the_time).
MIN_CI_PROMPTS = 2


def ci_unavailable(prompts: int, of: int | None = None) -> str | None:
    """Why no 95% CI can be computed over ``prompts`` prompts (those with a value, ``of`` measured); None: it can."""
    if prompts >= MIN_CI_PROMPTS:
        return None
    had = f"{prompts} prompt{'' if prompts == 1 else 's'}" if of in (None, prompts) else f"{prompts} of {of} prompts"
    return f"no 95% CI from {had}: a CI over prompts needs >= {MIN_CI_PROMPTS}"


@dataclass(frozen=True)
class RateSamples:
    """Raw samples of one measured throughput: per prompt, per repeat, tokens and wall seconds.

    Attributes:
        prompt_ids: the prompts, in measurement order.
        tokens: ``[prompt][repeat]`` new tokens.
        seconds: ``[prompt][repeat]`` wall seconds of the whole decode call.
    """

    prompt_ids: tuple[str, ...]
    tokens: tuple[tuple[float, ...], ...]
    seconds: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not (len(self.prompt_ids) == len(self.tokens) == len(self.seconds)) or not self.prompt_ids:
            raise ValueError("samples need the same number (>= 1) of prompt ids, token rows and second rows")
        if any(len(t) != len(s) or not s for t, s in zip(self.tokens, self.seconds)):
            raise ValueError("every prompt needs as many token as second samples (>= 1)")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RateSamples:
        """Read back :meth:`to_json` (a stored measured run's ``samples``)."""
        return cls(tuple(str(i) for i in obj["prompt_ids"]),
                   tuple(tuple(float(x) for x in row) for row in obj["tokens"]),
                   tuple(tuple(float(x) for x in row) for row in obj["seconds"]))

    def to_json(self) -> dict[str, Any]:
        """Plain lists, for the database."""
        return {"prompt_ids": list(self.prompt_ids), "tokens": [list(r) for r in self.tokens],
                "seconds": [list(r) for r in self.seconds]}

    @property
    def tokens_per_s(self) -> float:
        """Σ_p median tokens / Σ_p median seconds (the point estimate the CI is about)."""
        tok = sum(statistics.median(t) for t in self.tokens)
        sec = sum(statistics.median(s) for s in self.seconds)
        return tok / sec if sec > 0 else 0.0


def bounds(ci: tuple[float, float] | None) -> tuple[float, float]:
    """``ci``, or (NaN, NaN) where there is none: for benchmark reports that print or store both bounds."""
    return (float("nan"), float("nan")) if ci is None else ci


def _as_samples(x: Any) -> RateSamples:
    """A :class:`RateSamples` from itself, a stored dict, or an object with a ``samples`` attribute."""
    if isinstance(x, RateSamples):
        return x
    if isinstance(x, Mapping):
        return RateSamples.from_json(x)
    inner = getattr(x, "samples", None)
    if inner is None:
        raise TypeError(f"{type(x).__name__} carries no per-prompt samples")
    return _as_samples(inner)


# --------------------------------------------------------------------------- the bootstrap
#
# One routine serves every CI. The unit resampled is the prompt (a cluster: its repeats, requests or
# gaps travel with it), because prompts differ far more from each other than one prompt's repeats do.
# scipy.stats.bootstrap(method="percentile") draws the same indices from the same generator
# (rng.integers(0, n, (B, n)), tests/core/test_stats.py checks it) but cannot express the throughput's second
# level (each drawn prompt's repeats resampled too), and its interval comes from scipy.stats.quantile,
# which differs from numpy's in the last bit; this routine keeps the stored CIs' numbers.

#: ``statistic(picked, rng) -> [B]``: ``picked`` ``[B, n]`` holds the units each resample drew.
Statistic = Callable[[np.ndarray, np.random.Generator], Any]


@dataclass(frozen=True)
class Bootstrap:
    """A statistic's bootstrap replicates and their percentile interval.

    Attributes:
        replicates: ``[B]`` the statistic on each resample.
        low, high: the ``confidence`` percentile interval of the replicates.
    """

    replicates: np.ndarray
    low: float
    high: float

    @property
    def interval(self) -> tuple[float, float]:
        return self.low, self.high


def bootstrap(statistic: Statistic, units: int, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
              seed: int = 0, point: float | None = None) -> Bootstrap:
    """Percentile bootstrap over ``units`` units (prompts) drawn with replacement.

    Args:
        statistic: ``statistic(picked, rng)`` with ``picked`` ``[resamples, units]`` (the units each resample
            drew) returns the ``[resamples]`` replicates; ``rng`` is the generator ``picked`` came from, for
            a statistic that resamples inside each unit too (a throughput's repeats).
        units: how many units there are (``picked`` indexes them).
        confidence: the interval's coverage (0.95).
        resamples: bootstrap resamples B.
        seed: the resampling seed (the same data gives the same CI).
        point: the statistic on the samples as measured (the value reported with this CI): the interval is
            widened to contain it where the percentiles alone would not (a statistic with a lumpy bootstrap
            distribution, such as a median over three repeats, can put 97.5 % of its replicates on one side
            of its own value); wider only, so its coverage can only grow.
    """
    rng = np.random.default_rng(seed)
    picked = rng.integers(0, units, size=(resamples, units))
    replicates = np.asarray(statistic(picked, rng), dtype=float)
    alpha = (1.0 - confidence) / 2
    low, high = (float(x) for x in np.quantile(replicates, [alpha, 1.0 - alpha]))
    if point is not None and np.isfinite(point):
        low, high = min(low, float(point)), max(high, float(point))
    return Bootstrap(replicates, low, high)


def _resampled_medians(values: np.ndarray, prompts: np.ndarray, repeats: np.ndarray) -> np.ndarray:
    """``[B, P]`` medians over resampled repeats of resampled prompts (``values`` is ``[P, R]``)."""
    picked = values[prompts[:, :, None], repeats]  # [B, P, R]
    return np.median(picked, axis=2)


def _repeats(prompts: np.ndarray, r: int, rng: np.random.Generator) -> np.ndarray:
    """``[B, P, R]`` repeats drawn with replacement inside each drawn prompt (the second level)."""
    return rng.integers(0, r, size=(*prompts.shape, r))


def _arrays(s: RateSamples) -> tuple[np.ndarray, np.ndarray]:
    r = min(len(row) for row in s.seconds)  # a ragged set keeps the repeats every prompt has
    return (np.array([row[:r] for row in s.tokens], dtype=float), np.array([row[:r] for row in s.seconds], dtype=float))


def tokens_per_s_ci(samples: Any, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                    seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap CI of a measured tokens/s: prompts, then repeats within a prompt.

    Args:
        samples: a :class:`RateSamples`, its stored dict, or an object with ``samples``.
        confidence: the interval's coverage (0.95).
        resamples: bootstrap resamples.
        seed: the resampling seed (the CI is reproducible).

    Returns:
        (low, high); None from fewer than :data:`MIN_CI_PROMPTS` prompts (:func:`ci_unavailable` says why).
    """
    s = _as_samples(samples)
    if ci_unavailable(len(s.prompt_ids)):
        return None
    tokens, seconds = _arrays(s)

    def rate(prompts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        repeats = _repeats(prompts, seconds.shape[1], rng)
        return _resampled_medians(tokens, prompts, repeats).sum(1) / _resampled_medians(seconds, prompts, repeats).sum(1)

    return bootstrap(rate, len(s.prompt_ids), confidence=confidence, resamples=resamples, seed=seed,
                     point=s.tokens_per_s).interval


@dataclass(frozen=True)
class Estimate:
    """A measured ratio and its 95 % CI from one estimator: the CI always contains ``value``.

    Attributes:
        value: the statistic on the samples as measured.
        ci: its paired bootstrap CI; None from fewer than :data:`MIN_CI_PROMPTS` prompts (``why`` says so).
    """

    value: float
    ci: tuple[float, float] | None
    why: str | None = None


def speedup_estimate(a: Any, b: Any, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                     seed: int = 0) -> Estimate:
    """Speedup of ``a`` over ``b`` measured on the same prompts and its paired bootstrap CI, one estimator.

    The statistic is (tokens/s of ``a``) ÷ (tokens/s of ``b``), each Σ_p median tokens ÷ Σ_p median seconds
    over prompts p (:attr:`RateSamples.tokens_per_s`, the rates printed beside it). Both were measured
    interleaved (repeat r of both in the same pass, prompt by prompt), so a pass the whole machine ran
    slower moves both medians alike, and one resample draws the same prompts and the same repeat indices
    for both: what they share (a prompt's length, a slow pass) cancels in the ratio instead of widening it.
    The point is that statistic on the samples as measured and the CI its bootstrap, so the CI contains
    it (a median of per-pass ratios as the point, beside a CI of per-prompt medians, did not: one
    disturbed pass moves the two apart; docs/architecture.md, Measurement rules).

    Args:
        a, b: :class:`RateSamples`, stored dicts, or objects with ``samples`` (e.g. two
            ``profiler.measure.Measurement`` of one ``measure_configs`` call).

    Raises:
        ValueError: the two were not measured on the same prompts.
    """
    sa, sb = _as_samples(a), _as_samples(b)
    if sa.prompt_ids != sb.prompt_ids:
        raise ValueError("a speedup needs two measurements of the same prompts in the same order")
    ta, xa = _arrays(sa)
    tb, xb = _arrays(sb)
    r = min(xa.shape[1], xb.shape[1])
    ta, xa, tb, xb = ta[:, :r], xa[:, :r], tb[:, :r], xb[:, :r]

    def ratio(prompts: np.ndarray, repeats: np.ndarray) -> np.ndarray:
        rate_a = _resampled_medians(ta, prompts, repeats).sum(1) / _resampled_medians(xa, prompts, repeats).sum(1)
        rate_b = _resampled_medians(tb, prompts, repeats).sum(1) / _resampled_medians(xb, prompts, repeats).sum(1)
        return rate_a / rate_b

    n = len(sa.prompt_ids)
    value = float(ratio(np.arange(n)[None], np.broadcast_to(np.arange(r), (1, n, r)))[0])  # as measured
    why = ci_unavailable(n)
    if why:
        return Estimate(value, None, why)
    boot = bootstrap(lambda prompts, rng: ratio(prompts, _repeats(prompts, r, rng)), n, confidence=confidence,
                     resamples=resamples, seed=seed, point=value)
    return Estimate(value, boot.interval)


def speedup_ci(a: Any, b: Any, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
               seed: int = 0) -> tuple[float, float] | None:
    """The CI of :func:`speedup_estimate` (None from fewer than :data:`MIN_CI_PROMPTS` prompts).

    Raises:
        ValueError: the two were not measured on the same prompts.
    """
    return speedup_estimate(a, b, confidence=confidence, resamples=resamples, seed=seed).ci
