"""Per-request latency as serving benchmarks define it, latency SLOs and goodput: one definition,
shared by what the profiler measures and what the tuner predicts (neither imports the other).

- **TTFT**: from the start of a request to its first token on the host.
- **TPOT** (time per output token): the decode window only, ``(t_last - t_first) / (n - 1)``, the
  first token excluded, as vLLM's ``benchmark_serving`` computes it. Under speculation tokens arrive in
  bursts (a cycle emits τ tokens at once), so the mean gap between *chunks* is not a time per token:
  vLLM #51454 measured the streaming inter-arrival "TPOT" 5.4× above the decode-window TPOT for
  5-token speculation, because it divides by chunks, not tokens.
- **inter-token gaps**: each token's gap since the previous token; a chunk of k tokens contributes its
  gap once and k - 1 zeros. The raw chunks (arrival time, tokens) are kept, so both views can be
  recomputed.
- **SLO**: ``--slo-tpot-ms`` / ``--slo-ttft-ms`` at a percentile (p99 by default): met when that
  percentile of the per-request values is within the bound.
- **goodput**: SmartSpec (Liu et al. 2024, "Optimizing Speculative Decoding for Serving Large Language
  Models Using Goodput", arXiv 2406.14066) defines goodput as the rate of *generated* tokens (accepted
  plus bonus) per second, the quantity its speculation length maximises. With an SLO, as in DistServe
  and the serving benchmarks (AIPerf, inference-perf), only requests that meet it count: goodput =
  tokens of the requests meeting every bound ÷ seconds of all requests. Without a bound it is the
  throughput.

Pure Python and numpy (docs/architecture.md, Rooms: shared modules import no room).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specdec_tune.core.stats import RESAMPLES, RateSamples, bootstrap, ci_unavailable

QUANTILES = (0.5, 0.9, 0.99)  # p50 / p90 / p99, what every latency report shows


@dataclass(frozen=True)
class RequestLatency:
    """When one request's tokens arrived.

    Attributes:
        times: ``[chunks]`` seconds from the request's start to each chunk's arrival on the host.
        tokens: ``[chunks]`` tokens in each chunk (a speculative cycle's emitted tokens, a server step's).
    """

    times: tuple[float, ...]
    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.times) != len(self.tokens):
            raise ValueError(f"a request needs one token count per arrival, got {len(self.times)} and {len(self.tokens)}")
        if any(n < 0 for n in self.tokens) or any(b < a for a, b in zip(self.times, self.times[1:])):
            raise ValueError("arrivals must be in time order with non-negative token counts")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RequestLatency:
        return cls(tuple(float(t) for t in obj["t"]), tuple(int(n) for n in obj["n"]))

    def to_json(self) -> dict[str, Any]:
        return {"t": list(self.times), "n": list(self.tokens)}

    @property
    def new_tokens(self) -> int:
        return sum(self.tokens)

    def _arrived(self) -> list[tuple[float, int]]:
        return [(t, n) for t, n in zip(self.times, self.tokens) if n > 0]

    @property
    def ttft_s(self) -> float | None:
        """Seconds to the first token (None: no token)."""
        arrived = self._arrived()
        return arrived[0][0] if arrived else None

    @property
    def tpot_s(self) -> float | None:
        """Decode-window seconds per output token, first token excluded (None: fewer than 2 tokens)."""
        arrived = self._arrived()
        n = self.new_tokens
        if n < 2:
            return None
        return (arrived[-1][0] - arrived[0][0]) / (n - 1)

    def token_gaps(self) -> list[float]:
        """Each token's gap since the previous token, after the first (a burst of k: one gap, k - 1 zeros)."""
        arrived = self._arrived()
        gaps: list[float] = [0.0] * (arrived[0][1] - 1) if arrived else []
        for (t0, _), (t1, n) in zip(arrived, arrived[1:]):
            gaps += [t1 - t0] + [0.0] * (n - 1)
        return gaps

    def chunk_gaps(self) -> list[float]:
        """Gaps between consecutive chunks (what a streaming client's inter-token latency measures)."""
        arrived = self._arrived()
        return [t1 - t0 for (t0, _), (t1, _) in zip(arrived, arrived[1:])]


