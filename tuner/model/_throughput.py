"""Analytic throughput model of speculative decoding (docs/architecture.md, The throughput model).
Pure Python, no torch.

Seed formulas (shared/seeds 000 and 002), constant acceptance α and N drafted tokens::

    E[τ] = (1 - α^(N+1)) / (1 - α)            tokens per cycle (N + 1 when α = 1)
    throughput = E[τ] / (N·T_s + T_v)

Generalisations implemented here:

1. per-position acceptance, E[τ] = 1 + Σ_{k=1..N} Π_{i≤k} α_i (:func:`tokens_per_cycle_per_position`);
2. the measured verify curve T_v(B, k) instead of one constant (:func:`verify_time`);
3. the threshold θ by replaying θ = 0 traces (:func:`replay`), which also gives E[L], the number of
   draft forwards and the distribution of L for E[T_v(L + 1)];
4. throughput as a ratio of expectations (renewal-reward): B·E[τ] / E[T_cycle], not E[τ / T_cycle];
5. speedup = predicted tokens/s ÷ baseline tokens/s, baseline = B / (T_v(B, 1) + ar_overhead_s),
   i.e. plain autoregressive decoding at the same batch size with its own per-token overhead;
6. sampling mode: traces recorded in sampling mode when the profile has them, else constant
   α = 1 - E[TV(p, q)] from a teacher-forced pass (Leviathan et al. 2023);
7. batch size B in lock-step: every one of the B sequences is assumed to run the same cycle
   structure, so a cycle costs F·T_s(B) + T_v(B, L + 1) + overhead and yields B·τ tokens. This is an
   approximation: real batched engines pad to the longest draft of the batch and each sequence
   accepts its own prefix, so at large B with θ > 0 the model is optimistic about verify cost.

The draft step time is taken at the workload's typical context length (what the profiler measures);
its growth with context is not modelled.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from specdec_tune.errors import InputError
from specdec_tune.tuner.model._replay import ReplayStats, Trace, alpha_stats, constant_alpha_stats, heuristic_stationary
from specdec_tune.tuner.model._replay import mix, replay

__all__ = [
    "ModelProfile", "Prediction", "ReplayStats", "SpecConfig", "Trace", "alphas_from_traces",
    "baseline_tokens_per_s", "best_n_per_batch_size", "closed_form_tokens_per_cycle",
    "draft_step_time", "heuristic_stationary", "predict", "rank_configs", "relative_error",
    "replay", "tokens_per_cycle_per_position", "verify_time",
]


def _check_time(what: str, value: float, allow_zero: bool) -> None:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        kind = "non-negative" if allow_zero else "positive"
        raise InputError(f"{what}={value!r} must be a finite {kind} number of seconds")


@dataclass(frozen=True)
class ModelProfile:
    """Everything the model needs about one (target, draft, hardware, workload).

    Attributes:
        draft_step_s: batch size B -> T_s(B), seconds of one draft forward producing one token, at the
            workload's typical context. Empty means a free drafter (n-gram lookup).
        verify_s: B -> {k -> T_v(B, k)}, seconds of one target forward over k new tokens, k = 1..K_max.
            T_v(B, 1) is the autoregressive step; T_ar = verify_s[1][1].
        traces: greedy cycles recorded with θ = 0 and N = N_max.
        cycle_overhead_s: engine time per speculative cycle that is neither a draft nor a target forward.
        ar_overhead_s: engine time per token of the plain decoding loop besides the target forward.
        sampling_acceptance: 1 - E[TV(p, q)] from a teacher-forced pass (sampling mode).
        sampling_traces: cycles recorded in sampling mode; preferred over ``sampling_acceptance``.
        name: the draft's name.
        synthetic_acceptance: given conditional rates α_1, α_2, ... (the last repeats) that replace the
            greedy traces: synthetic acceptance, for model shapes with random weights. Predictions
            from them carry ``source="synthetic"``.
    """

    draft_step_s: Mapping[int, float]
    verify_s: Mapping[int, Mapping[int, float]]
    traces: Sequence[Trace] = ()
    cycle_overhead_s: float = 0.0
    ar_overhead_s: float = 0.0
    sampling_acceptance: float | None = None
    sampling_traces: Sequence[Trace] | None = None
    name: str = ""
    synthetic_acceptance: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for b, t in self.draft_step_s.items():
            _check_time(f"draft_step_s[{b}]", t, allow_zero=True)
        if not self.verify_s:
            raise InputError("verify_s is empty; the profile needs at least T_v(B, 1) for one batch size")
        for b, curve in self.verify_s.items():
            if b < 1:
                raise InputError(f"verify_s batch size {b!r} must be >= 1")
            if 1 not in curve:
                raise InputError(f"verify_s[{b}] lacks k=1 (the autoregressive step time)")
            for k, t in curve.items():
                _check_time(f"verify_s[{b}][{k}]", t, allow_zero=False)
        _check_time("cycle_overhead_s", self.cycle_overhead_s, allow_zero=True)
        _check_time("ar_overhead_s", self.ar_overhead_s, allow_zero=True)
        a = self.sampling_acceptance
        if a is not None and not 0.0 <= a <= 1.0:
            raise InputError(f"sampling_acceptance={a!r} must lie in [0, 1]")
        rates = self.synthetic_acceptance
        if rates is not None and (not rates or any(not 0.0 <= r <= 1.0 for r in rates)):
            raise InputError(f"synthetic_acceptance={rates!r} must be rates in [0, 1]")


@dataclass(frozen=True)
class SpecConfig:
    """One speculative decoding configuration.

    Attributes:
        num_speculative_tokens: N >= 0, the most tokens drafted per cycle; 0 means plain decoding.
        threshold: θ in [0, 1); drafting stops at the first token whose draft confidence is below θ.
        schedule: 'constant' (N every cycle) or 'heuristic' (N_cur += 2 after a fully accepted
            draft, else N_cur -= 1, kept in 1..N).
        batch_size: B >= 1 sequences decoded together.
        mode: 'greedy' or 'sampling'.
        threshold_rule: 'before' (the engine's default: the position whose top draft probability is
            below θ is not drafted) or 'hf' (transformers' rule: that token is proposed, then drafting
            stops); see ``specdec_tune.schedules.threshold_cut``.
    """

    num_speculative_tokens: int
    threshold: float = 0.0
    schedule: Literal["constant", "heuristic"] = "constant"
    batch_size: int = 1
    mode: Literal["greedy", "sampling"] = "greedy"
    threshold_rule: Literal["before", "hf"] = "before"

    def __post_init__(self) -> None:
        n = self.num_speculative_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"num_speculative_tokens={n!r} must be an int >= 0")
        if not (isinstance(self.threshold, (int, float)) and 0.0 <= self.threshold < 1.0):
            raise InputError(f"threshold={self.threshold!r} must lie in [0, 1)")
        if self.schedule not in ("constant", "heuristic"):
            raise InputError(f"schedule={self.schedule!r} must be 'constant' or 'heuristic'")
        b = self.batch_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InputError(f"batch_size={b!r} must be an int >= 1")
        if self.mode not in ("greedy", "sampling"):
            raise InputError(f"mode={self.mode!r} must be 'greedy' or 'sampling'")
        if self.threshold_rule not in ("before", "hf"):
            raise InputError(f"threshold_rule={self.threshold_rule!r} must be 'before' or 'hf'")


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for one configuration (all per-cycle numbers are expectations).

    Attributes:
        tokens_per_s: total tokens per second over the B sequences, B·E[τ] / E[T_cycle].
        speedup: tokens_per_s ÷ baseline_tokens_per_s (plain decoding at the same B).
        baseline_tokens_per_s: B / (T_v(B, 1) + ar_overhead_s).
        expected_tokens_per_cycle: E[τ] per sequence (accepted + 1; vLLM's mean acceptance length).
        expected_draft_length: E[L], tokens proposed per cycle.
        expected_draft_forwards: E[F], draft forwards per cycle.
        cycle_time_s: E[T_cycle] in seconds.
        acceptance_per_position: conditional α_i implied for this configuration, ``[N]`` (NaN where no
            cycle reaches position i, e.g. a high θ cuts every draft before it).
        source: 'traces', 'sampling_traces', 'tv' (constant α = 1 - E[TV]), 'synthetic' (given rates) or
            'baseline' (N = 0).
        label: always 'predicted', to tell it apart from measured numbers wherever both are shown.
    """

    tokens_per_s: float
    speedup: float
    baseline_tokens_per_s: float
    expected_tokens_per_cycle: float
    expected_draft_length: float
    expected_draft_forwards: float
    cycle_time_s: float
    acceptance_per_position: tuple[float, ...] = field(default=())  # [N]
    source: str = "traces"
    label: str = "predicted"


