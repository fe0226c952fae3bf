"""End-to-end predictions of a configuration from a :class:`RunProfile`, as ``measure`` observes them.

``specdec-tune measure`` reports new tokens / wall seconds of whole decode calls, prefill included.
The predictions here count the same things, so predicted and measured numbers compare directly:

    seconds = Σ_prompts [prefill_target(T_p - 1) + prefill_draft(T_p) - T_s + set-up]
              + Σ_cycles [F·(T_s + o_f) + T_v(L + 1) + o_c]

where L is the cycle's proposed length, F its draft forwards (L, or L + 1 when θ cut the draft), o_c
and o_f the measured per-cycle and per-draft-forward engine overheads, T_s and T_v(k) the calibrated
micro-benchmark medians (:mod:`._profile`), and the first draft forward of a sequence is its prefill.
The baseline is the same sum for plain decoding: prefill + M·(T_ar + per-token overhead) - T_ar (the prefill
gives the first token: M tokens take M - 1 forwards after it). ``decode_tokens_per_s`` leaves prefill and set-up out.

Which cycles: in greedy mode with a model draft the cycles are *simulated* exactly per prompt
(:mod:`._greedy_sim`): greedy decoding is deterministic, so the draft's roll-out from any position of
the output is a suffix of a recorded θ = 0, N = N_max cycle, and replaying the engine's loop over those
position traces gives every cycle's (L, A, F) for any N ≤ N_max, θ and schedule on the profiled
prompts, end of sequence included. Only what a N_max cycle never saw is estimated: confidences past
its last drafted token (continued with the measured rate of confidences ≥ θ after a rejection).
Otherwise (sampling, n-gram lookup, synthetic acceptance) the cycles come from :func:`predict` (i.i.d.
trace replay, or the given rates) with M_p / E[τ] cycles per prompt.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specdec_tune.core.errors import InputError
from specdec_tune.core.splits import split_prompts
from specdec_tune.tuner.model._greedy_sim import SimulatedCycle, simulate_prompt, stats_from_cycles
from specdec_tune.tuner.model._prefill import prefill_fits, prompt_prefill
from specdec_tune.tuner.model._profile import RunProfile
from specdec_tune.tuner.model._replay import ReplayStats
from specdec_tune.tuner.model._suffix_predict import simulates_suffix, suffix_prompt_cycles
from specdec_tune.tuner.model._throughput import Prediction, SpecConfig, draft_seconds, verify_time
from specdec_tune.tuner.model._throughput import predict as model_predict

@dataclass(frozen=True, kw_only=True)
class RunPrediction(Prediction):
    """Predicted end-to-end throughput of one configuration on the profiled prompts.

    The decode-only :class:`Prediction`'s fields, counted end to end as ``measure`` counts them:
    ``tokens_per_s`` is new tokens / seconds of whole decode calls (prefill included), ``speedup`` is
    over plain decoding end to end, ``cycle_time_s`` stays E[T_cycle] of decoding only, and ``source``
    is ``simulation`` (greedy, exact cycle replay), the model's ``traces`` / ``sampling_traces`` /
    ``tv``, or ``baseline``.

    Attributes:
        decode_tokens_per_s: the throughput without prefill and per-call set-up.
        seconds: predicted wall seconds over the prompts.
        new_tokens: tokens those prompts produce (× batch size).
        in_sample: every prompt predicted was one the profile ran.
        prompts: prompts predicted.
        cycles: decode cycles of one request per prompt, summed over the prompts (plain decoding: one
            per token after the prefill's). At batch size 1, ``(new_tokens - prompts) / cycles`` is
            the tokens per decode step after the first token, as a server counts its steps
            (``tuner.servers.acceptance_terms``).
        machine_speed: the factor the rates were rescaled by for a machine running at another speed
            than during the profile (:func:`at_machine_speed`; 1.0: as profiled).
    """

    decode_tokens_per_s: float
    seconds: float
    new_tokens: int
    source: str = "simulation"
    in_sample: bool = True
    prompts: int = 0
    cycles: float = 0.0
    machine_speed: float = 1.0


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


def _prompt_subset(rp: RunProfile, max_prompts: int | None) -> range:
    count = len(rp.prompts)
    if max_prompts is not None:
        if max_prompts < 1:
            raise InputError(f"max_prompts must be >= 1, got {max_prompts}")
        count = min(count, max_prompts)
    return range(count)


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


def context_cost(rp: RunProfile, k: int, context: float, batch_size: int) -> float:
    """Seconds a verify of ``k`` tokens costs at ``context`` beyond the typical context (B = 1; the
    profile's verify timings at several contexts, ``RunProfile.context_cost``; 0 at B > 1)."""
    return rp.context_cost(k, context) if batch_size == 1 else 0.0


def plain_forward_s(rp: RunProfile, batch_size: int, prompt_tokens: int, new_tokens: int) -> float:
    """One plain decoding forward of a request: T_ar (or T_v(B, 1)) at its mean context."""
    forward = rp.ar_forward_s if batch_size == 1 and rp.ar_forward_s else verify_time(rp.model, batch_size, 1)
    return forward + context_cost(rp, 1, prompt_tokens + new_tokens / 2, batch_size)


def plain_step_s(rp: RunProfile, batch_size: int, prompt_tokens: int, new_tokens: int) -> float:
    """One plain decoding step of a request: T_ar (or T_v(B, 1)) + the loop's overhead, at its mean context."""
    return plain_forward_s(rp, batch_size, prompt_tokens, new_tokens) + rp.model.ar_overhead_s


def plain_seconds(rp: RunProfile, batch_size: int, prompt_tokens: int, new_tokens: int) -> float:
    """A plain decode's steps after its prefill: M picks (the loop's overhead) and M - 1 forwards, the prefill
    having given the first token's logits (``engine.decode.autoregressive``)."""
    return new_tokens * plain_step_s(rp, batch_size, prompt_tokens, new_tokens) \
        - plain_forward_s(rp, batch_size, prompt_tokens, new_tokens)


def cycle_s(rp: RunProfile, c: SimulatedCycle, b: int, context: float | None = None, checked: bool = False) -> float:
    """One simulated cycle's seconds: the draft's F forwards (F·T_s, their warm-up and, with θ > 0 checking each
    (``checked``), the check's cost: :func:`draft_seconds`) + T_v(L + 1) + o_c, with the verify at ``context``
    (tokens in the target's cache) where given."""
    extra = context_cost(rp, c.proposed + 1, context, b) if context is not None else 0.0
    return draft_seconds(rp.model, b, c.forwards, checked) + verify_time(rp.model, b, c.proposed + 1) \
        + rp.cycle_overhead_s + extra


def context_slope(rp: RunProfile, k: int, b: int) -> float:
    """Seconds per context token of a verify of ``k`` tokens (0 at B > 1 or where not measured)."""
    return context_cost(rp, k, rp.typical_context + 1, b) if rp.typical_context else 0.0


def timed_cycles(rp: RunProfile, cycles: Sequence[SimulatedCycle], b: int, prompt_tokens: int, checked: bool = False
                 ) -> tuple[list[float], list[float]]:
    """Each simulated cycle's seconds with its verify at its own context (the prompt + the tokens
    emitted before it), and what each would cost more per extra prompt token (its verify's slope);
    ``checked``: θ > 0 reads every draft forward's confidence."""
    times, slopes, emitted = [], [], 0
    for c in cycles:
        times.append(cycle_s(rp, c, b, prompt_tokens + emitted, checked))
        slopes.append(context_slope(rp, c.proposed + 1, b))
        emitted += c.accepted + 1
    return times, slopes


def replay_width(config: SpecConfig, tokens_per_cycle: float) -> int:
    """The verify width a replayed cycle is costed at for its context: the tokens it emits plus the
    rejected one, within N + 1."""
    return max(1, min(config.spec.num_speculative_tokens + 1, round(tokens_per_cycle) + 1))


def _baseline(rp: RunProfile, specs: Sequence[PromptSpec], batch_size: int) -> RunPrediction:
    step = plain_step_s(rp, batch_size, rp.typical_context, 0)  # at the typical context
    fits = prefill_fits(rp)
    tokens = sum(s.new_tokens for s in specs)
    prefill = sum(prompt_prefill(rp, s.profiled_index, s.prompt_tokens, fits)[0] for s in specs) * batch_size  # B prompts prefill ~B times the work
    seconds = prefill + sum(rp.plain_setup_s + plain_seconds(rp, batch_size, s.prompt_tokens, s.new_tokens)
                            for s in specs)
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


@dataclass(frozen=True)
class _Cycles:
    """The decode cycles of a prediction: total seconds, count and the acceptance they imply."""

    decode_s: float
    cycles: float
    cycle_time_s: float
    tau: float
    length: float
    forwards: float
    alphas: tuple[float, ...]
    source: str


def simulate_config(rp: RunProfile, config: SpecConfig, i: int, pooled: bool = False) -> list[SimulatedCycle]:
    """Profiled prompt ``i``'s greedy cycles under ``config``, every rule of it (threshold kind, step and
    rule, schedule): the one simulation call of the throughput and the latency predictions. Suffix decoding
    replays the stored sequences (:mod:`._suffix_predict`): in profile order, or for the pool a held-out
    prompt is predicted from (``pooled``), each prompt after every other one (a warm history)."""
    if simulates_suffix(rp, config):
        return list(suffix_prompt_cycles(rp, config, i, "warm" if pooled else "order"))
    assert rp.positions is not None
    c = config.spec
    return simulate_prompt(rp.positions[i], rp.prompts[i].new_tokens, rp.max_new_tokens, c.num_speculative_tokens,
                           c.threshold, c.schedule, rp.tail_rate, c.threshold_rule, c.threshold_kind, c.threshold_step)


def _simulated(rp: RunProfile, config: SpecConfig, specs: Sequence[PromptSpec]) -> _Cycles:
    """Greedy with a model draft: every profiled prompt's cycles simulated exactly; the others pooled."""
    n, b = config.spec.num_speculative_tokens, config.batch_size

    def timed(i: int, pooled: bool = False) -> tuple[list[SimulatedCycle], float, float]:
        """Prompt i's cycles, their seconds (each verify at its own context) and their extra seconds per
        extra prompt token."""
        cycles = simulate_config(rp, config, i, pooled)
        times, slopes = timed_cycles(rp, cycles, b, rp.prompts[i].prompt_tokens, config.spec.threshold > 0)
        return cycles, sum(times), sum(slopes)

    exact, decode_s = [], 0.0
    for s in specs:
        if s.profiled_index is not None:
            cycles, seconds, _ = timed(s.profiled_index)
            exact += cycles
            decode_s += seconds
    groups: list[tuple[ReplayStats, float]] = [(stats_from_cycles(exact, n), len(exact))] if exact else []
    pooled_tokens = sum(s.new_tokens for s in specs if s.profiled_index is None)
    source = "simulation"
    if pooled_tokens:
        # A prompt the profile did not decode: the cycles of every profiled prompt, pooled. Seconds
        # and cycles per emitted token are ratios over those prompts (end of sequence included).
        per_prompt = [timed(i, True) for i in range(len(rp.prompts))]  # each simulated once, whatever the specs
        pool = [c for cycles, _, _ in per_prompt for c in cycles]
        if not pool:
            raise InputError(f"run {rp.run.id} has no greedy traces for draft {rp.draft!r}")
        pool_tokens = sum(p.new_tokens for p in rp.prompts)
        for s in (s for s in specs if s.profiled_index is None):  # every profiled prompt moved to its length
            pooled_s = sum(seconds + slope * (s.prompt_tokens - p.prompt_tokens)
                           for (_, seconds, slope), p in zip(per_prompt, rp.prompts))
            decode_s += s.new_tokens * pooled_s / pool_tokens
        groups.append((stats_from_cycles(pool, n), pooled_tokens * len(pool) / pool_tokens))
        source = f"simulation pooled over {len(rp.prompts)} profiled prompts"
    if not groups:
        raise InputError(f"run {rp.run.id} has no greedy traces for draft {rp.draft!r}")
    cycles = sum(w for _, w in groups)
    tau, length, forwards, alphas = _mix(groups, n)
    return _Cycles(decode_s, cycles, decode_s / cycles, tau, length, forwards, alphas, source)


def _replayed(rp: RunProfile, config: SpecConfig, specs: Sequence[PromptSpec]) -> _Cycles:
    """Sampling or n-gram lookup: i.i.d. trace replay (:func:`predict`), M_p / E[τ] cycles per prompt,
    each prompt's at its mean context."""
    p = model_predict(rp.model, config)
    k = replay_width(config, p.expected_tokens_per_cycle)
    decode_s = sum(s.new_tokens / p.expected_tokens_per_cycle
                   * (p.cycle_time_s + context_cost(rp, k, s.prompt_tokens + s.new_tokens / 2, config.batch_size))
                   for s in specs)
    cycles = sum(s.new_tokens for s in specs) / p.expected_tokens_per_cycle
    return _Cycles(decode_s, cycles, decode_s / cycles, p.expected_tokens_per_cycle, p.expected_draft_length,
                   p.expected_draft_forwards, tuple(p.acceptance_per_position), p.source)


CyclesFn = Callable[[RunProfile, SpecConfig, Sequence[PromptSpec], int], "_Cycles"]


def _predict(rp: RunProfile, config: SpecConfig, specs: Sequence[PromptSpec], cycles: CyclesFn | None = None) -> RunPrediction:
    """Predict ``config`` end to end on ``specs`` (profiled prompts exactly, the others pooled).

    ``cycles`` replaces the chain's cycles (token trees and staged drafting, :mod:`._tree_predict`):
    it gets the profile, the config, the checked prompts and their new tokens."""
    if rp.draft is None:
        raise InputError("a draft is needed to predict speculative decoding")
    specs = _check_specs(rp, specs)
    b = config.batch_size
    base = _baseline(rp, specs, b)
    if config.spec.num_speculative_tokens == 0:
        return base
    n = config.spec.num_speculative_tokens
    if rp.model.synthetic_acceptance is not None:  # given rates: any N whose verify forward was timed
        k_max = max(max(curve) for curve in rp.model.verify_s.values())
        if n + 1 > k_max:
            raise InputError(f"N={n} needs T_v({n + 1}); run {rp.run.id} timed k up to {k_max} (profile with --k-max)")
    else:
        n_max = rp.run.settings.n_max
        if n > n_max:
            raise InputError(f"N={n} exceeds the run's N_max={n_max}; profile with a larger --n-max")
    tokens = sum(s.new_tokens for s in specs)
    simulated = config.mode == "greedy" and (rp.positions is not None or simulates_suffix(rp, config))
    if cycles is not None:
        cyc = cycles(rp, config, specs, tokens)
    else:
        cyc = _simulated(rp, config, specs) if simulated else _replayed(rp, config, specs)
    fits = prefill_fits(rp)
    # The first draft forward of a sequence is the draft's prefill, which replaces one draft step.
    raw_step = rp.first_draft_step_s.get(b, 0.0)
    prefill = sum(sum(prompt_prefill(rp, s.profiled_index, s.prompt_tokens, fits)) - raw_step for s in specs) * b
    seconds = cyc.decode_s + prefill + len(specs) * (rp.sequence_s(config.spec.threshold > 0) - rp.cycle_overhead_s)
    tps = b * tokens / seconds
    return RunPrediction(
        tokens_per_s=tps, decode_tokens_per_s=b * tokens / cyc.decode_s if cyc.decode_s > 0 else math.inf,
        speedup=tps / base.tokens_per_s, baseline_tokens_per_s=base.tokens_per_s,
        expected_tokens_per_cycle=cyc.tau, expected_draft_length=cyc.length, expected_draft_forwards=cyc.forwards,
        cycle_time_s=cyc.cycle_time_s, seconds=seconds, new_tokens=b * tokens,
        acceptance_per_position=tuple(cyc.alphas), source=cyc.source,
        in_sample=all(s.profiled_index is not None for s in specs), prompts=len(specs), cycles=float(cyc.cycles),
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
    stored = rp.run.settings.workload_prompt_tokens
    if not stored:
        raise InputError(f"run {rp.run.id} does not store its workload's prompt lengths; profile it again")
    index = {pid: i for i, pid in enumerate(rp.run.settings.prompt_ids)}
    chosen = split_prompts(list(stored), split)
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
    if config.spec.num_speculative_tokens == 0:
        return _baseline(rp, _check_specs(rp, specs), config.batch_size)
    return _predict(rp, config, specs)
