"""Queries for regression runs (``specdec-tune regress``): store and read runs, benchmarks, cells.

Every reader returns plain frozen dataclasses, so the dashboard's trend page and the regression
comparison read the same records::

    runs = list_regress_runs(db, suite="default")          # newest first
    cells = load_regress_cells(db, runs[0].id)
    trend = metric_trend(db, "default", "functions-1l", "tokens_per_s")
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from specdec_tune.db import _models as m
from specdec_tune.db._connection import Database
from specdec_tune.db._models import utcnow
from specdec_tune.db._records import field_values, record_from
from specdec_tune.db._session import session_scope
from specdec_tune.core.errors import NotFoundError

REGRESS_KINDS = ("run", "calibration")
REGRESS_VERDICTS = ("baseline", "pass", "suspicious", "regression", "no_verdict", "calibration")


@dataclass(frozen=True)
class RegressRunRecord:
    """A stored regression run."""

    id: int
    suite: str
    kind: str
    status: str
    verdict: str | None
    exit_code: int | None
    baseline_id: int | None
    fingerprint: dict[str, Any]
    summary: dict[str, Any]
    started_at: dt.datetime
    finished_at: dt.datetime | None


@dataclass(frozen=True)
class RegressBenchmarkRecord:
    """A benchmark of a run: resolved configuration and per-prompt samples (PromptSample JSON)."""

    run_id: int
    name: str
    config: dict[str, Any]
    samples: list[dict[str, Any]]


@dataclass(frozen=True)
class CellVerdict:
    """One (benchmark, metric) verdict of a regression comparison; ``effect`` is current / baseline.

    The regression room builds these (its ``Cell`` adds only derived properties); a stored one is a
    :class:`RegressCellRecord`.
    """

    benchmark: str
    metric: str
    verdict: str  # ok | improved | suspicious | regression | fail | no_verdict
    baseline_value: float | None = None
    current_value: float | None = None
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    q_value: float | None = None
    mdc: float | None = None
    explanation: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RegressCellRecord(CellVerdict):
    """A stored verdict: the :class:`CellVerdict` of regression run ``run_id``."""

    run_id: int


@dataclass(frozen=True)
class CalibrationRecord:
    """A metric's A/A noise floor from ``regress --calibrate``."""

    run_id: int
    suite: str
    benchmark: str
    metric: str
    runs: int
    spread: float | None
    max_abs_change: float | None
    mdc: float | None
    false_alarms: int


def _run_record(r: m.RegressRun) -> RegressRunRecord:
    return RegressRunRecord(r.id, r.suite, r.kind, r.status, r.verdict, r.exit_code, r.baseline_id,
                            dict(r.fingerprint or {}), dict(r.summary or {}), r.started_at, r.finished_at)


def create_regress_run(db: Database, suite: str, *, kind: str = "run", fingerprint: Mapping[str, Any]) -> int:
    """Start a regression run (status ``running``); return its id."""
    if kind not in REGRESS_KINDS:
        raise ValueError(f"kind={kind!r} must be one of {REGRESS_KINDS}")
    with session_scope(db, write=True) as s:
        row = m.RegressRun(suite=suite, kind=kind, status="running", fingerprint=dict(fingerprint), summary={})
        s.add(row)
        s.flush()
        return int(row.id)


def add_regress_benchmark(db: Database, run_id: int, name: str, config: Mapping[str, Any],
                          samples: Sequence[Mapping[str, Any]]) -> None:
    """Store one benchmark's configuration and raw per-prompt samples."""
    with session_scope(db, write=True) as s:
        s.add(m.RegressBenchmark(run_id=run_id, name=name, config=dict(config), samples=[dict(x) for x in samples]))


def add_regress_cells(db: Database, cells: Iterable[RegressCellRecord]) -> None:
    """Store the verdict cells of a run (one transaction)."""
    with session_scope(db, write=True) as s:
        for c in cells:
            s.add(m.RegressCell(**field_values(RegressCellRecord, c)))


