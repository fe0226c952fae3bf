"""SQLAlchemy 2 typed ORM of the results database (the schema at the newest Alembic revision).

The schema is owned by the Alembic scripts in ``db/migrations/versions``; this module must describe
the same tables (``tests/db/test_contract.py`` compares the two with Alembic's autogenerate, so a
column added here without a migration fails a test).

Words follow docs/architecture.md, Words: *draft* is a model path / hub id or the string ``"ngram"``;
``k`` is the number of new tokens in one target forward (``N + 1`` in a cycle); α_i is the
conditional and β_i the unconditional per-position acceptance rate.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

# Base and utcnow are the tables' too (db modules use m.Base, m.utcnow); Base.metadata holds every table once
# this module is imported.
from specdec_tune.db._base import Base, _Fingerprinted, utcnow


class Hardware(_Fingerprinted, Base):
    """One machine configuration: device, driver and library versions (unique by fingerprint)."""

    __tablename__ = "hardware"

    device: Mapped[str] = mapped_column(String(16))  # "cuda" | "cpu" | "mps" ...
    device_name: Mapped[str] = mapped_column(String(256))  # GPU or CPU model
    device_count: Mapped[int] = mapped_column(Integer, default=1)
    memory_mb: Mapped[float | None] = mapped_column(Float)
    driver_version: Mapped[str | None] = mapped_column(String(64))
    cuda_version: Mapped[str | None] = mapped_column(String(64))
    torch_version: Mapped[str | None] = mapped_column(String(64))
    transformers_version: Mapped[str | None] = mapped_column(String(64))
    hostname: Mapped[str | None] = mapped_column(String(256))
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Model(_Fingerprinted, Base):
    """A target or draft model: local path or hub id plus what identifies its weights."""

    __tablename__ = "models"

    name: Mapped[str] = mapped_column(String(512))  # local path or hub id
    revision: Mapped[str | None] = mapped_column(String(128))
    num_parameters: Mapped[int | None] = mapped_column(BigInteger)
    num_layers: Mapped[int | None] = mapped_column(Integer)
    dtype: Mapped[str | None] = mapped_column(String(32))
    vocab_size: Mapped[int | None] = mapped_column(Integer)
    tokenizer_hash: Mapped[str | None] = mapped_column(String(64))
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Workload(_Fingerprinted, Base):
    """A prompt set, identified by name and the hash of its content."""

    __tablename__ = "workloads"

    name: Mapped[str] = mapped_column(String(256))
    content_hash: Mapped[str] = mapped_column(String(64))
    prompt_count: Mapped[int] = mapped_column(Integer)


class ProfileRun(Base):
    """One invocation of the profiler (or of a measurement) for a target on one machine."""

    __tablename__ = "profile_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    label: Mapped[str | None] = mapped_column(String(256))
    target_model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    workload_id: Mapped[int | None] = mapped_column(ForeignKey("workloads.id"))
    hardware_id: Mapped[int] = mapped_column(ForeignKey("hardware.id"))
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16))  # running|completed|interrupted|failed
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column()
    notes: Mapped[str | None] = mapped_column(Text)
    # Added by revision 0002.
    specdec_version: Mapped[str | None] = mapped_column(String(64))
    git_revision: Mapped[str | None] = mapped_column(String(64))

    target: Mapped[Model] = relationship(foreign_keys=[target_model_id])
    workload: Mapped[Workload | None] = relationship()
    hardware: Mapped[Hardware] = relationship()
    drafts: Mapped[list[RunDraft]] = relationship(
        back_populates="run", order_by="RunDraft.id", passive_deletes=True
    )


class RunDraft(Base):
    """A draft profiled in a run: a model (``model_id`` set) or a model-free drafter (``ngram``)."""

    __tablename__ = "run_drafts"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("profile_runs.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(512))
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id"))
    role: Mapped[str] = mapped_column(String(32), default="draft")

    run: Mapped[ProfileRun] = relationship(back_populates="drafts")
    model: Mapped[Model | None] = relationship()


class TimingSample(Base):
    """One raw timing sample (seconds) of a draft step, a verify forward or a plain decode step."""

    __tablename__ = "timing_samples"
    __table_args__ = (Index("ix_timing_samples_run_id_kind", "run_id", "kind"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("profile_runs.id", ondelete="CASCADE"))
    draft: Mapped[str | None] = mapped_column(String(512))  # None for target-only timings
    kind: Mapped[str] = mapped_column(String(32))  # see _records.TIMING_KINDS
    k: Mapped[int] = mapped_column(Integer)  # new tokens per forward
    batch_size: Mapped[int] = mapped_column(Integer)
    context_len: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Float)
    warmup: Mapped[bool] = mapped_column(Boolean, default=False)


class Acceptance(Base):
    """Aggregated acceptance statistics of one draft in one mode (greedy or sampling)."""

    __tablename__ = "acceptance"
    __table_args__ = (Index("ix_acceptance_run_id_draft", "run_id", "draft"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("profile_runs.id", ondelete="CASCADE"))
    draft: Mapped[str] = mapped_column(String(512))
    mode: Mapped[str] = mapped_column(String(16))  # greedy | sampling
    temperature: Mapped[float] = mapped_column(Float)
    num_speculative: Mapped[int] = mapped_column(Integer)  # N used while recording
    cycles: Mapped[int] = mapped_column(Integer)
    position_attempts: Mapped[list[Any]] = mapped_column()  # [N] cycles that reached position i
    position_accepts: Mapped[list[Any]] = mapped_column()  # [N] cycles that accepted position i
    alpha: Mapped[list[Any]] = mapped_column()  # [N] accepts_i / attempts_i (conditional)
    beta: Mapped[list[Any]] = mapped_column()  # [N] accepts_i / cycles (unconditional, vLLM)
    confidence_bins: Mapped[dict[str, Any]] = mapped_column(default=dict)  # {edges, drafted, accepted} per bin
    teacher_forced_tokens: Mapped[int | None] = mapped_column(Integer)
    greedy_agreement: Mapped[float | None] = mapped_column(Float)  # argmax p == argmax q
    one_minus_tv: Mapped[float | None] = mapped_column(Float)  # mean Σ min(p, q)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # Revision 0009 (inside confidence_bins before; records.AcceptanceRecord says what they are): SQL NULL if none.
    in_loop: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    continuations: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    tv_temperature: Mapped[float | None] = mapped_column(Float, nullable=True)


class AcceptanceTrace(Base):
    """One recorded cycle (θ = 0, N = N_max): draft confidences and how many were accepted."""

    __tablename__ = "acceptance_traces"
    __table_args__ = (Index("ix_acceptance_traces_run_id_draft_mode", "run_id", "draft", "mode"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("profile_runs.id", ondelete="CASCADE"))
    draft: Mapped[str] = mapped_column(String(512))
    mode: Mapped[str] = mapped_column(String(16))
    temperature: Mapped[float] = mapped_column(Float)
    prompt_index: Mapped[int | None] = mapped_column(Integer)
    cycle_index: Mapped[int] = mapped_column(Integer)
    confidences: Mapped[list[Any]] = mapped_column()  # [L] draft probability of each drafted token
    num_accepted: Mapped[int] = mapped_column(Integer)
    token_probs: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # [L] q(x_i); NULL: older runs
    target_probs: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # [L] p(x_i), sampling traces


class BiasFront(Base):
    """One point of a lossy acceptance rule's rejection–bias front (docs/model.md, Lossy acceptance)."""

    __tablename__ = "bias_front"
    __table_args__ = (Index("ix_bias_front_run_id_draft", "run_id", "draft"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("profile_runs.id", ondelete="CASCADE"))
    draft: Mapped[str] = mapped_column(String(512))
    temperature: Mapped[float] = mapped_column(Float)
    method: Mapped[str] = mapped_column(String(16))  # exact | opt | uno
    epsilon: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16))  # theory | measured
    rejection: Mapped[float] = mapped_column(Float)  # per verified position
    bias: Mapped[float] = mapped_column(Float)  # mean TV(emitted, p) per verified position
    pareto_bias: Mapped[float | None] = mapped_column(Float)  # Theorem 5's least bias at that rejection
    positions: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class TeacherForcedPosition(Base):
    """Per position of one target-sampled generation: 1 - TV(p, q) and the draft's top probability."""

    __tablename__ = "teacher_forced_positions"
    __table_args__ = (Index("ix_teacher_forced_positions_run_id_draft", "run_id", "draft"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("profile_runs.id", ondelete="CASCADE"))
    draft: Mapped[str] = mapped_column(String(512))
    temperature: Mapped[float] = mapped_column(Float)
    prompt_index: Mapped[int] = mapped_column(Integer)
    one_minus_tv: Mapped[list[Any]] = mapped_column()  # [M] per generated position
    top_q: Mapped[list[Any]] = mapped_column()  # [M] the draft's top probability there


class TreeTrace(Base):
    """Per-prompt data for token trees and staged drafting (``profiler.tree_profile``): one JSON
    document per (draft, kind, prompt); ``kind`` is ``ranks`` (greedy), ``siblings`` (sampling) or
    ``staged`` (an inner drafter's counts)."""

    __tablename__ = "tree_traces"
    __table_args__ = (Index("ix_tree_traces_run_id_draft_kind", "run_id", "draft", "kind"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("profile_runs.id", ondelete="CASCADE"))
    draft: Mapped[str] = mapped_column(String(512))
    kind: Mapped[str] = mapped_column(String(16))
    temperature: Mapped[float] = mapped_column(Float)
    prompt_index: Mapped[int | None] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column()


class MeasuredRun(Base):
    """An end-to-end measurement of one configuration, stored next to its prediction."""

    __tablename__ = "measured_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("profile_runs.id", ondelete="CASCADE"), index=True
    )
    draft: Mapped[str | None] = mapped_column(String(512))  # None: autoregressive baseline
    config: Mapped[dict[str, Any]] = mapped_column()  # N, threshold, schedule, batch_size, ...
    measured_tokens_per_s: Mapped[float] = mapped_column(Float)
    predicted_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    measured_tau: Mapped[float | None] = mapped_column(Float)
    predicted_tau: Mapped[float | None] = mapped_column(Float)
    seconds: Mapped[float] = mapped_column(Float)
    new_tokens: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # Added by revision 0003: 95% bootstrap CI of measured_tokens_per_s and the raw samples it was
    # computed from ({"prompt_ids": [...], "tokens": [[...]], "seconds": [[...]]}, prompt x repeat).
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Added by revision 0005 (what operators pay for). Latency: per-prompt medians' percentiles, in
    # seconds, and {"requests": arrivals per prompt and repeat, "summary": p50/p90/p99 with CIs}.
    ttft_p50_s: Mapped[float | None] = mapped_column(Float)
    tpot_p50_s: Mapped[float | None] = mapped_column(Float)
    tpot_p90_s: Mapped[float | None] = mapped_column(Float)
    tpot_p99_s: Mapped[float | None] = mapped_column(Float)
    predicted_tpot_p50_s: Mapped[float | None] = mapped_column(Float)
    predicted_tpot_p90_s: Mapped[float | None] = mapped_column(Float)
    latency: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Energy from NVML's counter (NULL on a CPU: absent, not invented), {"joules", "tokens"} per pass.
    energy_j: Mapped[float | None] = mapped_column(Float)
    joules_per_token: Mapped[float | None] = mapped_column(Float)
    energy: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    gpu_price_usd_per_hour: Mapped[float | None] = mapped_column(Float)
    usd_per_million_tokens: Mapped[float | None] = mapped_column(Float)
    peak_memory_bytes: Mapped[float | None] = mapped_column(Float)
    predicted_memory_bytes: Mapped[float | None] = mapped_column(Float)


class Telemetry(Base):
    """One device telemetry sample (NVML); added by revision 0002."""

    __tablename__ = "telemetry"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("profile_runs.id", ondelete="CASCADE"), index=True
    )
    t: Mapped[float] = mapped_column(Float)  # seconds since the run started
    power_w: Mapped[float | None] = mapped_column(Float)
    energy_j: Mapped[float | None] = mapped_column(Float)
    memory_used_mb: Mapped[float | None] = mapped_column(Float)
    sm_clock_mhz: Mapped[float | None] = mapped_column(Float)
    utilization_pct: Mapped[float | None] = mapped_column(Float)


