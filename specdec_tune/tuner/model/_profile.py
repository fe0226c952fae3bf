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

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from specdec_tune.db import BiasFrontRow, RunRecord, RunSettings, TeacherForcedRow, TimingRow, TraceRow
from specdec_tune.core.limits import BATCH_CAPTURE_SIZES
from specdec_tune.core.errors import InputError
from specdec_tune.core.pass_design import steady_widths
from specdec_tune.core.stats import trimmed_mean
from specdec_tune.tuner.model._calibration import OverheadFit, calibrate_b1, fit_overhead, interp
from specdec_tune.core.speculative import MODEL_FREE
from specdec_tune.tuner.model._loop_costs import first_cycle_residuals, first_cycle_terms, hook_tax
from specdec_tune.tuner.model._loop_costs import threshold_forward_s
from specdec_tune.tuner.model._timings import Timings
from specdec_tune.tuner.model._greedy_sim import PositionTrace, position_traces, rollout_traces
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
        sequence_overhead_s: per decode call, what its set-up, first cycle and end cost beyond the model's
            terms for them (:func:`first_cycle_overhead_s`; negative where the first cycle overlaps the
            prefills' work more than a steady cycle's terms allow for).
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
    machine_probe_cv: float | None = None  # the probe's coefficient of variation over the run (its noise)
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
    # What the calibration found suspicious (an in-loop ÷ isolated ratio clamped, _calibration.anchor_ratios),
    # and in-loop ÷ isolated as measured ("verify": the largest at the anchors; "draft_step": a later draft forward).
    calibration_warnings: tuple[str, ...] = ()
    loop_ratios: dict[str, float] = field(default_factory=dict)
    # What the profiler's hooks added per hooked forward, taken off the in-loop terms (_loop_costs.hook_tax):
    # in the draft's θ = 0 passes and in plain decoding; 0 where it did not stand clear of the noise.
    hook_tax_s: float = 0.0
    plain_hook_tax_s: float = 0.0
    # A plain decode's call up to its prefill's end beyond the prefill the model charges it (its set-up, and the
    # prompt's last token, which plain decoding prefills and a speculative decode's first cycle feeds).
    plain_setup_s: float = 0.0
    # sequence_overhead_s of a decode at θ > 0, from the θ pass's first cycles (None: not profiled).
    checked_sequence_overhead_s: float | None = None

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

    def sequence_s(self, checked: bool) -> float:
        """``sequence_overhead_s`` of a decode whose draft forwards check θ (``checked``) or not."""
        if checked and self.checked_sequence_overhead_s is not None:
            return self.checked_sequence_overhead_s
        return self.sequence_overhead_s

    def tail_rate(self, theta: float) -> float:
        """P(confidence ≥ θ) for drafted tokens past a rejection (1 when none were recorded)."""
        if theta <= 0 or not self.after_rejection:
            return 1.0
        return sum(c >= theta for c in self.after_rejection) / len(self.after_rejection)


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
    warnings: tuple[str, ...] = ()
    loop_ratios: dict[str, float] = field(default_factory=dict)
    hook_tax_s: tuple[float, float, float] = (0.0, 0.0, 0.0)  # per hooked forward: plain, θ = 0 passes, θ > 0 pass


def _calibrated(times: _StepTimes, raw: dict[int, float], fit: OverheadFit, in_loop: dict,
                plain_loop: Sequence[float], settings: RunSettings, infos: Sequence[PromptInfo]) -> _StepTimes:
    """B = 1 terms scaled to the forwards hooked inside the decode loop (:func:`calibrate_b1`), anchored at
    the verify widths the profile's passes designed (``core.pass_design.steady_widths``)."""
    cal = calibrate_b1(times.verify_s[1], raw.get(1), times.prefill_target_s, times.prefill_draft_s, in_loop,
                       plain_loop, steady_widths(settings.n_max, settings.overhead_ns),
                       [p.prompt_tokens for p in infos])
    out = replace(times, verify_s={**times.verify_s, 1: cal.verify_s}, prefill_target_s=cal.prefill_target_s,
                  prefill_draft_s=cal.prefill_draft_s, calibrated=cal.applied, ar_forward_s=cal.ar_forward_s,
                  warnings=cal.warnings, loop_ratios=cal.loop_ratios)
    if cal.draft_rest_s is None or 1 not in raw:
        return out
    # The colder first forward of every cycle costs its excess once per cycle.
    return replace(out, draft_step_s={**out.draft_step_s, 1: cal.draft_rest_s + fit.per_forward_s},
                   first_draft_step_s={**out.first_draft_step_s, 1: cal.draft_first_s},
                   draft_warmup_s=cal.draft_warmup_s,
                   cycle_overhead_s=max(0.0, fit.intercept_s + cal.draft_first_s - cal.draft_rest_s))