def add_calibration(db: Database, rows: Iterable[CalibrationRecord]) -> None:
    """Store the A/A spreads of a calibration run."""
    with session_scope(db, write=True) as s:
        for c in rows:
            s.add(m.RegressCalibration(**field_values(CalibrationRecord, c)))


def finish_regress_run(db: Database, run_id: int, *, status: str, verdict: str | None, exit_code: int | None,
                       baseline_id: int | None = None, summary: Mapping[str, Any] | None = None) -> None:
    """Record how a regression run ended."""
    with session_scope(db, write=True) as s:
        row = s.get(m.RegressRun, run_id)
        if row is None:
            raise NotFoundError(f"no regression run {run_id}")
        row.status, row.verdict, row.exit_code = status, verdict, exit_code
        row.baseline_id, row.summary, row.finished_at = baseline_id, dict(summary or {}), utcnow()


def get_regress_run(db: Database, run_id: int) -> RegressRunRecord:
    """One regression run by id.

    Raises:
        NotFoundError: no such run.
    """
    with session_scope(db) as s:
        row = s.get(m.RegressRun, run_id)
        if row is None:
            raise NotFoundError(f"no regression run {run_id} in the database")
        return _run_record(row)


def list_regress_runs(db: Database, suite: str | None = None, *, kind: str | None = "run",
                      completed_only: bool = True, before: int | None = None) -> list[RegressRunRecord]:
    """Regression runs, newest first (optionally one suite, one kind, ids below ``before``)."""
    q = select(m.RegressRun).order_by(m.RegressRun.id.desc())
    if suite is not None:
        q = q.where(m.RegressRun.suite == suite)
    if kind is not None:
        q = q.where(m.RegressRun.kind == kind)
    if completed_only:
        q = q.where(m.RegressRun.status == "completed")
    if before is not None:
        q = q.where(m.RegressRun.id < before)
    with session_scope(db) as s:
        return [_run_record(r) for r in s.scalars(q)]


def load_regress_benchmarks(db: Database, run_id: int) -> list[RegressBenchmarkRecord]:
    """The benchmarks (configuration and samples) of one run."""
    q = select(m.RegressBenchmark).where(m.RegressBenchmark.run_id == run_id).order_by(m.RegressBenchmark.id)
    with session_scope(db) as s:
        return [RegressBenchmarkRecord(r.run_id, r.name, dict(r.config), list(r.samples)) for r in s.scalars(q)]


def _cell_record(r: m.RegressCell) -> RegressCellRecord:
    return record_from(RegressCellRecord, r)


def load_regress_cells(db: Database, run_id: int) -> list[RegressCellRecord]:
    """The verdict cells of one run."""
    q = select(m.RegressCell).where(m.RegressCell.run_id == run_id).order_by(m.RegressCell.id)
    with session_scope(db) as s:
        return [_cell_record(r) for r in s.scalars(q)]


def metric_trend(db: Database, suite: str, benchmark: str, metric: str) -> list[tuple[RegressRunRecord, RegressCellRecord]]:
    """One (benchmark, metric) across the suite's completed runs, oldest first (the trend page)."""
    q = (select(m.RegressRun, m.RegressCell).join(m.RegressCell, m.RegressCell.run_id == m.RegressRun.id)
         .where(m.RegressRun.suite == suite, m.RegressRun.status == "completed", m.RegressRun.kind == "run",
                m.RegressCell.benchmark == benchmark, m.RegressCell.metric == metric)
         .order_by(m.RegressRun.id))
    with session_scope(db) as s:
        return [(_run_record(r), _cell_record(c)) for r, c in s.execute(q)]


def latest_calibration(db: Database, suite: str) -> list[CalibrationRecord]:
    """The newest completed calibration of a suite (empty when none)."""
    runs = list_regress_runs(db, suite, kind="calibration")
    if not runs:
        return []
    q = select(m.RegressCalibration).where(m.RegressCalibration.run_id == runs[0].id)
    with session_scope(db) as s:
        return [record_from(CalibrationRecord, r) for r in s.scalars(q)]