class RegressRun(Base):
    """One ``specdec-tune regress`` run of a suite (or a ``--calibrate`` A/A run); added by 0004."""

    __tablename__ = "regress_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    suite: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # run | calibration
    status: Mapped[str] = mapped_column(String(16))  # running | completed | failed
    verdict: Mapped[str | None] = mapped_column(String(16))  # baseline|pass|suspicious|regression|no_verdict
    exit_code: Mapped[int | None] = mapped_column(Integer)
    baseline_id: Mapped[int | None] = mapped_column(
        ForeignKey("regress_runs.id", ondelete="SET NULL")
    )
    fingerprint: Mapped[dict[str, Any]] = mapped_column(default=dict)
    summary: Mapped[dict[str, Any]] = mapped_column(default=dict)
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column()


class RegressBenchmark(Base):
    """One benchmark of a regression run: its resolved configuration and raw per-prompt samples."""

    __tablename__ = "regress_benchmarks"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("regress_runs.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column()
    samples: Mapped[list[Any]] = mapped_column()  # [prompt] PromptSample.to_json()


class RegressCell(Base):
    """The verdict on one (benchmark, metric) of a regression run, with its statistics."""

    __tablename__ = "regress_cells"
    __table_args__ = (Index("ix_regress_cells_benchmark_metric", "benchmark", "metric"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("regress_runs.id", ondelete="CASCADE"), index=True
    )
    benchmark: Mapped[str] = mapped_column(String(200))
    metric: Mapped[str] = mapped_column(String(64))
    verdict: Mapped[str] = mapped_column(String(16))
    baseline_value: Mapped[float | None] = mapped_column(Float)
    current_value: Mapped[float | None] = mapped_column(Float)
    effect: Mapped[float | None] = mapped_column(Float)  # ratio current / baseline
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    p_value: Mapped[float | None] = mapped_column(Float)
    q_value: Mapped[float | None] = mapped_column(Float)  # Benjamini-Hochberg adjusted
    mdc: Mapped[float | None] = mapped_column(Float)  # minimum detectable change (relative)
    explanation: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)


class RegressCalibration(Base):
    """A metric's A/A spread measured by ``regress --calibrate`` (the noise floor)."""

    __tablename__ = "regress_calibration"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("regress_runs.id", ondelete="CASCADE"), index=True
    )
    suite: Mapped[str] = mapped_column(String(200), index=True)
    benchmark: Mapped[str] = mapped_column(String(200))
    metric: Mapped[str] = mapped_column(String(64))
    runs: Mapped[int] = mapped_column(Integer)
    spread: Mapped[float | None] = mapped_column(Float)  # sd of log(ratio) over the A/A runs
    max_abs_change: Mapped[float | None] = mapped_column(Float)
    mdc: Mapped[float | None] = mapped_column(Float)
    false_alarms: Mapped[int] = mapped_column(Integer, default=0)


class Lease(Base):
    """Who is working on a shared thing (a tuning study) now: one row per key, so that of two processes
    inserting the same key one wins. The holder renews ``heartbeat_at``; a row whose holder died is taken
    over by swapping its ``token`` (``db/_leases.py``)."""

    __tablename__ = "leases"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of ``subject``
    subject: Mapped[str] = mapped_column(Text)  # what is held, in words
    token: Mapped[str] = mapped_column(String(64))  # this holding's id: renew, release and take-over match it
    command: Mapped[str] = mapped_column(String(64))
    pid: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255))
    pid_scope: Mapped[str | None] = mapped_column(String(255))  # boot and pid namespace the pid is valid in
    acquired_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