def closed_form_tokens_per_cycle(alpha: float, n: int) -> float:
    """Seed closed form E[τ] = (1 - α^(N+1)) / (1 - α), N + 1 at α = 1.

    Args:
        alpha: constant acceptance probability in [0, 1].
        n: number of drafted tokens N >= 0.
    """
    if not 0.0 <= alpha <= 1.0:
        raise InputError(f"alpha={alpha!r} must lie in [0, 1]")
    if n < 0:
        raise InputError(f"n={n!r} must be >= 0")
    if alpha == 1.0:
        return float(n + 1)
    return (1.0 - alpha ** (n + 1)) / (1.0 - alpha)


def tokens_per_cycle_per_position(alphas: Sequence[float]) -> float:
    """E[τ] = 1 + Σ_{k=1..N} Π_{i≤k} α_i for conditional per-position acceptance α_1..α_N."""
    total, survive = 1.0, 1.0
    for a in alphas:
        if not 0.0 <= a <= 1.0:
            raise InputError(f"per-position acceptance {a!r} must lie in [0, 1]")
        survive *= a
        total += survive
    return total


def alphas_from_traces(traces: Sequence[Trace], n_max: int) -> list[float]:
    """Conditional α_i = P(token i accepted | tokens before it accepted), i = 1..n_max, at θ = 0.

    A position no trace reaches (traces cut by the end of the sequence) takes the previous
    position's α (0 for the first): its weight in E[τ] is the product before it, usually ~0.
    """
    stats = replay(traces, n_max, 0.0)
    out: list[float] = []
    for a in stats.acceptance_per_position:
        out.append(a if not math.isnan(a) else (out[-1] if out else 0.0))
    return out


