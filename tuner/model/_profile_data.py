"""From a stored profile run to predictions of end-to-end throughput, as ``measure`` observes it.

``specdec-tune measure`` reports new tokens / wall seconds of whole decode calls, prefill included.
The predictions here count the same things, so predicted and measured numbers compare directly:

    seconds = Σ_prompts [prefill_target(T_p - 1) + prefill_draft(T_p) - T_s + set-up]
              + Σ_cycles [F·(T_s + o_f) + T_v(L + 1) + o_c]

where L is the cycle's proposed length, F its draft forwards (L, or L + 1 when θ cut the draft), o_c
and o_f the measured per-cycle and per-draft-forward engine overheads (``profiler.overhead``), T_s and
T_v(k) the micro-benchmark medians (``profiler.microbench``) at the workload's typical context, and
the first draft forward of a sequence is its prefill. The baseline is the same sum for plain decoding:
prefill + M·(T_ar + per-token overhead). ``decode_tokens_per_s`` leaves prefill and set-up out.

Calibration (B = 1, on by default): isolated micro-benchmarks and forwards inside the loop differ by
10-40% on a small CPU (which weights are still cached depends on what ran before), so T_v(k), T_ar,
the prefills and the draft steps are scaled to the medians hooked inside the profile's own decoding
passes (:func:`specdec_tune.tuner._calibration.calibrate_b1`); the draft's first forward of a cycle
(cold) and its later ones (warm) are costed apart. Batch sizes B > 1 keep the micro-benchmarks.

Which cycles: in greedy mode with a model draft the cycles are *simulated* exactly per prompt. Greedy
decoding is deterministic, so the draft's roll-out from any position of the output is a suffix of
a recorded θ = 0, N = N_max cycle (the one whose accepted prefix covers that position); replaying the
engine's loop over those position traces gives every cycle's (L, A, F) for any N ≤ N_max, θ and
schedule on the profiled prompts, end of sequence included. Only what a N_max cycle never saw is
estimated: confidences past its last drafted token (continued with the measured rate of confidences
≥ θ after a rejection). Otherwise (sampling, n-gram lookup) the cycles come from
:func:`specdec_tune.tuner.model.predict` (i.i.d. trace replay) with M_p / E[τ] cycles per prompt.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from specdec_tune.db import Database, RunRecord, TimingRow, TraceRow
from specdec_tune.errors import InputError
from specdec_tune.splits import split_prompts
from specdec_tune.tuner.model._calibration import OverheadFit, calibrate_b1, fit_overhead, interp, trimmed_mean
from specdec_tune.tuner.model._greedy_sim import PositionTrace, position_traces, simulate_prompt, stats_from_cycles
from specdec_tune.tuner.model._replay import ReplayStats
from specdec_tune.tuner.model._throughput import ModelProfile, SpecConfig, Trace, draft_step_time, verify_time
from specdec_tune.tuner.model._throughput import predict as model_predict

NGRAM = "ngram"
__all__ = [
    "OverheadFit", "PositionTrace", "PromptInfo", "PromptSpec", "RunPrediction", "RunProfile", "best_configs",
    "build_run_profile", "fit_overhead", "load_run_profile", "position_traces", "predict_baseline",
    "predict_config", "predict_prompts", "profiled_specs", "split_specs", "resolve_draft", "run_drafts", "simulate_prompt",
]


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
        tail_rates: θ -> P(confidence ≥ θ) past a rejection (continues unknown roll-outs).
        max_new_tokens: the decode limit of the profiled prompts.
        first_draft_step_s: B -> the first draft forward of a cycle (in-loop when calibrated).
        calibrated: whether B = 1 timings were calibrated to the in-loop forwards.
        ar_forward_s: the plain loop's in-loop target forward (T_ar for the B = 1 baseline), if calibrated.
        engine_overhead_s: the hooked engine overhead per cycle (the fit's intercept, as measured).
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

    @property
    def is_ngram(self) -> bool:
        return self.draft == NGRAM

    def tail_rate(self, theta: float) -> float:
        """P(confidence ≥ θ) for drafted tokens past a rejection (1 when none were recorded)."""
        if theta <= 0 or not self.after_rejection:
            return 1.0
        return sum(c >= theta for c in self.after_rejection) / len(self.after_rejection)


@dataclass(frozen=True)
class RunPrediction:
    """Predicted end-to-end throughput of one configuration on the profiled prompts.

    Attributes:
        tokens_per_s: new tokens / seconds of whole decode calls (prefill included), as ``measure``.
        decode_tokens_per_s: the same without prefill and per-call set-up.
        speedup: tokens_per_s ÷ baseline_tokens_per_s (plain decoding, prefill included).
        baseline_tokens_per_s: predicted plain decoding, end to end.
        expected_tokens_per_cycle: E[τ] (accepted + 1).
        expected_draft_length: E[L].
        expected_draft_forwards: E[F].
        cycle_time_s: E[T_cycle] (decode only).
        seconds: predicted wall seconds over the prompts.
        new_tokens: tokens those prompts produce (× batch size).
        cycles: decode cycles of one request per prompt, summed over the prompts (plain decoding: one
            per token after the prefill's). At batch size 1, ``(new_tokens - prompts) / cycles`` is
            the tokens per decode step after the first token, as a server counts its steps
            (``server_calibration.acceptance_terms``).
        acceptance_per_position: conditional α_i implied for the configuration.
        source: ``simulation`` (greedy, exact cycle replay), or the model's ``traces`` /
            ``sampling_traces`` / ``tv``, or ``baseline``.
    """

    tokens_per_s: float
    decode_tokens_per_s: float
    speedup: float
    baseline_tokens_per_s: float
    expected_tokens_per_cycle: float
    expected_draft_length: float
    expected_draft_forwards: float
    cycle_time_s: float
    seconds: float
    new_tokens: int
    acceptance_per_position: tuple[float, ...] = field(default=())
    source: str = "simulation"
    label: str = "predicted"
    in_sample: bool = True  # every prompt predicted was one the profile ran
    prompts: int = 0
    cycles: float = 0.0


# --------------------------------------------------------------------------- building from the db


def _median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else math.nan


def _group(rows: Iterable[TimingRow]) -> dict[tuple, list[float]]:
    out: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        out[(r.kind, r.draft, r.k, r.batch_size, r.context_len)].append(r.seconds)
    return out


def _after_rejection(traces: Iterable[TraceRow]) -> tuple[float, ...]:
    return tuple(c for t in traces for c in t.confidences[t.num_accepted + 1:])


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

    Raises:
        InputError: the run lacks the target's verify timings (profile it again).
    """
    settings = run.settings
    groups = _group(timings)
    batch_sizes = sorted({b for (kind, _, _, b, _) in groups if kind == "verify"})
    if not batch_sizes:
        raise InputError(f"run {run.id} has no verify timings (status {run.status}); profile it again")
    verify_s: dict[int, dict[int, float]] = defaultdict(dict)
    for (kind, _, k, b, _), xs in groups.items():
        if kind == "verify":
            verify_s[b][k] = _median(xs)
    typical = int(settings.get("typical_context", 0))
    max_new = int(settings.get("max_new_tokens", 64))
    prompt_tokens = [int(t) for t in settings.get("prompt_tokens", [])]
    infos = tuple(prompts) if prompts is not None else tuple(PromptInfo(t, max_new) for t in prompt_tokens)

    def prefill(name: str | None, drop_last: bool) -> tuple[float, ...]:
        by_len = {k: _median(xs) for (kind, d, k, _, _), xs in groups.items() if kind == "prefill" and d == name}
        if not by_len:
            return tuple(0.0 for _ in infos)
        return tuple(interp(by_len, p.prompt_tokens - (1 if drop_last else 0)) for p in infos)

    overhead = [(k - 1, s) for (kind, d, k, _, c), xs in groups.items() if kind == "overhead" and d == draft and c > 0
                for s in xs]
    sequence = [s for (kind, d, _, _, c), xs in groups.items() if kind == "overhead" and d == draft and c == 0
                for s in xs]
    ar = [s for (kind, d, _, _, _), xs in groups.items() if kind == "overhead" and d is None for s in xs]
    fit = fit_overhead(overhead)
    raw: dict[int, float] = {}
    if draft is not None and draft != NGRAM:
        for b in batch_sizes:
            pts = {c: _median(xs) for (kind, d, _, bb, c), xs in groups.items() if kind == "draft_step" and d == draft and bb == b}
            if pts:
                raw[b] = interp(pts, typical)
        if not raw:
            raise InputError(f"run {run.id} has no draft-step timings for {draft!r} (status {run.status}); profile it again")
    if draft == NGRAM:
        step = {b: fit.per_forward_s for b in batch_sizes}
    else:
        step = {b: t + fit.per_forward_s for b, t in raw.items()}
    prefill_t = prefill(None, True)
    prefill_d = prefill(draft, False) if draft not in (None, NGRAM) else tuple(0.0 for _ in infos)
    cycle_overhead = fit.intercept_s
    first_step = dict(raw)  # B -> the draft's first forward of a cycle (what its prefill replaces)
    calibrated = False
    ar_forward = None
    if calibrate and 1 in verify_s:
        ar_loop = [x for (kind, _, _, b, _), xs in groups.items() if kind == "autoregressive" and b == 1 for x in xs]
        cal = calibrate_b1(verify_s[1], raw.get(1), prefill_t, prefill_d, in_loop or {}, ar_loop)
        verify_s[1], prefill_t, prefill_d = cal.verify_s, cal.prefill_target_s, cal.prefill_draft_s
        if cal.draft_rest_s is not None and 1 in raw:
            step[1] = cal.draft_rest_s + fit.per_forward_s
            first_step[1] = cal.draft_first_s
            # The colder first forward of every cycle costs its excess once per cycle.
            cycle_overhead = max(0.0, fit.intercept_s + cal.draft_first_s - cal.draft_rest_s)
        calibrated = cal.applied
        ar_forward = cal.ar_forward_s
    model = ModelProfile(
        draft_step_s=step,
        verify_s={b: dict(sorted(c.items())) for b, c in verify_s.items()},
        traces=tuple(Trace(t.confidences, t.num_accepted) for t in traces),
        cycle_overhead_s=cycle_overhead,
        ar_overhead_s=max(trimmed_mean(ar), 0.0) if ar else 0.0,
        sampling_acceptance=sampling_acceptance,
        sampling_traces=tuple(Trace(t.confidences, t.num_accepted) for t in sampling_traces) if sampling_traces else None,
        name=draft or "",
    )
    positions = None
    if draft is not None and draft != NGRAM and traces:
        per_prompt: dict[int, list[TraceRow]] = defaultdict(list)
        for t in traces:
            per_prompt[t.prompt_index if t.prompt_index is not None else 0].append(t)
        conts: dict[int, dict[int, tuple[float, bool]]] = defaultdict(dict)
        for p_idx, c_idx, conf, ok in continuations or ():
            conts[int(p_idx)][int(c_idx)] = (float(conf), bool(ok))
        cap = int(settings.get("n_max", 16))
        positions = tuple(position_traces(per_prompt.get(i, []), conts.get(i), cap) for i in range(len(infos)))
    return RunProfile(
        run=run, draft=draft, model=model, draft_step_raw_s=raw, first_draft_step_s=first_step,
        calibrated=calibrated, ar_forward_s=ar_forward, engine_overhead_s=fit.intercept_s,
        cycle_overhead_s=cycle_overhead,
        forward_overhead_s=fit.per_forward_s, sequence_overhead_s=max(trimmed_mean(sequence), 0.0) if sequence else 0.0,
        prompts=infos, prefill_target_s=prefill_t, prefill_draft_s=prefill_d,
        positions=positions, after_rejection=_after_rejection(traces), max_new_tokens=max_new,
    )


def run_drafts(run: RunRecord) -> list[str]:
    """Names of the drafts profiled in ``run``, in profiling order."""
    return run.draft_names


def resolve_draft(run: RunRecord, draft: str | None) -> str:
    """The run's draft called ``draft`` (default: its first), or a one-line error listing them."""
    return run.resolve_draft(draft)


def greedy_prompts(db: Database, run_id: int) -> list[PromptInfo] | None:
    """Per-prompt greedy output lengths stored with the run's measured baseline, if any."""
    from specdec_tune.db import list_measured

    for m in list_measured(db, run_id):
        if m.draft is None and isinstance(m.config.get("prompts"), list):  # the profile's hooked baseline
            return [PromptInfo(int(p["prompt_tokens"]), int(p["new_tokens"])) for p in m.config["prompts"]]
    return None


def load_run_profile(
    db: Database, run_id: int, draft: str | None = None, *, baseline_only: bool = False, calibrate: bool = True
) -> RunProfile:
    """Read everything about ``draft`` in run ``run_id`` and build its :class:`RunProfile`.

    Args:
        db: the results database.
        run_id: a profile run.
        draft: one of the run's drafts (default: the first); ignored with ``baseline_only``.
        baseline_only: target-only profile (plain decoding predictions).

    Raises:
        NotFoundError: no such run, or the draft is not in it.
    """
    from specdec_tune.db import get_run, load_acceptance, load_timings, load_traces

    run = get_run(db, run_id)
    name = None if baseline_only else resolve_draft(run, draft)
    timings = load_timings(db, run_id)
    traces = load_traces(db, run_id, name, "greedy") if name else []
    sampling, tv, continuations, in_loop = None, None, None, None
    if name:
        for rec in load_acceptance(db, run_id, draft=name, mode="greedy"):
            continuations = rec.confidence_bins.get("continuations")
            in_loop = rec.confidence_bins.get("in_loop")
        for rec in load_acceptance(db, run_id, draft=name, mode="sampling"):
            sampling = load_traces(db, run_id, name, "sampling", temperature=rec.temperature) or None
            tv = rec.one_minus_tv
    return build_run_profile(run, name, timings, traces, prompts=greedy_prompts(db, run_id),
                             sampling_traces=sampling, sampling_acceptance=tv, continuations=continuations,
                             in_loop=in_loop, calibrate=calibrate)


# --------------------------------------------------------------------------- predictions


def _prompt_subset(rp: RunProfile, max_prompts: int | None) -> range:
    count = len(rp.prompts)
    if max_prompts is not None:
        if max_prompts < 1:
            raise InputError(f"max_prompts must be >= 1, got {max_prompts}")
        count = min(count, max_prompts)
    return range(count)


@dataclass(frozen=True)
class PromptSpec:
    """A prompt to predict: its length, its output length, and whether the profile ran it.

    Attributes:
        prompt_tokens: T_p, tokens of the prompt.
        new_tokens: tokens it will produce (``None``: the run's ``max_new_tokens``; EOS is rare in 64
            tokens on the bundled workloads and unknown for a prompt the profile did not decode).
        profiled_index: its index among the run's profiled prompts (``None``: not profiled), so its
            own traces and prefill timings are used instead of the pooled ones.
    """

    prompt_tokens: int
    new_tokens: int | None = None
    profiled_index: int | None = None


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys on xs; a constant when xs do not vary."""
    if not xs:
        return 0.0, 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope < 0:  # noise over similar lengths: a prefill does not get cheaper with a longer prompt
        return my, 0.0
    return my - slope * mx, slope


def _prefill_fits(rp: RunProfile) -> tuple[tuple[float, float], tuple[float, float]]:
    """Prefill cost as a line in the prompt length, fitted to the profiled prompts' (calibrated) prefills.

    Prefill of a short prompt on one sequence is close to linear in its length; a fitted line also
    extrapolates to held-out prompts longer or shorter than every profiled one (interpolation between
    measured lengths would clamp at the ends).
    """
    lengths = [p.prompt_tokens for p in rp.prompts]
    target = _line([t - 1 for t in lengths], list(rp.prefill_target_s))
    draft = _line(lengths, list(rp.prefill_draft_s))
    return target, draft


def _prefill(rp: RunProfile, spec: PromptSpec, fits) -> tuple[float, float]:
    """(target prefill of T_p - 1 tokens, draft prefill of T_p tokens) of one prompt."""
    i = spec.profiled_index
    if i is not None:
        return rp.prefill_target_s[i], rp.prefill_draft_s[i]
    (at, bt), (ad, bd) = fits
    draft = max(ad + bd * spec.prompt_tokens, 0.0) if any(rp.prefill_draft_s) else 0.0
    return max(at + bt * (spec.prompt_tokens - 1), 0.0), draft


def _check_specs(rp: RunProfile, specs: Sequence[PromptSpec]) -> list[PromptSpec]:
    if not specs:
        raise InputError("no prompts to predict")
    out = []
    for s in specs:
        if s.profiled_index is not None and not 0 <= s.profiled_index < len(rp.prompts):
            raise InputError(f"prompt index {s.profiled_index} is not one of the run's {len(rp.prompts)} profiled prompts")
        if s.prompt_tokens < 1 or (s.new_tokens is not None and s.new_tokens < 1):
            raise InputError(f"a prompt needs >= 1 prompt and new tokens, got {s}")
        new = s.new_tokens
        if new is None:
            new = rp.prompts[s.profiled_index].new_tokens if s.profiled_index is not None else rp.max_new_tokens
        out.append(PromptSpec(s.prompt_tokens, new, s.profiled_index))
    return out


def _baseline(rp: RunProfile, specs: Sequence[PromptSpec], batch_size: int) -> RunPrediction:
    forward = rp.ar_forward_s if batch_size == 1 and rp.ar_forward_s else verify_time(rp.model, batch_size, 1)
    step = forward + rp.model.ar_overhead_s
    fits = _prefill_fits(rp)
    tokens = sum(s.new_tokens for s in specs)
    prefill = sum(_prefill(rp, s, fits)[0] for s in specs) * batch_size  # B prompts prefill ~B times the work
    seconds = prefill + tokens * step
    tps = batch_size * tokens / seconds
    return RunPrediction(
        tokens_per_s=tps, decode_tokens_per_s=batch_size / step, speedup=1.0, baseline_tokens_per_s=tps,
        expected_tokens_per_cycle=1.0, expected_draft_length=0.0, expected_draft_forwards=0.0,
        cycle_time_s=step, seconds=seconds, new_tokens=batch_size * tokens, source="baseline",
        in_sample=all(s.profiled_index is not None for s in specs), prompts=len(specs),
        cycles=float(tokens - len(specs)),
    )


def _mix(groups: Sequence[tuple[ReplayStats, float]], n: int) -> tuple[float, float, float, tuple[float, ...]]:
    """(E[τ], E[L], E[F], α_i) of cycles drawn from several groups, weighted by their cycle counts."""
    total = sum(w for _, w in groups)
    tau = sum(st.mean_tau * w for st, w in groups) / total
    length = sum(st.mean_draft_length * w for st, w in groups) / total
    forwards = sum(st.mean_draft_forwards * w for st, w in groups) / total
    reached = [sum(st.reached[i] * w for st, w in groups) for i in range(n)]
    accepted = [sum(st.accepted[i] * w for st, w in groups) for i in range(n)]
    return tau, length, forwards, tuple(a / r if r > 0 else math.nan for a, r in zip(accepted, reached))


def _predict(rp: RunProfile, config: SpecConfig, specs: Sequence[PromptSpec]) -> RunPrediction:
    """Predict ``config`` end to end on ``specs`` (profiled prompts exactly, the others pooled)."""
    if rp.draft is None:
        raise InputError("a draft is needed to predict speculative decoding")
    specs = _check_specs(rp, specs)
    b = config.batch_size
    base = _baseline(rp, specs, b)
    if config.num_speculative_tokens == 0:
        return base
    n = config.num_speculative_tokens
    n_max = int(rp.run.settings.get("n_max", 0)) or max((len(t.confidences) for t in rp.model.traces), default=0)
    if n > n_max:
        raise InputError(f"N={n} exceeds the run's N_max={n_max}; profile with a larger --n-max")
    tokens = sum(s.new_tokens for s in specs)
    in_sample = all(s.profiled_index is not None for s in specs)
    if config.mode == "greedy" and rp.positions is not None:
        def simulate(i: int) -> list[tuple[int, int, int]]:
            return simulate_prompt(rp.positions[i], rp.prompts[i].new_tokens, rp.max_new_tokens, n, config.threshold,
                                   config.schedule, rp.tail_rate(config.threshold), config.threshold_rule)

        def cycle_s(cycles: Sequence[tuple[int, int, int]]) -> float:
            return sum(f * draft_step_time(rp.model, b) + verify_time(rp.model, b, length + 1) + rp.cycle_overhead_s
                       for length, _, f in cycles)

        exact = [c for s in specs if s.profiled_index is not None for c in simulate(s.profiled_index)]
        decode_s = cycle_s(exact)
        groups: list[tuple[ReplayStats, float]] = [(stats_from_cycles(exact, n), len(exact))] if exact else []
        pooled_tokens = sum(s.new_tokens for s in specs if s.profiled_index is None)
        source = "simulation"
        if pooled_tokens:
            # A prompt the profile did not decode: the cycles of every profiled prompt, pooled. Seconds
            # and cycles per emitted token are ratios over those prompts (end of sequence included).
            pool = [c for i in range(len(rp.prompts)) for c in simulate(i)]
            if not pool:
                raise InputError(f"run {rp.run.id} has no greedy traces for draft {rp.draft!r}")
            pool_tokens = sum(p.new_tokens for p in rp.prompts)
            decode_s += pooled_tokens * cycle_s(pool) / pool_tokens
            groups.append((stats_from_cycles(pool, n), pooled_tokens * len(pool) / pool_tokens))
            source = f"simulation pooled over {len(rp.prompts)} profiled prompts"
        if not groups:
            raise InputError(f"run {rp.run.id} has no greedy traces for draft {rp.draft!r}")
        cycles = sum(w for _, w in groups)
        tau, length, forwards, alphas = _mix(groups, n)
        cycle_time = decode_s / cycles
    else:
        p = model_predict(rp.model, config)
        cycles = tokens / p.expected_tokens_per_cycle
        cycle_time = p.cycle_time_s
        decode_s = cycles * cycle_time
        tau, length, forwards, alphas = (p.expected_tokens_per_cycle, p.expected_draft_length,
                                         p.expected_draft_forwards, p.acceptance_per_position)
        source = p.source
    raw_step = rp.first_draft_step_s.get(b, 0.0)
    fits = _prefill_fits(rp)
    # The first draft forward of a sequence is the draft's prefill, which replaces one draft step.
    prefill = sum(sum(_prefill(rp, s, fits)) - raw_step for s in specs) * b
    setup = len(specs) * (rp.sequence_overhead_s - rp.cycle_overhead_s)
    seconds = decode_s + prefill + setup
    tps = b * tokens / seconds
    return RunPrediction(
        tokens_per_s=tps, decode_tokens_per_s=b * tokens / decode_s if decode_s > 0 else math.inf,
        speedup=tps / base.tokens_per_s, baseline_tokens_per_s=base.tokens_per_s,
        expected_tokens_per_cycle=tau, expected_draft_length=length, expected_draft_forwards=forwards,
        cycle_time_s=cycle_time, seconds=seconds, new_tokens=b * tokens, acceptance_per_position=tuple(alphas),
        source=source, in_sample=in_sample, prompts=len(specs), cycles=float(cycles),
    )


def profiled_specs(rp: RunProfile, max_prompts: int | None = None) -> list[PromptSpec]:
    """The run's own profiled prompts (first ``max_prompts``) as :class:`PromptSpec` (exact replay)."""
    return [PromptSpec(rp.prompts[i].prompt_tokens, rp.prompts[i].new_tokens, i) for i in _prompt_subset(rp, max_prompts)]


def predict_baseline(rp: RunProfile, batch_size: int = 1, max_prompts: int | None = None) -> RunPrediction:
    """Plain decoding end to end: Σ_p prefill(T_p - 1) + M_p·(T_ar + per-token overhead)."""
    return _baseline(rp, _check_specs(rp, profiled_specs(rp, max_prompts)), batch_size)


def predict_config(rp: RunProfile, config: SpecConfig, max_prompts: int | None = None) -> RunPrediction:
    """Predict one configuration end to end on the profiled prompts (first ``max_prompts``).

    N = 0 is plain decoding (:func:`predict_baseline`). With a model draft in greedy mode every
    profiled prompt's cycles are replayed exactly from its own traces.

    Raises:
        InputError: the run lacks what the configuration needs (batch size, N beyond N_max, traces).
    """
    return _predict(rp, config, profiled_specs(rp, max_prompts))


def split_specs(rp: RunProfile, split: str, max_prompts: int | None = None) -> list[PromptSpec]:
    """The prompts of ``split`` of the run's workload as :class:`PromptSpec`, without a tokenizer.

    Uses the lengths the profile stored for every workload prompt (``workload_prompt_tokens``);
    profiled prompts keep their index (exact replay), the others are predicted from the profiled ones.
    Output lengths are left to :func:`predict_prompts` (``max_new_tokens`` for unprofiled prompts).

    Raises:
        InputError: a bad split, or a run profiled before prompt lengths were stored.
    """
    stored = rp.run.settings.get("workload_prompt_tokens")
    if not stored:
        raise InputError(f"run {rp.run.id} does not store its workload's prompt lengths; profile it again")
    index = {pid: i for i, pid in enumerate(rp.run.settings.get("prompt_ids", []))}
    chosen = split_prompts([(str(pid), int(n)) for pid, n in stored], split)
    if max_prompts is not None:
        chosen = chosen[:max_prompts]
    return [PromptSpec(n, None, index.get(pid)) for pid, n in chosen]


def predict_prompts(
    rp: RunProfile, config: SpecConfig, prompts: Sequence[PromptSpec | tuple[int, int | None]]
) -> RunPrediction:
    """Predict ``config`` end to end on any prompts, given their lengths (no model is run).

    Prompts the profile did not decode (tuples, or a :class:`PromptSpec` without ``profiled_index``)
    are predicted from the profiled ones, which is what makes a held-out prediction honest: no timing
    or trace of those prompts is used.

    - Cycles: greedy with a model draft, the exact cycle replays of all profiled prompts are pooled
      into one cycle distribution; seconds and cycles per emitted token are its ratios (so the end of
      sequence at ``max_new_tokens`` is included as the profiled prompts met it). Sampling and
      n-gram: the i.i.d. trace replay, as for profiled prompts.
    - Prefill: target (T_p - 1 tokens) and draft (T_p tokens) from a least-squares line in the prompt
      length through the profiled prompts' calibrated prefill times.
    - Output length: ``new_tokens``, or ``max_new_tokens`` of the run when ``None``.
    - Per-call set-up and engine overheads: the profile's, as for profiled prompts.

    Args:
        rp: a run profile (:func:`load_run_profile`); for plain decoding any draft's will do.
        config: the configuration (N = 0: plain decoding).
        prompts: ``(prompt_tokens, new_tokens or None)`` pairs or :class:`PromptSpec`.

    Raises:
        InputError: empty or invalid prompts, or a configuration the run cannot predict.
    """
    specs = [p if isinstance(p, PromptSpec) else PromptSpec(int(p[0]), None if p[1] is None else int(p[1]))
             for p in prompts]
    if config.num_speculative_tokens == 0:
        return _baseline(rp, _check_specs(rp, specs), config.batch_size)
    return _predict(rp, config, specs)


THRESHOLD_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def best_configs(
    rp: RunProfile,
    n_values: Iterable[int] | None = None,
    thresholds: Iterable[float] = THRESHOLD_GRID,
    batch_size: int = 1,
    mode: str = "greedy",
    top: int = 3,
) -> list[tuple[SpecConfig, RunPrediction]]:
    """The ``top`` configurations by predicted end-to-end tokens/s over N × θ (best first)."""
    n_max = int(rp.run.settings.get("n_max", 16))
    ns = list(n_values) if n_values is not None else list(range(1, n_max + 1))
    thetas = list(thresholds) if not rp.is_ngram else [0.0]  # n-gram confidences are all 1
    scored = []
    for n in ns:
        for theta in thetas:
            config = SpecConfig(n, theta, batch_size=batch_size, mode=mode)  # type: ignore[arg-type]
            try:
                scored.append((config, predict_config(rp, config)))
            except InputError:
                continue
    scored.sort(key=lambda cp: -cp[1].tokens_per_s)
    return scored[:top]
