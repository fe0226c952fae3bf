"""Read helpers: each returns plain frozen dataclasses from :mod:`~specdec_tune.db._records`."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from specdec_tune.db import _models as m
from specdec_tune.db import _records as rec
from specdec_tune.db._connection import Database
from specdec_tune.db._records import record_from
from specdec_tune.db._session import session_scope
from specdec_tune.db._run_settings import RunSettings
from specdec_tune.core.errors import InputError, NotFoundError


def _hardware(h: m.Hardware) -> rec.HardwareRecord:
    return record_from(rec.HardwareRecord, h, extra=dict(h.extra or {}))


def _model(x: m.Model) -> rec.ModelRecord:
    return record_from(rec.ModelRecord, x, extra=dict(x.extra or {}))


def _run(r: m.ProfileRun) -> rec.RunRecord:
    workload = r.workload
    return rec.RunRecord(
        id=r.id, status=r.status, started_at=r.started_at, finished_at=r.finished_at,
        target=_model(r.target), hardware=_hardware(r.hardware),
        workload=None if workload is None else record_from(rec.WorkloadRecord, workload),
        drafts=tuple(rec.DraftRecord(name=d.name, model_id=d.model_id, role=d.role) for d in r.drafts),
        settings=RunSettings.from_json(r.settings, where=f"profile run {r.id}"), label=r.label, notes=r.notes,
        specdec_version=r.specdec_version, git_revision=r.git_revision,
    )  # fmt: skip


def _run_query():  # type: ignore[no-untyped-def]
    return select(m.ProfileRun).options(
        selectinload(m.ProfileRun.target),
        selectinload(m.ProfileRun.hardware),
        selectinload(m.ProfileRun.workload),
        selectinload(m.ProfileRun.drafts),
    )


def require_run(s: Session, db: Database, run_id: int) -> m.ProfileRun:
    """The profile run ``run_id`` in session ``s``.

    Raises:
        NotFoundError: ``no profile run with id 7 in sqlite:///specdec.db``.
    """
    run = s.get(m.ProfileRun, run_id)
    if run is None:
        raise NotFoundError(f"no profile run with id {run_id} in {db.display_url}")
    return run


def get_run(db: Database, run_id: int) -> rec.RunRecord:
    """Return one profile run.

    Raises:
        NotFoundError: ``no profile run with id 7 in sqlite:///specdec.db``.
    """
    with session_scope(db) as s:
        run = s.scalars(_run_query().where(m.ProfileRun.id == run_id)).one_or_none()
        if run is None:
            raise NotFoundError(f"no profile run with id {run_id} in {db.display_url}")
        return _run(run)


def list_runs(
    db: Database, *, status: str | None = None, target: str | None = None, limit: int | None = None
) -> list[rec.RunRecord]:
    """Profile runs, newest first, optionally filtered by status and target model name."""
    if status is not None and status not in rec.RUN_STATUSES:
        raise InputError(f"run status {status!r} is not valid; valid: {', '.join(rec.RUN_STATUSES)}")
    query = _run_query().order_by(m.ProfileRun.id.desc())
    if status is not None:
        query = query.where(m.ProfileRun.status == status)
    if target is not None:
        query = query.join(m.ProfileRun.target).where(m.Model.name == target)
    if limit is not None:
        query = query.limit(limit)
    with session_scope(db) as s:
        return [_run(r) for r in s.scalars(query)]


def list_models(db: Database) -> list[rec.ModelRecord]:
    """Every model row, in insertion order."""
    with session_scope(db) as s:
        return [_model(x) for x in s.scalars(select(m.Model).order_by(m.Model.id))]


def load_timings(
    db: Database,
    run_id: int,
    *,
    kind: str | None = None,
    draft: str | None = None,
    include_warmup: bool = False,
) -> list[rec.TimingRow]:
    """Raw timing samples of a run in insertion order (warm-up samples left out by default)."""
    t = m.TimingSample
    query = select(t.kind, t.k, t.batch_size, t.context_len, t.seconds, t.draft, t.warmup)
    query = query.where(t.run_id == run_id).order_by(t.id)
    if kind is not None:
        query = query.where(t.kind == kind)
    if draft is not None:
        query = query.where(t.draft == draft)
    if not include_warmup:
        query = query.where(t.warmup.is_(False))
    with session_scope(db) as s:
        require_run(s, db, run_id)
        return [rec.TimingRow(*row) for row in s.execute(query)]


def load_acceptance(
    db: Database, run_id: int, *, draft: str | None = None, mode: str | None = None
) -> list[rec.AcceptanceRecord]:
    """Acceptance records of a run in insertion order, optionally for one draft or mode."""
    a = m.Acceptance
    query = select(a).where(a.run_id == run_id).order_by(a.id)
    if draft is not None:
        query = query.where(a.draft == draft)
    if mode is not None:
        query = query.where(a.mode == mode)
    with session_scope(db) as s:
        require_run(s, db, run_id)
        return [
            record_from(
                rec.AcceptanceRecord, r, position_attempts=tuple(r.position_attempts),
                position_accepts=tuple(r.position_accepts), alpha=tuple(r.alpha), beta=tuple(r.beta),
                confidence_bins=dict(r.confidence_bins or {}),
                in_loop=None if r.in_loop is None else dict(r.in_loop),
                continuations=None if r.continuations is None else tuple(
                    (int(p), int(c), float(q), bool(ok)) for p, c, q, ok in r.continuations),
            )
            for r in s.scalars(query)
        ]


def load_traces(
    db: Database, run_id: int, draft: str, mode: str, *, temperature: float | None = None
) -> list[rec.TraceRow]:
    """Per-cycle traces of one draft and mode, in recording order (the threshold model input)."""
    t = m.AcceptanceTrace
    query = select(t.cycle_index, t.confidences, t.num_accepted, t.prompt_index, t.token_probs, t.target_probs)
    query = query.where(t.run_id == run_id, t.draft == draft, t.mode == mode).order_by(t.id)
    if temperature is not None:
        query = query.where(t.temperature == temperature)
    with session_scope(db) as s:
        require_run(s, db, run_id)
        return [
            rec.TraceRow(cycle_index=c, confidences=tuple(conf), num_accepted=n, prompt_index=p,
                         token_probs=None if tp is None else tuple(tp), target_probs=None if pp is None else tuple(pp))
            for c, conf, n, p, tp, pp in s.execute(query)
        ]


def list_measured(db: Database, run_id: int | None = None) -> list[rec.MeasuredRecord]:
    """Measured configurations, of one run or of all runs, in insertion order."""
    r = m.MeasuredRun
    query = select(r).order_by(r.id)
    with session_scope(db) as s:
        if run_id is not None:
            require_run(s, db, run_id)
            query = query.where(r.run_id == run_id)
        return [
            record_from(rec.MeasuredRecord, x, config=dict(x.config),
                        samples=None if x.samples is None else dict(x.samples),
                        latency=None if x.latency is None else dict(x.latency),
                        energy=None if x.energy is None else dict(x.energy))
            for x in s.scalars(query)
        ]


def load_telemetry(db: Database, run_id: int) -> list[rec.TelemetryRow]:
    """Telemetry samples of a run ordered by time."""
    t = m.Telemetry
    query = select(t.t, t.power_w, t.energy_j, t.memory_used_mb, t.sm_clock_mhz, t.utilization_pct)
    query = query.where(t.run_id == run_id).order_by(t.t, t.id)
    with session_scope(db) as s:
        require_run(s, db, run_id)
        return [rec.TelemetryRow(*row) for row in s.execute(query)]
