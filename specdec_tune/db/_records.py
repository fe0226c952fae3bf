"""Plain frozen dataclasses that the query helpers return (never ORM objects).

They outlive the session that read them, can be pickled, compared and printed, and the tuner and
dashboard need no SQLAlchemy to use them. Row types used for bulk inserts (:class:`TimingRow`,
:class:`TraceRow`, :class:`TelemetryRow`) are the same ones the loaders return, so a round trip is
an identity.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from specdec_tune.db._run_settings import RunSettings

# Kinds of timing samples. draft_step: one draft forward producing one token (T_s); verify: one
# target forward over k new tokens with a KV cache (T_v(k)); autoregressive: a plain decode step
# (T_ar = T_v(1) measured inside the baseline loop); prefill: a prompt forward; overhead: per-cycle
# bookkeeping outside the forwards; draft_width: one draft forward over k tree nodes (a depth of a
# token tree, docs/model.md, Token trees and staged drafting).
TIMING_KINDS = ("draft_step", "verify", "autoregressive", "prefill", "overhead", "machine_probe", "draft_width",
                "verify_context",  # verify_context: T_v(1, k) at other context lengths than the typical one
                # hooked_call / bare_call: one decode of a profile pass's design timed whole with the profiler's hooks
                # and without, each per hooked forward, in pairs (k: the design's N + 1, 1 for plain decoding;
                # _threshold: the θ > 0 pass's design): their difference is the hooks' tax (profiler/hook_tax.py)
                "hooked_call", "bare_call", "hooked_call_threshold", "bare_call_threshold",
                # first_cycle: a decode's first cycle whole (set-up, prefills, its drafts and verify) plus its tail
                # after the last cycle, hooked (k: the first verify's width L + 1, context_len: the prompt's tokens)
                "first_cycle")
RUN_STATUSES = ("running", "completed", "interrupted", "failed")
FINISHED_STATUSES = RUN_STATUSES[1:]
MODES = ("greedy", "sampling")
_R = TypeVar("_R")


def field_values(record: type, source: Any) -> dict[str, Any]:
    """The values of ``record``'s dataclass fields, read from the same-named attributes of ``source``
    (an ORM row or a record): how a row becomes a record, and a record a row."""
    return {f.name: getattr(source, f.name) for f in fields(record)}


def record_from(record: type[_R], source: Any, **converted: Any) -> _R:
    """A ``record`` read from the same-named attributes of ``source`` (an ORM row); ``converted``
    replaces the values that need a copy or a conversion (JSON lists to tuples, dicts)."""
    return record(**{**field_values(record, source), **converted})


@dataclass(frozen=True)
class HardwareRecord:
    """A machine: device kind and model, memory, driver and library versions."""

    id: int
    device: str
    device_name: str
    device_count: int = 1
    memory_mb: float | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    hostname: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelRecord:
    """A target or draft model (path or hub id) and what identifies its weights."""

    id: int
    name: str
    revision: str | None = None
    num_parameters: int | None = None
    num_layers: int | None = None
    dtype: str | None = None
    vocab_size: int | None = None
    tokenizer_hash: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkloadRecord:
    """A prompt set: name, hash of its content, number of prompts."""

    id: int
    name: str
    content_hash: str
    prompt_count: int


@dataclass(frozen=True)
class DraftRecord:
    """A draft profiled in a run: ``name`` is a model path / hub id or a drafter (``ngram``)."""

    name: str
    model_id: int | None = None
    role: str = "draft"


@dataclass(frozen=True)
class RunRecord:
    """A profile run with its target, workload, hardware and drafts."""

    id: int
    status: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    target: ModelRecord
    hardware: HardwareRecord
    workload: WorkloadRecord | None
    drafts: tuple[DraftRecord, ...]
    settings: RunSettings
    label: str | None = None
    notes: str | None = None
    specdec_version: str | None = None
    git_revision: str | None = None

    @property
    def duration_s(self) -> float | None:
        """Wall time of the run in seconds (``None`` while it is running)."""
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    @property
    def draft_names(self) -> list[str]:
        """Names of the drafts profiled in this run, in profiling order."""
        return [d.name for d in self.drafts]

    def resolve_draft(self, draft: str | None) -> str:
        """The run's draft called ``draft`` (default: its first), or a one-line error listing them."""
        from specdec_tune.core.errors import NotFoundError

        names = self.draft_names
        if not names:
            raise NotFoundError(f"run {self.id} has no drafts")
        if draft is None:
            return names[0]
        if draft not in names:
            raise NotFoundError(f"draft {draft!r} is not in run {self.id}; its drafts: {', '.join(names)}")
        return draft


@dataclass(frozen=True)
class TimingRow:
    """One raw timing sample in seconds.

    Attributes:
        kind: One of :data:`TIMING_KINDS`.
        k: New tokens in the forward (1 for a draft step or plain decode step, N+1 for a verify).
        batch_size: Sequences in the forward.
        context_len: Tokens already in the KV cache.
        seconds: The measured time of this one forward.
        draft: The draft timed (``draft_step``), ``None`` for target forwards.
        warmup: Taken during warm-up (kept apart from the real samples).
    """

    kind: str
    k: int
    batch_size: int
    context_len: int
    seconds: float
    draft: str | None = None
    warmup: bool = False


