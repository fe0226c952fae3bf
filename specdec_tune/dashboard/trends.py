"""Regression runs over time (``specdec-tune regress``): the Regression trends page and the verdicts
the Overview lists.

Reads the regression tables (schema revision 0004) through the regression readers of ``db``. Per run and benchmark:
tokens/s is the median over prompts of each prompt's new tokens ÷ its median decode seconds (the
per-prompt rate ``regress`` compares), with a percentile-bootstrap 95% CI over prompts; τ is new
tokens ÷ cycles; the model error is the stored ``model_error`` cell ((predicted − measured) ÷
measured). A database without the tables, or without any regression run, gives an empty
:class:`TrendsInfo` and the page says which command to run.
"""
from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specdec_tune.core.stats import bootstrap
from specdec_tune.db import Database, list_regress_runs, load_regress_benchmarks, load_regress_cells

FLAGGED = ("regression", "suspicious", "fail")
BOOTSTRAP_RESAMPLES = 1000


@dataclass(frozen=True)
class Verdict:
    """One (benchmark, metric) cell of a regression run.

    Attributes:
        benchmark: the suite's benchmark name.
        metric: ``tokens_per_s``, ``latency``, ``acceptance@i``, ``model_error``, ``correctness``.
        verdict: ``ok``, ``improved``, ``suspicious``, ``regression``, ``fail`` or ``no_verdict``.
        change: current ÷ baseline − 1 where a ratio was computed.
        change_ci: 95% CI of that change.
        p_value / q_value: the test's p-value and its Benjamini-Hochberg adjusted value.
        when: when the run finished.
        regress_run: the regression run's id.
        suite: the suite's name.
        reason: the stored explanation (or why no verdict was possible).
    """

    benchmark: str
    metric: str
    verdict: str
    change: float | None
    p_value: float | None
    when: dt.datetime | None
    regress_run: int
    reason: str = ""
    change_ci: tuple[float, float] | None = None
    q_value: float | None = None
    suite: str = ""


@dataclass(frozen=True)
class TrendPoint:
    """One benchmark's metric in one regression run (with its 95% CI where there is one)."""

    benchmark: str
    metric: str
    when: dt.datetime
    regress_run: int
    value: float
    ci: tuple[float, float] | None = None
    verdict: str = ""


@dataclass(frozen=True)
class TrendsInfo:
    runs: int
    points: tuple[TrendPoint, ...] = ()
    verdicts: tuple[Verdict, ...] = ()

    @property
    def benchmarks(self) -> tuple[str, ...]:
        return tuple(sorted({p.benchmark for p in self.points} | {v.benchmark for v in self.verdicts}))


def prompt_rates(samples: Sequence[dict]) -> list[float]:
    """Each prompt's tokens/s: new tokens ÷ the median of its repeats' decode seconds."""
    return [s["new_tokens"] / statistics.median(s["seconds"]) for s in samples
            if s.get("seconds") and s.get("new_tokens") and statistics.median(s["seconds"]) > 0]


def median_ci(values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float] | None:
    """Percentile-bootstrap 95% CI of the median (``None`` below 3 values)."""
    if len(values) < 3:
        return None
    x = np.asarray(values, dtype=float)
    return bootstrap(lambda picked, _: np.median(x[picked], axis=1), len(x), resamples=resamples, seed=seed).interval


def _change(effect: float | None) -> float | None:
    return None if effect is None else effect - 1.0


def load_trends(db: Database) -> TrendsInfo:
    """Regression runs, their metrics over time and their verdicts (empty until ``regress`` ran)."""
    runs = sorted(list_regress_runs(db, None, kind="run"), key=lambda r: r.id)
    points: list[TrendPoint] = []
    verdicts: list[Verdict] = []
    for run in runs:
        when = run.finished_at or run.started_at
        cells = load_regress_cells(db, run.id)
        for b in load_regress_benchmarks(db, run.id):
            rates = prompt_rates(b.samples)
            if rates:
                points.append(TrendPoint(b.name, "tokens_per_s", when, run.id, statistics.median(rates),
                                         median_ci(rates)))
            tokens = sum(int(s.get("new_tokens") or 0) for s in b.samples)
            cycles = sum(int(s.get("cycles") or 0) for s in b.samples)
            if cycles:
                points.append(TrendPoint(b.name, "tau", when, run.id, tokens / cycles))
        for c in cells:
            if c.metric == "model_error" and c.current_value is not None:
                points.append(TrendPoint(c.benchmark, "model_error", when, run.id, c.current_value, verdict=c.verdict))
            ci = (c.ci_low - 1.0, c.ci_high - 1.0) if c.ci_low is not None and c.ci_high is not None else None
            reason = c.explanation or str((c.details or {}).get("reason") or "")
            verdicts.append(Verdict(c.benchmark, c.metric, c.verdict, _change(c.effect), c.p_value, when, run.id,
                                    reason, ci, c.q_value, run.suite))
    flagged_at = {(v.regress_run, v.benchmark, "tokens_per_s") for v in verdicts if v.verdict in FLAGGED
                  and v.metric == "tokens_per_s"}
    points = [TrendPoint(p.benchmark, p.metric, p.when, p.regress_run, p.value, p.ci,
                         "flagged" if (p.regress_run, p.benchmark, p.metric) in flagged_at else p.verdict)
              for p in points]
    return TrendsInfo(runs=len(runs), points=tuple(points), verdicts=tuple(verdicts))


def flagged(info: TrendsInfo) -> tuple[Verdict, ...]:
    """The verdicts worth a reader's attention (regressions, suspicious changes, failures), newest first."""
    keep = [v for v in info.verdicts if v.verdict in FLAGGED]
    epoch = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return tuple(sorted(keep, key=lambda v: (v.when or epoch, v.regress_run), reverse=True))