def _interp(points: Mapping[int, float], x: int, what: str, extrapolate: bool) -> float:
    """Value at x: exact, linear between neighbours, or (if allowed) linear beyond the top."""
    if x in points:
        return float(points[x])
    xs = sorted(points)
    lo = [k for k in xs if k < x]
    hi = [k for k in xs if k > x]
    if lo and hi:
        x0, x1 = lo[-1], hi[0]
    elif extrapolate and len(xs) >= 2 and not hi:
        x0, x1 = xs[-2], xs[-1]  # beyond K_max: continue the last measured slope
    else:
        raise InputError(f"{what}: {x} is outside the measured range {xs[0]}..{xs[-1]}")
    y0, y1 = points[x0], points[x1]
    value = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    # Verify time does not fall with more positions; a noisy negative last slope is held flat.
    return max(value, y1) if x > x1 else value


def verify_time(profile: ModelProfile, batch_size: int, k: int) -> float:
    """T_v(B, k): measured, interpolated between batch sizes, extrapolated in k past K_max."""
    if k < 1:
        raise InputError(f"verify positions k={k!r} must be >= 1")
    curves = profile.verify_s
    if batch_size in curves:
        needed = [batch_size]
    else:  # interpolate between the nearest measured batch sizes (and nowhere else)
        below = [b for b in curves if b < batch_size]
        above = [b for b in curves if b > batch_size]
        if not (below and above):
            span = f"{min(curves)}..{max(curves)}"
            raise InputError(f"verify_s batch size: {batch_size} is outside the measured range {span}")
        needed = [max(below), min(above)]
    per_batch = {b: _interp(curves[b], k, f"verify_s[{b}] positions k", extrapolate=True) for b in needed}
    return _interp(per_batch, batch_size, "verify_s batch size", extrapolate=False)


def draft_step_time(profile: ModelProfile, batch_size: int) -> float:
    """T_s(B); 0 for a free drafter (empty ``draft_step_s``)."""
    if not profile.draft_step_s:
        return 0.0
    return _interp(profile.draft_step_s, batch_size, "draft_step_s batch size", extrapolate=False)


def baseline_tokens_per_s(profile: ModelProfile, batch_size: int = 1) -> float:
    """Plain decoding throughput B / (T_v(B, 1) + ar_overhead_s), total over the batch."""
    return batch_size / (verify_time(profile, batch_size, 1) + profile.ar_overhead_s)


def _stats_for(profile: ModelProfile, config: SpecConfig, n: int) -> tuple[ReplayStats, str]:
    """Per-cycle expectations at N = n from the best acceptance source for the config's mode."""
    theta = config.threshold
    if config.mode == "greedy" and profile.synthetic_acceptance is not None:
        if theta > 0:
            raise InputError(f"threshold={theta}: synthetic acceptance has no draft confidences to cut (θ must be 0)")
        rates = profile.synthetic_acceptance
        return alpha_stats([rates[min(i, len(rates) - 1)] for i in range(n)]), "synthetic"
    if config.mode == "greedy":
        if not profile.traces:
            raise InputError(f"profile {profile.name!r} has no greedy traces; profile acceptance first")
        return replay(profile.traces, n, theta, config.threshold_rule), "traces"
    if profile.sampling_traces:
        return replay(profile.sampling_traces, n, theta, config.threshold_rule), "sampling_traces"
    if profile.sampling_acceptance is None:
        raise InputError(f"profile {profile.name!r} has neither sampling traces nor a TV-based acceptance")
    if theta > 0:
        # A single TV number carries no confidences, so the threshold's cut cannot be predicted.
        raise InputError(f"threshold={theta} needs sampling traces; profile {profile.name!r} has only a TV number")
    return constant_alpha_stats(profile.sampling_acceptance, n), "tv"