def _step_times(run: RunRecord, draft: str | None, t: Timings, infos: Sequence[PromptInfo],
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


def _fitted_times(run: RunRecord, draft: str | None, t: Timings, infos: Sequence[PromptInfo],
                  in_loop: dict | None) -> tuple[OverheadFit, _StepTimes, dict[int, float], list[float], list[float]]:
    """The engine-overhead fit and the step times of ``draft`` (calibrated to the in-loop forwards unless
    ``in_loop`` is None), the raw B = 1 draft steps, and the per-sequence and plain-loop overhead samples."""
    cycles, sequence, plain = t.overheads(draft)
    fit = fit_overhead(cycles)
    times, raw = _step_times(run, draft, t, infos, fit)
    if in_loop is not None and 1 in times.verify_s:
        times = _untaxed(_calibrated(times, raw, fit, in_loop, t.plain_loop(), run.settings, infos), t, draft)
    return fit, times, raw, sequence, plain


def _untaxed(times: _StepTimes, t: Timings, draft: str | None) -> _StepTimes:
    """The in-loop terms less what the profiler's hooks added to them (:func:`hook_tax`, per hooked forward):
    plain decoding's per-token overhead, a model draft's step and o_c (its cycle's verify)."""
    plain, spec, checked = (hook_tax(xs) for xs in t.hook_taxes(draft))
    step = dict(times.draft_step_s)
    if draft is not None and draft not in MODEL_FREE and 1 in step:
        step[1] = max(step[1] - spec, 0.0)
    return replace(times, draft_step_s=step, cycle_overhead_s=max(times.cycle_overhead_s - spec, 0.0),
                   hook_tax_s=(plain, spec, checked))


def _model_profile(run: RunRecord, draft: str | None, times: _StepTimes, plain: list[float], traces: Sequence[TraceRow],
                   sampling_traces: Sequence[TraceRow] | None, sampling_acceptance: float | None,
                   teacher_forced: Sequence[TeacherForcedRow]) -> ModelProfile:
    """What the throughput model reads of ``draft``: its step times, traces and acceptance sources."""
    return ModelProfile(
        draft_step_s=times.draft_step_s, verify_s={b: dict(sorted(c.items())) for b, c in times.verify_s.items()},
        traces=_traces(traces), cycle_overhead_s=times.cycle_overhead_s, draft_warmup_s=times.draft_warmup_s,
        ar_overhead_s=max(trimmed_mean(plain) - times.hook_tax_s[0], 0.0) if plain else 0.0,
        sampling_acceptance=sampling_acceptance,
        sampling_traces=_traces(sampling_traces) if sampling_traces else None, name=draft or "",
        synthetic_acceptance=synthetic_rates(run.settings),
        teacher_forced=tuple((r.one_minus_tv, r.top_q) for r in teacher_forced), lookup=draft in MODEL_FREE,
        batch_graph_sizes=BATCH_CAPTURE_SIZES if run.settings.cuda_graphs_used == "on" else (),
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
    rollouts: Sequence[dict] | None = None,
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
        continuations: (prompt_index, cycle_index, confidence, accepted) at the bonus position of fully
            accepted greedy cycles (see :func:`position_traces`).
        in_loop: medians of the forwards hooked in the draft's acceptance pass (``profiler.overhead.in_loop_medians``).
        calibrate: scale the B = 1 micro-benchmarks to the in-loop forwards (:func:`calibrate_b1`).
        teacher_forced: target-sampled generations with 1 - TV and the draft's top probability per position.
        bias_front: the lossy acceptance front the profile stored.
        rollouts: an EAGLE-3 head's roll-outs from every output position, per prompt (they replace the
            cycles' suffixes in the greedy simulation: :func:`rollout_traces`).
        sequences: suffix decoding's profiled prompts and greedy outputs, in profile order.

    Raises:
        InputError: the run lacks the target's verify timings (profile it again).
    """
    max_new, typical = run.settings.max_new_tokens, run.settings.typical_context
    infos = tuple(prompts) if prompts is not None else tuple(PromptInfo(t, max_new) for t in run.settings.prompt_tokens)
    t = Timings(timings)
    fit, times, raw, sequence, plain = _fitted_times(run, draft, t, infos, (in_loop or {}) if calibrate else None)
    model = _model_profile(run, draft, times, plain, traces, sampling_traces, sampling_acceptance, teacher_forced)
    positions = None  # synthetic acceptance is drawn per cycle, not per output position: no exact simulation
    if draft is not None and draft not in MODEL_FREE and traces and model.synthetic_acceptance is None:
        positions = _positions(traces, continuations, len(infos), run.settings.n_max) if not rollouts else \
            tuple(rollout_traces(r, run.settings.n_max) for r in rollouts)
    plain_tax, tax, checked_tax = times.hook_tax_s
    rp = RunProfile(
        run=run, draft=draft, model=model, draft_step_raw_s=raw, first_draft_step_s=times.first_draft_step_s,
        calibrated=times.calibrated, ar_forward_s=times.ar_forward_s, engine_overhead_s=fit.intercept_s,
        cycle_overhead_s=times.cycle_overhead_s, forward_overhead_s=fit.per_forward_s,
        sequence_overhead_s=max(trimmed_mean(sequence) - tax, 0.0) if sequence else 0.0,  # the target's prefill
        prompts=infos, prefill_target_s=times.prefill_target_s, prefill_draft_s=times.prefill_draft_s,
        positions=positions, after_rejection=tuple(c for tr in traces for c in tr.confidences[tr.num_accepted + 1:]),
        max_new_tokens=max_new, machine_probe_s=t.probe(), machine_probe_cv=t.probe_cv(), bias_front=tuple(bias_front),
        trace_prompts=tuple(tr.prompt_index for tr in traces),
        sampling_trace_prompts=tuple(tr.prompt_index for tr in sampling_traces or ()),
        context_slope_s=t.context_slopes(typical), typical_context=typical, calibration_warnings=times.warnings,
        loop_ratios=times.loop_ratios, hook_tax_s=tax, plain_hook_tax_s=plain_tax,
        sequences=tuple((tuple(p), tuple(o)) for p, o in sequences))
    return _loop_costs(rp, t, (in_loop or {}) if calibrate else None, checked_tax)


def _loop_costs(rp: RunProfile, t: Timings, in_loop: dict | None, checked_tax: float) -> RunProfile:
    """A calibrated profile with the costs its steady terms miss (:mod:`._loop_costs`): plain decoding's set-up,
    a model draft's first cycle beyond its terms, and each checked draft forward's at θ > 0."""
    if in_loop is None:
        return rp
    target = {p.prompt_tokens: pt for p, pt in zip(rp.prompts, rp.prefill_target_s)}
    plain = [s - rp.plain_hook_tax_s - interp(target, n) for _, _, s, n in t.first_cycles(None)]
    if plain:
        rp = replace(rp, plain_setup_s=trimmed_mean(plain))
    if rp.draft is None or rp.draft in MODEL_FREE:
        return rp
    by_length = {p.prompt_tokens: pt + pd - rp.first_draft_step_s.get(1, 0.0)
                 for p, pt, pd in zip(rp.prompts, rp.prefill_target_s, rp.prefill_draft_s)}

    def first(rows, tax: float, checked: bool) -> list[float]:
        return first_cycle_residuals(rows, rp.model, rp.context_cost, lambda n: interp(by_length, n), tax, checked)

    steady = first(t.first_cycles(rp.draft), rp.hook_tax_s, False)
    if steady:
        rp = replace(rp, sequence_overhead_s=trimmed_mean(steady))
    if not in_loop.get("threshold_cycles"):
        return rp
    cost = threshold_forward_s(in_loop["threshold_cycles"], rp.model, rp.cycle_overhead_s, rp.context_cost, checked_tax)
    rp = replace(rp, model=replace(rp.model, threshold_forward_s=cost))
    _, checked = first_cycle_terms(steady, first(in_loop.get("threshold_first_cycles", ()), checked_tax, True))
    return replace(rp, checked_sequence_overhead_s=checked)


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
