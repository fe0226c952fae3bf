"""Write helpers: register hardware, models and workloads; create and finish runs; store samples.

Each helper runs in its own transaction and commits before it returns, so a profiler that stores
samples batch by batch keeps every finished batch when it is interrupted (it then calls
``finish_run(db, run_id, "interrupted")``). Registration of hardware, models and workloads lives in
:mod:`specdec_tune.db._catalog`, readers in :mod:`specdec_tune.db._reads`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any, TypeVar

from sqlalchemy import delete, insert

from specdec_tune.db import _models as m
from specdec_tune.db._catalog import get_or_create_hardware, get_or_create_model, get_or_create_workload
from specdec_tune.db._connection import Database
from specdec_tune.db._provenance import git_revision as _git_revision
from specdec_tune.db._provenance import specdec_version as _specdec_version
from specdec_tune.db._records import (
    FINISHED_STATUSES,
    MODES,
    TIMING_KINDS,
    DraftRecord,
    TelemetryRow,
    TimingRow,
    TraceRow,
)
from specdec_tune.db._reads import require_run
from specdec_tune.db._session import session_scope
from specdec_tune.db._run_settings import IdentityCheck, RunSettings
from specdec_tune.core.errors import InputError, NotFoundError

_CHUNK = 5000  # rows per executemany: bounded memory, still one transaction per call
_Row = TypeVar("_Row", TimingRow, TraceRow, TelemetryRow)

# Registration lives in _catalog.py; these names stay importable from here.
__all__ = [
    "add_acceptance", "add_measured_run", "add_run_draft", "add_telemetry", "add_timing_samples", "add_traces",
    "create_run", "delete_run", "finish_run", "get_or_create_hardware", "get_or_create_model",
    "get_or_create_workload", "set_prediction",
]  # fmt: skip

def _draft_record(draft: str | DraftRecord) -> DraftRecord:
    return DraftRecord(name=draft) if isinstance(draft, str) else draft


def create_run(
    db: Database,
    *,
    target_model_id: int,
    hardware_id: int,
    workload_id: int | None = None,
    drafts: Sequence[str | DraftRecord] = (),
    settings: RunSettings | Mapping[str, Any] | None = None,
    label: str | None = None,
    notes: str | None = None,
    specdec_version: str | None = None,
    git_revision: str | None = None,
) -> int:
    """Insert a profile run with status ``running`` and return its id.

    Args:
        db: An opened database.
        target_model_id: From :func:`get_or_create_model`.
        hardware_id: From :func:`get_or_create_hardware`.
        workload_id: From :func:`get_or_create_workload`, if the run used a prompt set.
        drafts: Draft names (model path / hub id, or ``"ngram"``) or :class:`DraftRecord`.
        settings: the run's settings (:class:`RunSettings`), or their JSON object as stored.
        label: Free text shown in listings (e.g. ``nightly``).
        notes: Free text.
        specdec_version: Defaults to the installed package version.
        git_revision: Defaults to the source checkout's ``git rev-parse HEAD`` if there is one.
    """
    with session_scope(db, write=True) as s:
        run = m.ProfileRun(
            target_model_id=target_model_id,
            hardware_id=hardware_id,
            workload_id=workload_id,
            settings=settings.to_json() if isinstance(settings, RunSettings) else dict(settings or {}),
            status="running",
            label=label,
            notes=notes,
            specdec_version=specdec_version or _specdec_version(),
            git_revision=git_revision or _git_revision(),
        )
        s.add(run)
        s.flush()
        for d in map(_draft_record, drafts):
            s.add(m.RunDraft(run_id=run.id, name=d.name, model_id=d.model_id, role=d.role))
        return run.id


def _add_for_run(db: Database, run_id: int, row: Any) -> int:
    """Insert one row that belongs to profile run ``run_id`` (which must exist); return its id."""
    with session_scope(db, write=True) as s:
        require_run(s, db, run_id)
        s.add(row)
        s.flush()
        return row.id


def add_run_draft(
    db: Database, run_id: int, name: str, model_id: int | None = None, role: str = "draft"
) -> None:
    """Register one more draft on an existing run (no-op if a draft of that name is there)."""
    with session_scope(db, write=True) as s:
        run = require_run(s, db, run_id)
        if all(d.name != name for d in run.drafts):
            s.add(m.RunDraft(run_id=run_id, name=name, model_id=model_id, role=role))


def record_identity_check(db: Database, run_id: int, check: IdentityCheck) -> None:
    """Store the check made at the end of profile run ``run_id`` in its settings (``RunSettings.identity_check``).

    Raises:
        NotFoundError: No such run.
    """
    with session_scope(db, write=True) as s:
        run = require_run(s, db, run_id)
        settings = RunSettings.from_json(run.settings, where=f"profile run {run_id}")
        run.settings = settings.model_copy(update={"identity_check": check}).to_json()


def finish_run(
    db: Database, run_id: int, status: str = "completed", notes: str | None = None
) -> None:
    """Mark a run ``completed``, ``interrupted`` or ``failed`` and stamp its end time.

    Raises:
        InputError: ``status`` is not a finished status.
        NotFoundError: No such run.
    """
    if status not in FINISHED_STATUSES:
        raise InputError(
            f"run status {status!r} is not valid; valid: {', '.join(FINISHED_STATUSES)}"
        )
    with session_scope(db, write=True) as s:
        run = require_run(s, db, run_id)
        run.status = status
        run.finished_at = m.utcnow()
        if notes is not None:
            run.notes = notes


def update_run_settings(db: Database, run_id: int, values: Mapping[str, Any]) -> None:
    """Merge ``values`` into a run's stored settings (validated as :class:`RunSettings`): what a run records
    about itself once it has measured, such as every model's CUDA-graph state after the run.

    Raises:
        NotFoundError: No such run.
        StorageError: a value of the wrong type for its field.
    """
    with session_scope(db, write=True) as s:
        run = require_run(s, db, run_id)
        run.settings = RunSettings.from_json({**(run.settings or {}), **values}, where=f"run {run_id}").to_json()


def delete_run(db: Database, run_id: int) -> None:
    """Delete a run and everything recorded under it (samples, traces, measurements, telemetry)."""
    with session_scope(db, write=True) as s:
        require_run(s, db, run_id)
        # Explicit deletes rather than relying on ON DELETE CASCADE, which SQLite applies only
        # when foreign keys are enabled on the connection.
        for table in (m.RunDraft, m.TimingSample, m.Acceptance, m.AcceptanceTrace, m.TreeTrace,
                      m.MeasuredRun, m.Telemetry):  # fmt: skip
            s.execute(delete(table).where(table.run_id == run_id))
        s.execute(delete(m.ProfileRun).where(m.ProfileRun.id == run_id))


def _finite(name: str, value: float, minimum: float | None = 0.0) -> float:
    value = float(value)
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        raise InputError(f"{name} must be a finite number >= {minimum}, got {value!r}")
    return value


def _as_row(cls: type[_Row], row: _Row | Mapping[str, Any]) -> _Row:
    if isinstance(row, cls):
        return row
    if isinstance(row, Mapping):
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(row) - names)
        if unknown:
            raise InputError(f"unknown {cls.__name__} field(s) {unknown}; valid: {sorted(names)}")
        return cls(**row)
    raise InputError(f"expected a {cls.__name__} or a mapping, got {type(row).__name__}")


def _bulk(db: Database, run_id: int, table: type[m.Base], rows: list[dict[str, Any]]) -> int:
    with session_scope(db, write=True) as s:
        require_run(s, db, run_id)
        for start in range(0, len(rows), _CHUNK):
            # Core insert (not the ORM one): plain executemany, faster for bulk raw samples.
            s.execute(insert(table.__table__), rows[start : start + _CHUNK])
    return len(rows)


def add_timing_samples(
    db: Database, run_id: int, rows: Iterable[TimingRow | Mapping[str, Any]]
) -> int:
    """Store raw timing samples in one transaction; return how many.

    Raises:
        InputError: A row has an unknown kind, a non-positive k or batch size, or a bad time.
    """
    out = []
    for row in (_as_row(TimingRow, r) for r in rows):
        if row.kind not in TIMING_KINDS:
            raise InputError(
                f"timing kind {row.kind!r} is not valid; valid: {', '.join(TIMING_KINDS)}"
            )
        if row.k < 1 or row.batch_size < 1 or row.context_len < 0:
            raise InputError(
                f"timing sample needs k >= 1, batch_size >= 1, context_len >= 0: {row}"
            )
        values = {
            "run_id": run_id, "draft": row.draft, "kind": row.kind, "k": int(row.k),
            "batch_size": int(row.batch_size), "context_len": int(row.context_len),
            "seconds": _finite("seconds", row.seconds), "warmup": bool(row.warmup),
        }  # fmt: skip
        out.append(values)
    return _bulk(db, run_id, m.TimingSample, out)


def add_acceptance(
    db: Database,
    run_id: int,
    *,
    draft: str,
    mode: str,
    temperature: float,
    num_speculative: int,
    cycles: int,
    position_attempts: Sequence[int],
    position_accepts: Sequence[int],
    alpha: Sequence[float | None],
    beta: Sequence[float | None],
    confidence_bins: Mapping[str, Any] | None = None,
    teacher_forced_tokens: int | None = None,
    greedy_agreement: float | None = None,
    one_minus_tv: float | None = None,
    in_loop: Mapping[str, Any] | None = None,
    continuations: Sequence[Sequence[Any]] | None = None,
    tv_temperature: float | None = None,
) -> int:
    """Store the aggregated acceptance statistics of one draft and mode; return the row id.

    The four per-position lists must have equal lengths (≤ ``num_speculative``). A record from a
    teacher-forced pass only may have ``cycles == 0`` and empty lists. ``confidence_bins`` is the
    confidence histogram; ``in_loop``, ``continuations`` and ``tv_temperature`` are described on
    :class:`~specdec_tune.db.records.AcceptanceRecord`.
    """
    if mode not in MODES:
        raise InputError(f"acceptance mode {mode!r} is not valid; valid: {', '.join(MODES)}")
    lengths = {len(position_attempts), len(position_accepts), len(alpha), len(beta)}
    if len(lengths) != 1 or max(lengths) > num_speculative:
        raise InputError(
            f"per-position lists must have one length <= num_speculative={num_speculative}; got "
            f"attempts {len(position_attempts)}, accepts {len(position_accepts)}, "
            f"alpha {len(alpha)}, beta {len(beta)}"
        )
    row = m.Acceptance(
        run_id=run_id, draft=draft, mode=mode, temperature=_finite("temperature", temperature),
        num_speculative=int(num_speculative), cycles=int(cycles),
        position_attempts=[int(v) for v in position_attempts],
        position_accepts=[int(v) for v in position_accepts],
        alpha=[None if v is None else float(v) for v in alpha],
        beta=[None if v is None else float(v) for v in beta],
        confidence_bins=dict(confidence_bins or {}), teacher_forced_tokens=teacher_forced_tokens,
        greedy_agreement=greedy_agreement, one_minus_tv=one_minus_tv,
        in_loop=None if in_loop is None else dict(in_loop),
        continuations=None if continuations is None else [[int(p), int(c), float(q), bool(ok)]
                                                          for p, c, q, ok in continuations],
        tv_temperature=tv_temperature,
    )  # fmt: skip
    return _add_for_run(db, run_id, row)


def add_traces(
    db: Database,
    run_id: int,
    draft: str,
    mode: str,
    temperature: float,
    rows: Iterable[TraceRow | Mapping[str, Any]],
) -> int:
    """Store per-cycle acceptance traces (recorded with θ = 0, N = N_max); return how many."""
    if mode not in MODES:
        raise InputError(f"trace mode {mode!r} is not valid; valid: {', '.join(MODES)}")
    temperature = _finite("temperature", temperature)
    out = []
    for row in (_as_row(TraceRow, r) for r in rows):
        confidences = [float(c) for c in row.confidences]
        if not 0 <= row.num_accepted <= len(confidences):
            raise InputError(
                f"trace cycle {row.cycle_index}: num_accepted={row.num_accepted} must be within "
                f"0..{len(confidences)} (the number of drafted tokens)"
            )
        token_probs, target_probs = (None if x is None else [float(c) for c in x]
                                     for x in (row.token_probs, row.target_probs))
        for name, xs in (("token", token_probs), ("target", target_probs)):
            if xs is not None and len(xs) != len(confidences):
                raise InputError(f"trace cycle {row.cycle_index}: {len(xs)} {name} probabilities for "
                                 f"{len(confidences)} drafted tokens")
        out.append(dict(
            run_id=run_id, draft=draft, mode=mode, temperature=temperature,
            cycle_index=int(row.cycle_index), prompt_index=row.prompt_index,
            confidences=confidences, num_accepted=int(row.num_accepted), token_probs=token_probs,
            target_probs=target_probs,
        ))  # fmt: skip
    return _bulk(db, run_id, m.AcceptanceTrace, out)


def add_measured_run(
    db: Database,
    run_id: int,
    *,
    draft: str | None,
    config: Mapping[str, Any],
    measured_tokens_per_s: float,
    seconds: float,
    new_tokens: int,
    predicted_tokens_per_s: float | None = None,
    measured_tau: float | None = None,
    predicted_tau: float | None = None,
    ci: tuple[float, float] | None = None,
    samples: Mapping[str, Any] | None = None,
    operator: Mapping[str, Any] | None = None,
) -> int:
    """Store one end-to-end measurement (``draft=None``: autoregressive baseline); return its id.

    ``config`` holds the configuration measured: N, threshold, schedule, batch_size, temperature.
    ``ci`` is the 95% confidence interval of ``measured_tokens_per_s`` and ``samples`` the raw
    per-prompt, per-repeat tokens and seconds it was computed from (so it can be recomputed).
    ``operator`` holds revision 0005's columns (latency, energy, cost, memory; :data:`OPERATOR_COLUMNS`).
    """
    lo, hi = (None, None) if ci is None else (_finite("ci_low", ci[0]), _finite("ci_high", ci[1]))
    if lo is not None and hi is not None and lo > hi:
        raise InputError(f"ci_low {lo} > ci_high {hi}")
    row = m.MeasuredRun(
        run_id=run_id, draft=draft, config=dict(config),
        measured_tokens_per_s=_finite("measured_tokens_per_s", measured_tokens_per_s),
        predicted_tokens_per_s=predicted_tokens_per_s, measured_tau=measured_tau,
        predicted_tau=predicted_tau, seconds=_finite("seconds", seconds),
        new_tokens=int(new_tokens), ci_low=lo, ci_high=hi,
        samples=None if samples is None else dict(samples), **_operator(operator),
    )  # fmt: skip
    return _add_for_run(db, run_id, row)


# Revision 0005's columns of a measured run: the measured ones, then what the tuner predicts beside them.
OPERATOR_COLUMNS = ("ttft_p50_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "latency", "energy_j", "joules_per_token",
                    "energy", "gpu_price_usd_per_hour", "usd_per_million_tokens", "peak_memory_bytes")
PREDICTED_COLUMNS = ("predicted_tpot_p50_s", "predicted_tpot_p90_s", "predicted_memory_bytes")


def _operator(values: Mapping[str, Any] | None, allowed: Sequence[str] = OPERATOR_COLUMNS) -> dict[str, Any]:
    """Checked revision-0005 values: known names, finite non-negative numbers, JSON without NaN."""
    from specdec_tune.core.jsonsafe import finite

    out: dict[str, Any] = {}
    for name, value in (values or {}).items():
        if name not in allowed:
            raise InputError(f"unknown measured-run column {name!r}; known: {', '.join(allowed)}")
        if value is None or isinstance(value, Mapping):
            out[name] = None if value is None else finite(dict(value))
        else:
            out[name] = _finite(name, float(value))
    return out


def set_prediction(
    db: Database, measured_id: int, *, predicted_tokens_per_s: float | None, predicted_tau: float | None,
    extra: Mapping[str, Any] | None = None, predicted: Mapping[str, Any] | None = None,
) -> None:
    """Store the tuner's prediction next to a measured run (the profiler stores only what it measured).

    ``extra`` is merged into the run's ``config`` (for instance the prediction's source);
    ``predicted`` sets revision 0005's predicted columns (:data:`PREDICTED_COLUMNS`).
    """
    columns = _operator(predicted, PREDICTED_COLUMNS)
    with session_scope(db, write=True) as s:
        row = s.get(m.MeasuredRun, measured_id)
        if row is None:
            raise NotFoundError(f"no measured run {measured_id}")
        row.predicted_tokens_per_s = predicted_tokens_per_s
        row.predicted_tau = predicted_tau
        for name, value in columns.items():
            setattr(row, name, value)
        if extra:
            row.config = {**row.config, **dict(extra)}


def add_telemetry(
    db: Database, run_id: int, rows: Iterable[TelemetryRow | Mapping[str, Any]]
) -> int:
    """Store device telemetry samples; return how many."""
    out = []
    for row in (_as_row(TelemetryRow, r) for r in rows):
        values = asdict(row)
        values.update(run_id=run_id, t=_finite("t", row.t, minimum=None))
        out.append(values)
    return _bulk(db, run_id, m.Telemetry, out)
