"""Regression runs over time (``specdec-tune regress``): the Regression trends page and the verdicts
the Overview lists.

The regression tables come with schema revision 0004; a database without them, or without any
regression run yet, gives an empty :class:`TrendsInfo` and the page says which command to run.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from specdec_tune.db import Database


@dataclass(frozen=True)
class Verdict:
    """One flagged (benchmark, metric) of a regression run.

    Attributes:
        benchmark: the suite's benchmark name.
        metric: ``tokens_per_s``, ``tau``, ``model_error``, ``correctness`` ...
        verdict: ``regression``, ``suspicious``, ``improvement``, ``ok`` or ``no verdict``.
        change: relative change of the metric (current ÷ baseline - 1), if one was computed.
        p_value: the test's p-value (after Benjamini-Hochberg where the run applied it).
        when: when the run finished.
        regress_run: the regression run's id.
        reason: the explanation the run stored (e.g. "slower because the draft got slower").
    """

    benchmark: str
    metric: str
    verdict: str
    change: float | None
    p_value: float | None
    when: dt.datetime | None
    regress_run: int
    reason: str = ""


@dataclass(frozen=True)
class TrendPoint:
    """One benchmark's metric in one regression run (with its CI where stored)."""

    benchmark: str
    metric: str
    when: dt.datetime
    regress_run: int
    value: float
    ci: tuple[float, float] | None = None


@dataclass(frozen=True)
class TrendsInfo:
    available: bool  # the database has the regression tables
    runs: int
    points: tuple[TrendPoint, ...] = ()
    verdicts: tuple[Verdict, ...] = ()

    @property
    def benchmarks(self) -> tuple[str, ...]:
        return tuple(sorted({p.benchmark for p in self.points} | {v.benchmark for v in self.verdicts}))


def load_trends(db: Database) -> TrendsInfo:
    """Regression runs, their metrics over time and their flagged changes (empty until ``regress`` ran)."""
    try:
        from specdec_tune.db import regress_reads  # type: ignore[attr-defined]  # added with revision 0004
    except ImportError:
        return TrendsInfo(available=False, runs=0)
    return regress_reads(db)  # pragma: no cover - replaced when the regression tables land


def flagged(info: TrendsInfo) -> tuple[Verdict, ...]:
    """The verdicts worth a reader's attention (everything but ``ok``), newest first."""
    keep = [v for v in info.verdicts if v.verdict != "ok"]
    epoch = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return tuple(sorted(keep, key=lambda v: v.when or epoch, reverse=True))