@dataclass(frozen=True)
class AcceptanceRecord:
    """Aggregated acceptance of one draft in one mode (docs/architecture.md, Words, for α and β).

    ``position_attempts[i]`` counts cycles that drafted position i+1 with all earlier positions
    accepted, ``position_accepts[i]`` those that accepted it; ``alpha[i]`` = accepts/attempts
    (conditional) and ``beta[i]`` = accepts/cycles (unconditional). Undefined rates are ``None``.
    """

    id: int
    run_id: int
    draft: str
    mode: str
    temperature: float
    num_speculative: int
    cycles: int
    position_attempts: tuple[int, ...]
    position_accepts: tuple[int, ...]
    alpha: tuple[float | None, ...]
    beta: tuple[float | None, ...]
    confidence_bins: dict[str, Any]
    teacher_forced_tokens: int | None = None
    greedy_agreement: float | None = None
    one_minus_tv: float | None = None
    # Greedy rows: the forwards timed inside the acceptance pass (profiler.overhead.in_loop_medians), to which
    # the model calibrates the micro-benchmarks; None in sampling rows and runs profiled before they were kept.
    in_loop: dict[str, Any] | None = None
    # Greedy rows of a model draft: (prompt_index, cycle_index, confidence, accepted) at the bonus position of
    # each fully accepted cycle, so the greedy simulation can follow a roll-out past it; None otherwise.
    continuations: tuple[tuple[int, int, float, bool], ...] | None = None
    tv_temperature: float | None = None  # the temperature of the teacher-forced pass behind one_minus_tv


@dataclass(frozen=True)
class TraceRow:
    """One recorded cycle: the draft's confidence in each drafted token and how many were accepted.

    Recorded with θ = 0 and N = N_max; ``confidences`` has one entry per drafted token ``[L]``, and so
    has ``token_probs`` (each drafted token's own draft probability; ``None`` in runs stored before it
    was recorded, and the same as ``confidences`` in greedy mode).
    """

    cycle_index: int
    confidences: tuple[float, ...]
    num_accepted: int
    prompt_index: int | None = None
    token_probs: tuple[float, ...] | None = None
    target_probs: tuple[float, ...] | None = None  # [L] p(x_i) of each drafted token (sampling traces)


@dataclass(frozen=True)
class BiasFrontRow:
    """One point of a lossy acceptance rule's front: rejection and bias per verified position at ε.

    ``source`` is ``theory`` (computed exactly from p and q at teacher-forced positions of
    target-sampled text: Yin et al. 2024, Theorems 4-5) or ``measured`` (a lossy decoding run:
    rejections counted, the bias of each verified position computed from its p and q).
    ``pareto_bias`` is the least bias any rejection-based rule has at that rejection (theory rows).
    """

    method: str
    epsilon: float
    source: str
    rejection: float
    bias: float
    positions: int
    pareto_bias: float | None = None
    draft: str = ""
    temperature: float = 1.0


@dataclass(frozen=True)
class TeacherForcedRow:
    """One target-sampled generation read by both models: per generated position, 1 - TV(p, q) (the
    exact sampling acceptance there) and the draft's top probability (what θ compares)."""

    prompt_index: int
    one_minus_tv: tuple[float, ...]
    top_q: tuple[float, ...]
    draft: str = ""
    temperature: float = 1.0


@dataclass(frozen=True)
class MeasuredRecord:
    """An end-to-end measurement of one configuration next to its prediction."""

    id: int
    run_id: int
    draft: str | None
    config: dict[str, Any]
    measured_tokens_per_s: float
    predicted_tokens_per_s: float | None
    measured_tau: float | None
    predicted_tau: float | None
    seconds: float
    new_tokens: int
    created_at: dt.datetime
    ci_low: float | None = None  # 95% CI of measured_tokens_per_s (revision 0003; None before)
    ci_high: float | None = None
    samples: dict[str, Any] | None = None  # raw {"prompt_ids", "tokens", "seconds"} per repeat
    # Revision 0005 (None before, and energy None on a CPU); see MeasuredRun in db/_models.py.
    ttft_p50_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_p99_s: float | None = None
    predicted_tpot_p50_s: float | None = None
    predicted_tpot_p90_s: float | None = None
    latency: dict[str, Any] | None = None
    energy_j: float | None = None
    joules_per_token: float | None = None
    energy: dict[str, Any] | None = None
    gpu_price_usd_per_hour: float | None = None
    usd_per_million_tokens: float | None = None
    peak_memory_bytes: float | None = None
    predicted_memory_bytes: float | None = None

    @property
    def ci95(self) -> tuple[float, float] | None:
        """The stored 95% CI of the measured tokens/s, or ``None`` for older rows."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return (self.ci_low, self.ci_high)

    @property
    def prediction_inside_ci(self) -> bool | None:
        """Whether the predicted tokens/s lies in the measured 95% CI (``None``: either missing)."""
        ci = self.ci95
        if ci is None or self.predicted_tokens_per_s is None:
            return None
        return ci[0] <= self.predicted_tokens_per_s <= ci[1]

    @property
    def relative_error(self) -> float | None:
        """(predicted - measured) / measured throughput, or ``None`` without a prediction."""
        if self.predicted_tokens_per_s is None or self.measured_tokens_per_s == 0:
            return None
        return (
            self.predicted_tokens_per_s - self.measured_tokens_per_s
        ) / self.measured_tokens_per_s


@dataclass(frozen=True)
class TelemetryRow:
    """One device telemetry sample; ``t`` is seconds since the run started."""

    t: float
    power_w: float | None = None
    energy_j: float | None = None
    memory_used_mb: float | None = None
    sm_clock_mhz: float | None = None
    utilization_pct: float | None = None
