"""Read helpers: each returns plain frozen dataclasses from :mod:`~specdec_tune.db.records`."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from specdec_tune.db import models as m
from specdec_tune.db.engine import Database
from specdec_tune.db.records import (
    RUN_STATUSES,
    AcceptanceRecord,
    DraftRecord,
    HardwareRecord,
    MeasuredRecord,
    ModelRecord,
    RunRecord,
    TelemetryRow,
    TimingRow,
    TraceRow,
    WorkloadRecord,
)
from specdec_tune.db.session import session_scope
from specdec_tune.errors import InputError, NotFoundError


def _hardware(h: m.Hardware) -> HardwareRecord:
    return HardwareRecord(
        id=h.id, device=h.device, device_name=h.device_name, device_count=h.device_count,
        memory_mb=h.memory_mb, driver_version=h.driver_version, cuda_version=h.cuda_version,
        torch_version=h.torch_version, transformers_version=h.transformers_version,
        hostname=h.hostname, extra=dict(h.extra or {}),
    )  # fmt: skip


def _model(x: m.Model) -> ModelRecord:
    return ModelRecord(
        id=x.id, name=x.name, revision=x.revision, num_parameters=x.num_parameters,
        num_layers=x.num_layers, dtype=x.dtype, vocab_size=x.vocab_size,
        tokenizer_hash=x.tokenizer_hash, extra=dict(x.extra or {}),
    )  # fmt: skip


def _run(r: m.ProfileRun) -> RunRecord:
    workload = r.workload
    return RunRecord(
        id=r.id, status=r.status, started_at=r.started_at, finished_at=r.finished_at,
        target=_model(r.target), hardware=_hardware(r.hardware),
        workload=None if workload is None else WorkloadRecord(
            id=workload.id, name=workload.name, content_hash=workload.content_hash,
            prompt_count=workload.prompt_count,
        ),
        drafts=tuple(DraftRecord(name=d.name, model_id=d.model_id, role=d.role) for d in r.drafts),
        settings=dict(r.settings or {}), label=r.label, notes=r.notes,
        specdec_version=r.specdec_version, git_revision=r.git_revision,
    )  # fmt: skip


def _run_query():  # type: ignore[no-untyped-def]
    return select(m.ProfileRun).options(
        selectinload(m.ProfileRun.target),
        selectinload(m.ProfileRun.hardware),
        selectinload(m.ProfileRun.workload),
        selectinload(m.ProfileRun.drafts),
    )


def _require_run(s: Session, db: Database, run_id: int) -> None:
    if s.get(m.ProfileRun, run_id) is None:
        raise NotFoundError(f"no profile run with id {run_id} in {db.display_url}")


def get_run(db: Database, run_id: int) -> RunRecord:
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
) -> list[RunRecord]:
    """Profile runs, newest first, optionally filtered by status and target model name."""
    if status is not None and status not in RUN_STATUSES:
        raise InputError(f"run status {status!r} is not valid; valid: {', '.join(RUN_STATUSES)}")
    query = _run_query().order_by(m.ProfileRun.id.desc())
    if status is not None:
        query = query.where(m.ProfileRun.status == status)
    if target is not None:
        query = query.join(m.ProfileRun.target).where(m.Model.name == target)
    if limit is not None:
        query = query.limit(limit)
    with session_scope(db) as s:
        return [_run(r) for r in s.scalars(query)]


def list_models(db: Database) -> list[ModelRecord]:
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
) -> list[TimingRow]:
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
        _require_run(s, db, run_id)
        return [TimingRow(*row) for row in s.execute(query)]


def load_acceptance(
    db: Database, run_id: int, *, draft: str | None = None, mode: str | None = None
) -> list[AcceptanceRecord]:
    """Acceptance records of a run in insertion order, optionally for one draft or mode."""
    a = m.Acceptance
    query = select(a).where(a.run_id == run_id).order_by(a.id)
    if draft is not None:
        query = query.where(a.draft == draft)
    if mode is not None:
        query = query.where(a.mode == mode)
    with session_scope(db) as s:
        _require_run(s, db, run_id)
        return [
            AcceptanceRecord(
                id=r.id,
                run_id=r.run_id,
                draft=r.draft,
                mode=r.mode,
                temperature=r.temperature,
                num_speculative=r.num_speculative,
                cycles=r.cycles,
                position_attempts=tuple(r.position_attempts),
                position_accepts=tuple(r.position_accepts),
                alpha=tuple(r.alpha),
                beta=tuple(r.beta),
                confidence_bins=dict(r.confidence_bins or {}),
                teacher_forced_tokens=r.teacher_forced_tokens,
                greedy_agreement=r.greedy_agreement,
                one_minus_tv=r.one_minus_tv,
            )  # fmt: skip
            for r in s.scalars(query)
        ]


def load_traces(
    db: Database, run_id: int, draft: str, mode: str, *, temperature: float | None = None
) -> list[TraceRow]:
    """Per-cycle traces of one draft and mode, in recording order (the threshold model input)."""
    t = m.AcceptanceTrace
    query = select(t.cycle_index, t.confidences, t.num_accepted, t.prompt_index)
    query = query.where(t.run_id == run_id, t.draft == draft, t.mode == mode).order_by(t.id)
    if temperature is not None:
        query = query.where(t.temperature == temperature)
    with session_scope(db) as s:
        _require_run(s, db, run_id)
        return [
            TraceRow(cycle_index=c, confidences=tuple(conf), num_accepted=n, prompt_index=p)
            for c, conf, n, p in s.execute(query)
        ]


def list_measured(db: Database, run_id: int | None = None) -> list[MeasuredRecord]:
    """Measured configurations, of one run or of all runs, in insertion order."""
    r = m.MeasuredRun
    query = select(r).order_by(r.id)
    with session_scope(db) as s:
        if run_id is not None:
            _require_run(s, db, run_id)
            query = query.where(r.run_id == run_id)
        return [
            MeasuredRecord(
                id=x.id,
                run_id=x.run_id,
                draft=x.draft,
                config=dict(x.config),
                measured_tokens_per_s=x.measured_tokens_per_s,
                predicted_tokens_per_s=x.predicted_tokens_per_s,
                measured_tau=x.measured_tau,
                predicted_tau=x.predicted_tau,
                seconds=x.seconds,
                new_tokens=x.new_tokens,
                created_at=x.created_at,
                ci_low=x.ci_low,
                ci_high=x.ci_high,
                samples=None if x.samples is None else dict(x.samples),
            )  # fmt: skip
            for x in s.scalars(query)
        ]


def load_telemetry(db: Database, run_id: int) -> list[TelemetryRow]:
    """Telemetry samples of a run ordered by time."""
    t = m.Telemetry
    query = select(t.t, t.power_w, t.energy_j, t.memory_used_mb, t.sm_clock_mhz, t.utilization_pct)
    query = query.where(t.run_id == run_id).order_by(t.t, t.id)
    with session_scope(db) as s:
        _require_run(s, db, run_id)
        return [TelemetryRow(*row) for row in s.execute(query)]