def _cycle_time(profile: ModelProfile, stats: ReplayStats, batch_size: int) -> float:
    """E[T_cycle] = E[F]·T_s(B) + Σ_l P(L = l)·T_v(B, l + 1) + overhead."""
    verify = sum(p * verify_time(profile, batch_size, length + 1) for length, p in stats.draft_length_dist.items())
    return stats.mean_draft_forwards * draft_step_time(profile, batch_size) + verify + profile.cycle_overhead_s


def predict(profile: ModelProfile, config: SpecConfig) -> Prediction:
    """Predict throughput of one configuration (renewal-reward: B·E[τ] / E[T_cycle]).

    N = 0 is plain decoding and returns the baseline (speedup 1). The heuristic schedule is a
    Markov chain over N_cur in 1..N whose "grow" probability per state comes from the same replay;
    its throughput is Σ π_n E[τ|n]·B / Σ π_n E[T|n] with π the stationary distribution. "Grow"
    means every *proposed* token was accepted (A == L, so a cycle cut to L = 0 by θ grows too), the
    one rule of ``specdec_tune.schedules`` that the engine runs and HF's heuristic uses. Traces are treated as independent draws (no correlation between
    consecutive cycles), and the start-up transient from N_cur = N is ignored.

    Raises:
        InputError: the profile lacks what the config needs (traces, batch size, N beyond traces).
    """
    b = config.batch_size
    base = baseline_tokens_per_s(profile, b)
    n = config.num_speculative_tokens
    if n == 0:
        step = b / base
        return Prediction(base, 1.0, base, 1.0, 0.0, 0.0, step, (), "baseline")
    if config.schedule == "constant":
        stats, source = _stats_for(profile, config, n)
        time = _cycle_time(profile, stats, b)
    else:
        states = [_stats_for(profile, config, m) for m in range(1, n + 1)]
        source = states[0][1]
        pi = heuristic_stationary([s.all_accepted_rate for s, _ in states])
        stats = mix([s for s, _ in states], pi)
        # E[T] is linear in the per-state stats, so mixing before timing equals Σ π_n E[T|n].
        time = _cycle_time(profile, stats, b)
    tps = b * stats.mean_tau / time
    return Prediction(
        tokens_per_s=tps,
        speedup=tps / base,
        baseline_tokens_per_s=base,
        expected_tokens_per_cycle=stats.mean_tau,
        expected_draft_length=stats.mean_draft_length,
        expected_draft_forwards=stats.mean_draft_forwards,
        cycle_time_s=time,
        acceptance_per_position=stats.acceptance_per_position,
        source=source,
    )


def rank_configs(profile: ModelProfile, configs: Iterable[SpecConfig]) -> list[tuple[SpecConfig, Prediction]]:
    """Predict every config and sort by predicted tokens/s, best first (ties keep input order)."""
    scored = [(c, predict(profile, c)) for c in configs]
    return sorted(scored, key=lambda cp: -cp[1].tokens_per_s)


def best_n_per_batch_size(
    profile: ModelProfile,
    batch_sizes: Iterable[int],
    n_range: Iterable[int],
    threshold: float = 0.0,
    mode: Literal["greedy", "sampling"] = "greedy",
) -> dict[int, int]:
    """Best N per batch size (0 = do not speculate), for vLLM ``num_speculative_tokens_per_batch_size``
    and TRT-LLM ``draft_len_schedule``. N = 0 is always a candidate; ties go to the smaller N.
    """
    ns = sorted(set(n_range) | {0})
    out: dict[int, int] = {}
    for b in batch_sizes:
        speed = {n: predict(profile, SpecConfig(n, threshold, batch_size=b, mode=mode)).tokens_per_s for n in ns}
        out[b] = max(ns, key=lambda n: (speed[n], -n))
    return out


def relative_error(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured (the model-fidelity metric)."""
    if not (math.isfinite(measured) and measured > 0):
        raise InputError(f"measured={measured!r} must be a positive finite number")
    return abs(predicted - measured) / measured
