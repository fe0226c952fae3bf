"""Write helpers: register hardware, models and workloads; create and finish runs; store samples.

Each helper runs in its own transaction and commits before it returns, so a profiler that stores
samples batch by batch keeps every finished batch when it is interrupted (it then calls
``finish_run(db, run_id, "interrupted")``). Readers live in :mod:`specdec_tune.db.reads`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any, TypeVar

from sqlalchemy import delete, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from specdec_tune.db import models as m
from specdec_tune.db.engine import Database
from specdec_tune.db.provenance import git_revision as _git_revision
from specdec_tune.db.provenance import specdec_version as _specdec_version
from specdec_tune.db.records import (
    FINISHED_STATUSES,
    MODES,
    TIMING_KINDS,
    DraftRecord,
    TelemetryRow,
    TimingRow,
    TraceRow,
)
from specdec_tune.db.session import session_scope
from specdec_tune.errors import InputError, NotFoundError

_CHUNK = 5000  # rows per executemany: bounded memory, still one transaction per call
_Row = TypeVar("_Row", TimingRow, TraceRow, TelemetryRow)

_HARDWARE_KEYS = (
    "device", "device_name", "device_count", "memory_mb", "driver_version", "cuda_version",
    "torch_version", "transformers_version", "hostname", "extra",
)  # fmt: skip
_MODEL_KEYS = (
    "name", "revision", "num_parameters", "num_layers", "dtype", "vocab_size", "tokenizer_hash",
    "extra",
)  # fmt: skip
_WORKLOAD_KEYS = ("name", "content_hash", "prompt_count")


def _fingerprint(values: Mapping[str, Any]) -> str:
    canonical = json.dumps(values, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _checked(
    info: Mapping[str, Any], keys: Sequence[str], required: Sequence[str], what: str
) -> dict:
    unknown = sorted(set(info) - set(keys))
    if unknown:
        raise InputError(f"unknown {what} field(s) {unknown}; valid: {', '.join(keys)}")
    missing = [k for k in required if info.get(k) in (None, "")]
    if missing:
        raise InputError(f"{what} info needs {', '.join(missing)} (got {dict(info)!r})")
    values = {k: info.get(k) for k in keys}
    if "extra" in values:
        values["extra"] = dict(values["extra"] or {})
    return values


def _get_or_create(db: Database, cls: type[m.Base], values: dict[str, Any]) -> int:
    fingerprint = _fingerprint(values)
    query = select(cls.id).where(cls.fingerprint == fingerprint)  # type: ignore[attr-defined]
    with session_scope(db, write=True) as s:
        existing = s.scalar(query)
        if existing is not None:
            return existing
        row = cls(fingerprint=fingerprint, **values)
        try:
            with s.begin_nested():  # another process may insert the same row concurrently
                s.add(row)
        except IntegrityError:
            found = s.scalar(query)
            if found is None:
                raise
            return found
        return row.id


def get_or_create_hardware(db: Database, info: Mapping[str, Any]) -> int:
    """Return the id of the hardware row equal to ``info``, inserting it if new.

    Args:
        db: An opened database.
        info: ``device`` ("cuda"/"cpu") and ``device_name`` (GPU or CPU model) are required;
            optional: device_count, memory_mb, driver_version, cuda_version, torch_version,
            transformers_version, hostname, extra (a JSON dict).
    """
    values = _checked(info, _HARDWARE_KEYS, ("device", "device_name"), "hardware")
    # Normalise numbers so that 8192 and 8192.0 do not give two rows for one machine.
    values["device_count"] = int(values["device_count"] or 1)
    if values["memory_mb"] is not None:
        values["memory_mb"] = float(values["memory_mb"])
    return _get_or_create(db, m.Hardware, values)


def get_or_create_model(db: Database, info: Mapping[str, Any]) -> int:
    """Return the id of the model equal to ``info`` (``name``: path or hub id), inserting it if new.

    Optional keys: revision, num_parameters, num_layers, dtype, vocab_size, tokenizer_hash, extra.
    A retrained model at the same path differs in parameters or tokenizer hash and gets a new row.
    """
    values = _checked(info, _MODEL_KEYS, ("name",), "model")
    for key in ("num_parameters", "num_layers", "vocab_size"):
        if values[key] is not None:
            values[key] = int(values[key])
    return _get_or_create(db, m.Model, values)


def get_or_create_workload(db: Database, info: Mapping[str, Any]) -> int:
    """Return the id of the workload with this ``name``, ``content_hash`` and ``prompt_count``."""
    values = _checked(info, _WORKLOAD_KEYS, _WORKLOAD_KEYS, "workload")
    values["prompt_count"] = int(values["prompt_count"])
    if values["prompt_count"] < 0:
        raise InputError(f"workload prompt_count must be >= 0, got {values['prompt_count']!r}")
    return _get_or_create(db, m.Workload, values)


def _draft_record(draft: str | DraftRecord) -> DraftRecord:
    return DraftRecord(name=draft) if isinstance(draft, str) else draft


def create_run(
    db: Database,
    *,
    target_model_id: int,
    hardware_id: int,
    workload_id: int | None = None,
    drafts: Sequence[str | DraftRecord] = (),
    settings: Mapping[str, Any] | None = None,
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
        settings: JSON-serialisable run settings (N_max, temperatures, repeats, dtype, ...).
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
            settings=dict(settings or {}),
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


def _require_run(s: Session, db: Database, run_id: int) -> m.ProfileRun:
    run = s.get(m.ProfileRun, run_id)
    if run is None:
        raise NotFoundError(f"no profile run with id {run_id} in {db.display_url}")
    return run

def _add_for_run(db: Database, run_id: int, row: Any) -> int:
    """Insert one row that belongs to profile run ``run_id`` (which must exist); return its id."""
    with session_scope(db, write=True) as s:
        _require_run(s, db, run_id)
        s.add(row)
        s.flush()
        return row.id



def add_run_draft(
    db: Database, run_id: int, name: str, model_id: int | None = None, role: str = "draft"
) -> None:
    """Register one more draft on an existing run (no-op if a draft of that name is there)."""
    with session_scope(db, write=True) as s:
        run = _require_run(s, db, run_id)
        if all(d.name != name for d in run.drafts):
            s.add(m.RunDraft(run_id=run_id, name=name, model_id=model_id, role=role))


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
        run = _require_run(s, db, run_id)
        run.status = status
        run.finished_at = m.utcnow()
        if notes is not None:
            run.notes = notes


def delete_run(db: Database, run_id: int) -> None:
    """Delete a run and everything recorded under it (samples, traces, measurements, telemetry)."""
    with session_scope(db, write=True) as s:
        _require_run(s, db, run_id)
        # Explicit deletes rather than relying on ON DELETE CASCADE, which SQLite applies only
        # when foreign keys are enabled on the connection.
        for table in (m.RunDraft, m.TimingSample, m.Acceptance, m.AcceptanceTrace,
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
        _require_run(s, db, run_id)
        for start in range(0, len(rows), _CHUNK):
            # Core insert (not the ORM one): plain executemany, ~30% faster for raw samples.
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
) -> int:
    """Store the aggregated acceptance statistics of one draft and mode; return the row id.

    The four per-position lists must have equal lengths (≤ ``num_speculative``). A record from a
    teacher-forced pass only may have ``cycles == 0`` and empty lists.
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
        out.append(dict(
            run_id=run_id, draft=draft, mode=mode, temperature=temperature,
            cycle_index=int(row.cycle_index), prompt_index=row.prompt_index,
            confidences=confidences, num_accepted=int(row.num_accepted),
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
) -> int:
    """Store one end-to-end measurement (``draft=None``: autoregressive baseline); return its id.

    ``config`` holds the configuration measured: N, threshold, schedule, batch_size, temperature.
    ``ci`` is the 95% confidence interval of ``measured_tokens_per_s`` and ``samples`` the raw
    per-prompt, per-repeat tokens and seconds it was computed from (so it can be recomputed).
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
        samples=None if samples is None else dict(samples),
    )  # fmt: skip
    return _add_for_run(db, run_id, row)


def set_prediction(
    db: Database, measured_id: int, *, predicted_tokens_per_s: float | None, predicted_tau: float | None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Store the tuner's prediction next to a measured run (the profiler stores only what it measured).

    ``extra`` is merged into the run's ``config`` (for instance the prediction's source).
    """
    with session_scope(db, write=True) as s:
        row = s.get(m.MeasuredRun, measured_id)
        if row is None:
            raise NotFoundError(f"no measured run {measured_id}")
        row.predicted_tokens_per_s = predicted_tokens_per_s
        row.predicted_tau = predicted_tau
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