@dataclass(frozen=True)
class Slo:
    """A latency objective: per-request TPOT and/or TTFT bounds, met at ``percentile``.

    Attributes:
        tpot_ms: the bound on a request's TPOT (None: no bound).
        ttft_ms: the bound on a request's TTFT (None: no bound).
        percentile: the share of requests (in %) that must meet the bounds (99: a p99 SLO).
    """

    tpot_ms: float | None = None
    ttft_ms: float | None = None
    percentile: float = 99.0

    def __post_init__(self) -> None:
        for flag, v in (("--slo-tpot-ms", self.tpot_ms), ("--slo-ttft-ms", self.ttft_ms)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"{flag} must be a positive number of milliseconds, got {v!r}")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"--slo-percentile must lie in (0, 100], got {self.percentile!r}")

    @property
    def active(self) -> bool:
        return self.tpot_ms is not None or self.ttft_ms is not None

    def meets(self, ttft_s: float | None, tpot_s: float | None) -> bool:
        """Whether one request meets every bound (a request without a TPOT meets a TPOT bound)."""
        if self.tpot_ms is not None and tpot_s is not None and tpot_s * 1000.0 > self.tpot_ms:
            return False
        return not (self.ttft_ms is not None and (ttft_s is None or ttft_s * 1000.0 > self.ttft_ms))

    def describe(self) -> str:
        parts = [f"TPOT <= {self.tpot_ms:g} ms" if self.tpot_ms is not None else "",
                 f"TTFT <= {self.ttft_ms:g} ms" if self.ttft_ms is not None else ""]
        bounds = " and ".join(p for p in parts if p)
        return f"p{self.percentile:g} {bounds}" if bounds else "no latency SLO"

    def to_dict(self) -> dict[str, Any]:
        return {"tpot_ms": self.tpot_ms, "ttft_ms": self.ttft_ms, "percentile": self.percentile}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Slo:
        d = d or {}
        return cls(d.get("tpot_ms"), d.get("ttft_ms"), float(d.get("percentile", 99.0)))


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` in [0, 1] (numpy's default, what the reports use); NaN if empty."""
    return float(np.quantile(np.asarray(values, dtype=float), q)) if len(values) else math.nan


def slo_met(slo: Slo, ttft_s: Sequence[float], tpot_s: Sequence[float]) -> bool | None:
    """Whether the ``slo.percentile`` quantile of per-request TTFT and TPOT is within the bounds
    (None: no bound)."""
    if not slo.active:
        return None
    q = slo.percentile / 100.0
    if slo.tpot_ms is not None and tpot_s and quantile(tpot_s, q) * 1000.0 > slo.tpot_ms:
        return False
    return not (slo.ttft_ms is not None and ttft_s and quantile(ttft_s, q) * 1000.0 > slo.ttft_ms)


# --------------------------------------------------------------------------- measured samples and their CIs
#
# A prompt's TTFT or TPOT is the median of its repeats (robust to a load burst, as its throughput is);
# a percentile is taken over prompts, and its CI is a percentile bootstrap over prompts (each keeping
# its median). Resampling a prompt's few repeats too, as a throughput's CI does (specdec_tune.core.stats),
# skews a median of right-skewed timings upward: measured here, a p90 whose whole interval lay above
# the point estimate. Gaps are pooled over requests, and their CI resamples prompts too (each with every
# gap of its repeats): the repeats of a prompt decode the same tokens, so they are one cluster, not
# several. A prompt without a value (a request of one token has no TPOT and no gap; one whose tokens came
# in one chunk has no chunk gap) is not an observation of the statistic, so the bootstrap resamples the
# prompts that have one; with fewer than two of those there is no CI (stats.ci_unavailable), and with
# none no value: each entry then says why.


@dataclass(frozen=True)
class LatencySamples:
    """Every request of one measured configuration: ``requests[prompt][repeat]``."""

    prompt_ids: tuple[str, ...]
    requests: tuple[tuple[RequestLatency, ...], ...]

    def __post_init__(self) -> None:
        if len(self.prompt_ids) != len(self.requests) or not self.requests or any(not r for r in self.requests):
            raise ValueError("latency samples need >= 1 request per prompt and one row per prompt id")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> LatencySamples:
        return cls(tuple(str(p) for p in obj["prompt_ids"]),
                   tuple(tuple(RequestLatency.from_json(r) for r in row) for row in obj["requests"]))

    def to_json(self) -> dict[str, Any]:
        return {"prompt_ids": list(self.prompt_ids), "requests": [[r.to_json() for r in row] for row in self.requests]}

    def _matrix(self, metric: str) -> np.ndarray:
        """``[P, R]`` of ``metric`` (``ttft_s`` / ``tpot_s``) per request; NaN where undefined."""
        r = min(len(row) for row in self.requests)
        return np.array([[_nan(getattr(x, metric)) for x in row[:r]] for row in self.requests], dtype=float)

    def per_prompt(self, metric: str) -> list[float]:
        """Each prompt's median over its repeats (prompts where it is undefined left out)."""
        m = self._matrix(metric)
        with np.errstate(all="ignore"):
            med = np.nanmedian(np.where(np.isnan(m).all(axis=1, keepdims=True), 0.0, m), axis=1)
        return [float(v) for v, row in zip(med, m) if not np.isnan(row).all()]

    def token_gaps(self) -> list[float]:
        return [g for row in self.requests for x in row for g in x.token_gaps()]

    def chunk_gaps(self) -> list[float]:
        return [g for row in self.requests for x in row for g in x.chunk_gaps()]

    def mean_burst(self) -> float | None:
        """Tokens per chunk after the first token (τ as a client sees it); None without chunks."""
        sizes = [n for row in self.requests for x in row for n in x.tokens[1:] if n > 0]
        return statistics.fmean(sizes) if sizes else None


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _percentile_ci(medians: Sequence[float], prompts: int, q: float, resamples: int,
                   seed: int) -> tuple[float, tuple[float, float] | None, str | None]:
    """(point, 95% CI, why the CI is missing) of the ``q`` quantile over prompts of per-prompt ``medians`` (of
    ``prompts`` measured)."""
    if not medians:
        return math.nan, None, None
    values = np.asarray(medians, dtype=float)  # [P]
    point = float(np.quantile(values, q))
    why = ci_unavailable(len(values), prompts)
    if why:
        return point, None, why
    ci = bootstrap(lambda picked, _: np.quantile(values[picked], q, axis=1), len(values), resamples=resamples,
                   seed=seed)
    return point, ci.interval, None


def _pooled_ci(per_prompt: Sequence[Sequence[float]], q: float, resamples: int,
               seed: int) -> tuple[float, tuple[float, float] | None, str | None]:
    """(point, 95% CI, why the CI is missing) of a quantile of values pooled over prompts; a cluster bootstrap
    over the prompts that have values (the comment above)."""
    clusters = [np.asarray(row, dtype=float) for row in per_prompt if len(row)]
    if not clusters:
        return math.nan, None, None
    point = quantile(np.concatenate(clusters), q)
    why = ci_unavailable(len(clusters), len(per_prompt))
    if why:
        return point, None, why

    def pooled(picked: np.ndarray, _) -> list[float]:
        return [float(np.quantile(np.concatenate([clusters[i] for i in row]), q)) for row in picked]

    return point, bootstrap(pooled, len(clusters), resamples=resamples, seed=seed).interval, None


# Why a statistic has no value at all (no prompt had one).
_EMPTY = {
    "ttft_s": "no request emitted a token",
    "tpot_s": "no request emitted 2 or more tokens (TPOT is the decode window after the first token)",
    "token_gap_s": "no request emitted 2 or more tokens",
    "chunk_gap_s": "no request's tokens arrived in 2 or more chunks",
}


def latency_summary(samples: LatencySamples, *, quantiles: Sequence[float] = QUANTILES,
                    resamples: int = RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """p50/p90/p99 of TTFT, TPOT (per prompt, median of repeats) and inter-token gaps, each with its 95% CI.

    Returns:
        ``{"ttft_s"|"tpot_s"|"token_gap_s"|"chunk_gap_s": {"p50": {"value", "ci", "why"}, ...}, "mean_burst": τ,
        "prompts", "requests"}``; seconds throughout, labelled measured by the caller. ``value`` or ``ci`` is
        None where it cannot be computed (no request had the value; fewer than 2 prompts had it), and
        ``why`` says which (None where both are there).
    """
    out: dict[str, Any] = {}
    for name in ("ttft_s", "tpot_s"):
        medians = samples.per_prompt(name)
        out[name] = {_pname(q): _entry(*_percentile_ci(medians, len(samples.prompt_ids), q, resamples, seed),
                                       _EMPTY[name]) for q in quantiles}
    gap_resamples = min(resamples, 1000)  # pooled gaps: thousands of values per resample
    for name, gaps in (("token_gap_s", RequestLatency.token_gaps), ("chunk_gap_s", RequestLatency.chunk_gaps)):
        per_prompt = [[g for x in row for g in gaps(x)] for row in samples.requests]
        out[name] = {_pname(q): _entry(*_pooled_ci(per_prompt, q, gap_resamples, seed), _EMPTY[name])
                     for q in quantiles}
    out["mean_burst"] = samples.mean_burst()
    out["prompts"], out["requests"] = len(samples.prompt_ids), sum(len(row) for row in samples.requests)
    return out


def _pname(q: float) -> str:
    return f"p{q * 100:g}"


def _entry(value: float, ci: tuple[float, float] | None, why: str | None, empty: str) -> dict[str, Any]:
    missing = math.isnan(value)
    return {"value": None if missing else value, "ci": None if ci is None else list(ci),
            "why": empty if missing else why}


def good_samples(rates: RateSamples, latency: LatencySamples, slo: Slo) -> RateSamples:
    """``rates`` with the tokens of every request that misses ``slo`` set to 0: its tokens/s (and its
    bootstrap CI, ``stats.tokens_per_s_ci``) is the goodput, seconds of every request counted."""
    if rates.prompt_ids != latency.prompt_ids:
        raise ValueError("goodput needs the throughput and latency samples of the same prompts")
    tokens = tuple(tuple(t if i >= len(lat) or slo.meets(lat[i].ttft_s, lat[i].tpot_s) else 0.0
                         for i, t in enumerate(row)) for row, lat in zip(rates.tokens, latency.requests))
    return RateSamples(rates.prompt_ids, tokens, rates.seconds)


def attainment(slo: Slo, latency: LatencySamples) -> float:
    """Share of requests meeting every bound of ``slo``."""
    requests = [x for row in latency.requests for x in row]
    return sum(slo.meets(x.ttft_s, x.tpot_s) for x in requests) / len(requests)
