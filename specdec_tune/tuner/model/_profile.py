"""Assemble a :class:`RunProfile`, what the predictions need about one (run, draft), from stored rows.

Pure: the rows come in (:mod:`._load` reads them from the database), the profile goes out. The terms:

- T_v(B, k): median of the verify micro-benchmarks per batch size and k;
- T_s(B): the draft-step micro-benchmark at the workload's typical context, plus the engine's
  per-draft-forward overhead o_f (an n-gram drafter's "step" is o_f alone);
- o_c: per-cycle engine overhead, a line in the cycle's draft forwards (:func:`fit_overhead`);
- prefills of the target (T_p - 1 tokens) and the draft (T_p tokens) per profiled prompt;
- calibration (B = 1, on by default): isolated micro-benchmarks and forwards inside the loop differ
  by 10-40 % on a small CPU, so T_v(k), T_ar, the prefills and the draft steps are scaled to the
  medians hooked inside the profile's own decoding passes (:func:`calibrate_b1`); the draft's first
  forward of a cycle (cold) and its later ones (warm) are costed apart;
- greedy position traces per prompt, for the exact simulation (:mod:`._greedy_sim`).
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from specdec_tune.db import BiasFrontRow, RunRecord, RunSettings, TeacherForcedRow, TimingRow, TraceRow
from specdec_tune.core.errors import InputError
from specdec_tune.core.stats import trimmed_mean
from specdec_tune.tuner.model._calibration import OverheadFit, calibrate_b1, fit_overhead, interp
from specdec_tune.core.speculative import MODEL_FREE
from specdec_tune.tuner.model._greedy_sim import PositionTrace, position_traces
from specdec_tune.tuner.model._replay import replay_reach
from specdec_tune.tuner.model._throughput import ModelProfile, Trace


@dataclass(frozen=True)
class PromptInfo:
    """One profiled prompt: its length and how many tokens greedy decoding produced for it."""

    prompt_tokens: int
    new_tokens: int


@dataclass(frozen=True)
class RunProfile:
    """What the predictions need about one (run, draft), built from stored samples.

    Attributes:
        run: the stored run.
        draft: the draft's name (``None``: target only, for the baseline).
        model: the decode-only :class:`ModelProfile` (draft step includes the per-forward overhead;
            an n-gram drafter's "step" is its per-token lookup overhead).
        draft_step_raw_s: B -> median one-token draft forward at the typical context, micro-benchmark.
        cycle_overhead_s: o_c, engine overhead per cycle (plus, calibrated, the first draft forward's
            excess over the others).
        forward_overhead_s: o_f, engine overhead per draft forward (per proposed token for n-gram).
        sequence_overhead_s: set-up and first-cycle bookkeeping per decode call.
        prompts: the profiled prompts (lengths, greedy output lengths).
        prefill_target_s: per prompt, the target's prefill of T_p - 1 tokens.
        prefill_draft_s: per prompt, the draft's prefill of T_p tokens (0 for n-gram).
        positions: per prompt, the greedy position traces (model drafts only).
        after_rejection: confidences of drafted tokens past a rejection (continue unknown roll-outs).
        max_new_tokens: the decode limit of the profiled prompts.
        first_draft_step_s: B -> the first draft forward of a cycle (in-loop when calibrated).
        calibrated: whether B = 1 timings were calibrated to the in-loop forwards.
        ar_forward_s: the plain loop's in-loop target forward (T_ar for the B = 1 baseline), if calibrated.
        engine_overhead_s: the hooked engine overhead per cycle (the fit's intercept, as measured).
        machine_probe_s: the machine probe's median seconds during the profile (None: a run profiled
            before the probe was recorded); see :func:`machine_speed`.
        bias_front: the lossy acceptance front of the draft (sampling profiles; ``tuner.model.bias_of``).
        trace_prompts: the profiled prompt of each of ``model.traces`` (per-request latency replays
            each prompt's own cycles); ``sampling_trace_prompts`` the same for ``model.sampling_traces``.
    """

    run: RunRecord
    draft: str | None
    model: ModelProfile
    draft_step_raw_s: dict[int, float]
    cycle_overhead_s: float
    forward_overhead_s: float
    sequence_overhead_s: float
    prompts: tuple[PromptInfo, ...]
    prefill_target_s: tuple[float, ...]
    prefill_draft_s: tuple[float, ...]
    positions: tuple[tuple[PositionTrace, ...], ...] | None
    after_rejection: tuple[float, ...] = ()
    max_new_tokens: int = 64
    first_draft_step_s: dict[int, float] = field(default_factory=dict)
    calibrated: bool = False
    ar_forward_s: float | None = None
    engine_overhead_s: float = 0.0
    machine_probe_s: float | None = None
    bias_front: tuple[BiasFrontRow, ...] = ()
    trace_prompts: tuple[int | None, ...] = ()
    sampling_trace_prompts: tuple[int | None, ...] = ()
    # k -> seconds per context token of a B = 1 verify of k tokens (measured at several contexts); empty:
    # not measured (runs profiled before it), then latency is predicted at the typical context throughout.
    context_slope_s: dict[int, float] = field(default_factory=dict)
    typical_context: int = 0
    # Suffix decoding: (prompt ids, greedy output ids) of every profiled prompt in profile order, which its
    # exact simulation replays (tuner.model._suffix_sim); empty for other drafters.
    sequences: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()

    @property
    def traced_n_max(self) -> int:
        """The largest N the greedy traces replay: their longest recorded cycle, at most the N_max they were
        recorded at (``run.settings.n_max``, which stands in where no cycle was recorded)."""
        return replay_reach(self.model.traces) or self.run.settings.n_max

    def context_cost(self, k: int, context: float) -> float:
        """Seconds a verify of ``k`` tokens at ``context`` costs more than at the typical context (the
        slopes interpolated in k, clamped at the measured ends; 0 where none was measured)."""
        if not self.context_slope_s or not self.typical_context:
            return 0.0
        return interp(self.context_slope_s, k) * (context - self.typical_context)

    @property
    def is_ngram(self) -> bool:
        return self.draft == MODEL_FREE[0]

    @property
    def model_free(self) -> bool:
        """The drafter runs no model (n-gram lookup, suffix decoding): θ cuts nothing, no draft forwards."""
        return self.draft in MODEL_FREE

    def tail_rate(self, theta: float) -> float:
        """P(confidence ≥ θ) for drafted tokens past a rejection (1 when none were recorded)."""
        if theta <= 0 or not self.after_rejection:
            return 1.0
        return sum(c >= theta for c in self.after_rejection) / len(self.after_rejection)


# --------------------------------------------------------------------------- the run's timings


@dataclass(frozen=True)
class TimingKey:
    """What one group of timing samples measured (every sample of a group is one forward of this shape)."""

    kind: str
    draft: str | None
    k: int
    batch_size: int
    context_len: int


_ANY = object()  # a filter that matches every draft, target forwards included


def _median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else math.nan


class _Timings:
    """A run's timing samples grouped by :class:`TimingKey`, in recording order."""

    def __init__(self, rows: Iterable[TimingRow]) -> None:
        self.groups: dict[TimingKey, list[float]] = defaultdict(list)
        for r in rows:
            self.groups[TimingKey(r.kind, r.draft, r.k, r.batch_size, r.context_len)].append(r.seconds)

    def select(self, kind: str, draft: object = _ANY, batch_size: int | None = None) -> Iterator[tuple[TimingKey, list[float]]]:
        for key, xs in self.groups.items():
            if key.kind == kind and (draft is _ANY or key.draft == draft) and batch_size in (None, key.batch_size):
                yield key, xs

    def verify_medians(self) -> dict[int, dict[int, float]]:
        """B -> k -> median T_v(B, k)."""
        out: dict[int, dict[int, float]] = defaultdict(dict)
        for key, xs in self.select("verify"):
            out[key.batch_size][key.k] = _median(xs)
        return out

    def prefills(self, draft: str | None, infos: Sequence[PromptInfo], drop_last: bool) -> tuple[float, ...]:
        """Each prompt's prefill (its T_p, or T_p - 1 tokens with ``drop_last``), interpolated in length."""
        by_len = {key.k: _median(xs) for key, xs in self.select("prefill", draft)}
        if not by_len:
            return tuple(0.0 for _ in infos)
        return tuple(interp(by_len, p.prompt_tokens - (1 if drop_last else 0)) for p in infos)

    def overheads(self, draft: str | None) -> tuple[list[tuple[int, float]], list[float], list[float]]:
        """(per-cycle (draft forwards, seconds), per-sequence set-up seconds, plain loop's per-token seconds)."""
        cycles = [(key.k - 1, s) for key, xs in self.select("overhead", draft) if key.context_len > 0 for s in xs]
        sequence = [s for key, xs in self.select("overhead", draft) if key.context_len == 0 for s in xs]
        plain = [s for _, xs in self.select("overhead", None) for s in xs]
        return cycles, sequence, plain

    def draft_steps(self, draft: str, batch_sizes: Sequence[int], context: int) -> dict[int, float]:
        """B -> the draft-step micro-benchmark interpolated at ``context`` (batch sizes without samples left out)."""
        out = {}
        for b in batch_sizes:
            points = {key.context_len: _median(xs) for key, xs in self.select("draft_step", draft, b)}
            if points:
                out[b] = interp(points, context)
        return out

    def context_slopes(self, typical: int) -> dict[int, float]:
        """k -> seconds a B = 1 verify of k tokens gains per context token: the least-squares line through
        its medians at the typical context (kind verify) and the others (kind verify_context), at least 0
        (attending over more positions costs no less; a tiny model's timing noise can tilt the line the
        other way, as the prefill line is kept >= 0) and at most the slope that keeps the verify's cost at
        context 0 from going negative (its time at the typical context ÷ that context: a verify over no
        context still costs something; a noisy, steep line would otherwise predict a short request's
        cycles in negative seconds); k without another context left out."""
        by_k: dict[int, dict[int, float]] = defaultdict(dict)  # k -> context -> median
        for key, xs in self.select("verify_context", batch_size=1):
            by_k[key.k][key.context_len] = _median(xs)
        out = {}
        for k, points in sorted(by_k.items()):
            typical_xs = self.groups.get(TimingKey("verify", None, k, 1, typical))
            if typical_xs:
                points[typical] = _median(typical_xs)
            if len(points) >= 2:  # distinct context lengths (dict keys): the line is defined
                slope = statistics.linear_regression(list(points), list(points.values())).slope
                at_typical = points[typical] if typical in points else interp(points, typical)
                out[k] = min(max(0.0, slope), max(0.0, at_typical) / typical if typical > 0 else slope)
        return out

    def probe(self) -> float | None:
        """The machine probe's median seconds over the run (None: not recorded)."""
        xs = [x for _, samples in self.select("machine_probe") for x in samples]
        return statistics.median(xs) if xs else None

    def plain_loop(self) -> list[float]:
        """The plain decoding loop's in-loop target forwards at B = 1."""
        return [x for _, xs in self.select("autoregressive", batch_size=1) for x in xs]


# --------------------------------------------------------------------------- assembly


@dataclass(frozen=True)
class _StepTimes:
    """The time terms of a profile before and after calibration (B -> seconds, per prompt for prefills)."""

    verify_s: dict[int, dict[int, float]]
    draft_step_s: dict[int, float]
    first_draft_step_s: dict[int, float]
    cycle_overhead_s: float
    prefill_target_s: tuple[float, ...]
    prefill_draft_s: tuple[float, ...]
    calibrated: bool = False
    ar_forward_s: float | None = None
    draft_warmup_s: tuple[float, ...] = ()


def _calibrated(times: _StepTimes, raw: dict[int, float], fit: OverheadFit, in_loop: dict,
                plain_loop: Sequence[float]) -> _StepTimes:
    """B = 1 terms scaled to the forwards hooked inside the decode loop (:func:`calibrate_b1`)."""
    cal = calibrate_b1(times.verify_s[1], raw.get(1), times.prefill_target_s, times.prefill_draft_s, in_loop,
                       plain_loop)
    out = replace(times, verify_s={**times.verify_s, 1: cal.verify_s}, prefill_target_s=cal.prefill_target_s,
                  prefill_draft_s=cal.prefill_draft_s, calibrated=cal.applied, ar_forward_s=cal.ar_forward_s)
    if cal.draft_rest_s is None or 1 not in raw:
        return out
    # The colder first forward of every cycle costs its excess once per cycle.
    return replace(out, draft_step_s={**out.draft_step_s, 1: cal.draft_rest_s + fit.per_forward_s},
                   first_draft_step_s={**out.first_draft_step_s, 1: cal.draft_first_s},
                   draft_warmup_s=cal.draft_warmup_s,
                   cycle_overhead_s=max(0.0, fit.intercept_s + cal.draft_first_s - cal.draft_rest_s))


def _step_times(run: RunRecord, draft: str | None, t: _Timings, infos: Sequence[PromptInfo],
                fit: OverheadFit) -> tuple[_StepTimes, dict[int, float]]:
    """The uncalibrated time terms, and the raw draft-step micro-benchmark per batch size."""
    verify_s = t.verify_medians()
    if not verify_s:
        raise InputError(f"run {run.id} has no verify timings (status {run.status}); profile it again")
    batch_sizes = sorted(verify_s)
    model_draft = draft is not None and draft not in MODEL_FREE
    raw = t.draft_steps(draft, batch_sizes, run.settings.typical_context) if model_draft else {}
    if model_draft and not raw:
        raise InputError(f"run {run.id} has no draft-step timings for {draft!r} (status {run.status}); profile it again")
    step = {b: fit.per_forward_s for b in batch_sizes} if draft in MODEL_FREE else \
        {b: s + fit.per_forward_s for b, s in raw.items()}
    prefill_d = t.prefills(draft, infos, drop_last=False) if model_draft else tuple(0.0 for _ in infos)
    return _StepTimes(verify_s, step, dict(raw), fit.intercept_s, t.prefills(None, infos, drop_last=True),
                      prefill_d), raw


def _positions(traces: Sequence[TraceRow], continuations: Sequence[Sequence] | None, prompts: int,
               cap: int) -> tuple[tuple[PositionTrace, ...], ...]:
    """Per prompt, the greedy roll-outs from every output position (:func:`position_traces`)."""
    per_prompt: dict[int, list[TraceRow]] = defaultdict(list)
    for tr in traces:
        per_prompt[tr.prompt_index if tr.prompt_index is not None else 0].append(tr)
    conts: dict[int, dict[int, tuple[float, bool]]] = defaultdict(dict)
    for p_idx, c_idx, conf, ok in continuations or ():
        conts[int(p_idx)][int(c_idx)] = (float(conf), bool(ok))
    return tuple(position_traces(per_prompt.get(i, []), conts.get(i), cap) for i in range(prompts))


def _traces(rows: Sequence[TraceRow]) -> tuple[Trace, ...]:
    return tuple(Trace(tr.confidences, tr.num_accepted, tr.token_probs, tr.target_probs) for tr in rows)


def _fitted_times(run: RunRecord, draft: str | None, t: _Timings, infos: Sequence[PromptInfo],
                  in_loop: dict | None) -> tuple[OverheadFit, _StepTimes, dict[int, float], list[float], list[float]]:
    """The engine-overhead fit and the step times of ``draft`` (calibrated to the in-loop forwards unless
    ``in_loop`` is None), the raw B = 1 draft steps, and the per-sequence and plain-loop overhead samples."""
    cycles, sequence, plain = t.overheads(draft)
    fit = fit_overhead(cycles)
    times, raw = _step_times(run, draft, t, infos, fit)
    if in_loop is not None and 1 in times.verify_s:
        times = _calibrated(times, raw, fit, in_loop, t.plain_loop())
    return fit, times, raw, sequence, plain


def _model_profile(run: RunRecord, draft: str | None, times: _StepTimes, plain: list[float], traces: Sequence[TraceRow],
                   sampling_traces: Sequence[TraceRow] | None, sampling_acceptance: float | None,
                   teacher_forced: Sequence[TeacherForcedRow]) -> ModelProfile:
    """What the throughput model reads of ``draft``: its step times, traces and acceptance sources."""
    return ModelProfile(
        draft_step_s=times.draft_step_s, verify_s={b: dict(sorted(c.items())) for b, c in times.verify_s.items()},
        traces=_traces(traces), cycle_overhead_s=times.cycle_overhead_s, draft_warmup_s=times.draft_warmup_s,
        ar_overhead_s=max(trimmed_mean(plain), 0.0) if plain else 0.0, sampling_acceptance=sampling_acceptance,
        sampling_traces=_traces(sampling_traces) if sampling_traces else None, name=draft or "",
        synthetic_acceptance=synthetic_rates(run.settings),
        teacher_forced=tuple((r.one_minus_tv, r.top_q) for r in teacher_forced), lookup=draft in MODEL_FREE,
    )


def build_run_profile(
    run: RunRecord,
    draft: str | None,
    timings: Sequence[TimingRow],
    traces: Sequence[TraceRow],
    *,
    prompts: Sequence[PromptInfo] | None = None,
    sampling_traces: Sequence[TraceRow] | None = None,
    sampling_acceptance: float | None = None,
    continuations: Sequence[Sequence] | None = None,
    in_loop: dict | None = None,
    calibrate: bool = True,
    teacher_forced: Sequence[TeacherForcedRow] = (),
    bias_front: Sequence[BiasFrontRow] = (),
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]] = (),
) -> RunProfile:
    """Assemble a :class:`RunProfile` from a run's stored rows (pure; no database access).

    Args:
        run: the run record (settings give N_max, max_new_tokens, typical context, prompt lengths).
        draft: the draft's name, or ``None`` for target-only (baseline) predictions.
        timings: the run's timing samples (warm-up excluded).
        traces: greedy traces of ``draft`` in recording order.
        prompts: the prompts' greedy output lengths (else ``max_new_tokens`` each).
        sampling_traces: traces recorded in sampling mode, if any.
        sampling_acceptance: 1 - E[TV] from the teacher-forced pass.
        continuations: (prompt_index, cycle_index, confidence, accepted) at the bonus position of
            fully accepted greedy cycles (see :func:`position_traces`).
        in_loop: medians of the forwards hooked inside the draft's acceptance pass
            (``profiler.overhead.in_loop_medians``).
        calibrate: scale the B = 1 micro-benchmarks to the in-loop forwards (:func:`calibrate_b1`).
        teacher_forced: target-sampled generations with 1 - TV and the draft's top probability per position.
        bias_front: the lossy acceptance front the profile stored.
        sequences: suffix decoding's profiled prompts and greedy outputs, in profile order.

    Raises:
        InputError: the run lacks the target's verify timings (profile it again).
    """
    max_new, typical = run.settings.max_new_tokens, run.settings.typical_context
    infos = tuple(prompts) if prompts is not None else tuple(PromptInfo(t, max_new) for t in run.settings.prompt_tokens)
    t = _Timings(timings)
    fit, times, raw, sequence, plain = _fitted_times(run, draft, t, infos, (in_loop or {}) if calibrate else None)
    model = _model_profile(run, draft, times, plain, traces, sampling_traces, sampling_acceptance, teacher_forced)
    positions = None  # synthetic acceptance is drawn per cycle, not per output position: no exact simulation
    if draft is not None and draft not in MODEL_FREE and traces and model.synthetic_acceptance is None:
        positions = _positions(traces, continuations, len(infos), run.settings.n_max)
    return RunProfile(
        run=run, draft=draft, model=model, draft_step_raw_s=raw, first_draft_step_s=times.first_draft_step_s,
        calibrated=times.calibrated, ar_forward_s=times.ar_forward_s, engine_overhead_s=fit.intercept_s,
        cycle_overhead_s=times.cycle_overhead_s, forward_overhead_s=fit.per_forward_s,
        sequence_overhead_s=max(trimmed_mean(sequence), 0.0) if sequence else 0.0,
        prompts=infos, prefill_target_s=times.prefill_target_s, prefill_draft_s=times.prefill_draft_s,
        positions=positions, after_rejection=tuple(c for tr in traces for c in tr.confidences[tr.num_accepted + 1:]),
        max_new_tokens=max_new, machine_probe_s=t.probe(), bias_front=tuple(bias_front),
        trace_prompts=tuple(tr.prompt_index for tr in traces),
        sampling_trace_prompts=tuple(tr.prompt_index for tr in sampling_traces or ()),
        context_slope_s=t.context_slopes(typical), typical_context=typical,
        sequences=tuple((tuple(p), tuple(o)) for p, o in sequences),
    )


def synthetic_rates(settings: RunSettings) -> tuple[float, ...] | None:
    """The synthetic acceptance rates a run was profiled with (None: the target decided)."""
    return settings.synthetic_acceptance or None


def with_synthetic_acceptance(rp: RunProfile, rates: tuple[float, ...]) -> RunProfile:
    """``rp`` predicting with given conditional acceptance rates instead of its traces: "what if the
    acceptance were α" (every prediction from it is labelled synthetic)."""
    return replace(rp, model=replace(rp.model, synthetic_acceptance=tuple(rates)), positions=None)


def run_drafts(run: RunRecord) -> list[str]:
    """Names of the drafts profiled in ``run``, in profiling order."""
    return run.draft_names


def resolve_draft(run: RunRecord, draft: str | None) -> str:
    """The run's draft called ``draft`` (default: its first), or a one-line error listing them."""
    return run.resolve_draft(draft)
