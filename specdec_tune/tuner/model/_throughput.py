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
from typing import Literal

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model._chain import chain_stats
from specdec_tune.tuner.model._replay import ReplayStats, Trace, heuristic_stationary, replay
from specdec_tune.tuner.model._spec import ModelProfile, Prediction, SpecConfig

__all__ = [
    "ModelProfile", "Prediction", "ReplayStats", "SpecConfig", "Trace", "alphas_from_traces", "chain_stats",
    "baseline_tokens_per_s", "best_n_per_batch_size", "closed_form_tokens_per_cycle",
    "draft_seconds", "draft_step_time", "heuristic_stationary", "predict", "rank_configs", "relative_error",
    "replay", "tokens_per_cycle_per_position", "verify_time",
]


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


def draft_seconds(profile: ModelProfile, batch_size: int, forwards: float, checked: bool = False) -> float:
    """Seconds a cycle of ``forwards`` draft forwards drafts for: F·T_s(B), plus at B = 1 each later
    forward's in-loop warm-up excess (``ModelProfile.draft_warmup_s``; the last one holds beyond the
    measured positions), plus, when θ > 0 reads each forward's confidence (``checked``), F times the cost of
    that check (``ModelProfile.threshold_forward_s``). A fractional F (an expectation) interpolates between
    its neighbours."""
    step = draft_step_time(profile, batch_size)
    if checked and step > 0:
        step += profile.threshold_forward_s
    warm = profile.draft_warmup_s if batch_size == 1 and step > 0 else ()
    if not warm or forwards <= 1:
        return forwards * step

    def excess(f: int) -> float:  # Σ_{j=2..f} excess_j
        inside = sum(warm[: max(f - 1, 0)])
        return inside + max(f - 1 - len(warm), 0) * warm[-1]

    lo = int(forwards)
    frac = forwards - lo
    return forwards * step + (1 - frac) * excess(lo) + frac * excess(lo + 1)


def expected_draft_seconds(profile: ModelProfile, stats: ReplayStats, batch_size: int, checked: bool = False) -> float:
    """E[draft seconds of a cycle] over the replayed distribution of draft forwards F (``checked``: θ > 0)."""
    if not stats.draft_forwards_dist:
        return draft_seconds(profile, batch_size, stats.mean_draft_forwards, checked)
    return sum(p * draft_seconds(profile, batch_size, f, checked) for f, p in stats.draft_forwards_dist.items())


def baseline_tokens_per_s(profile: ModelProfile, batch_size: int = 1) -> float:
    """Plain decoding throughput B / (T_v(B, 1) + ar_overhead_s), total over the batch."""
    return batch_size / (verify_time(profile, batch_size, 1) + profile.ar_overhead_s)


def _cycle_time(profile: ModelProfile, stats: ReplayStats, batch_size: int, checked: bool = False) -> float:
    """E[T_cycle] = E[draft seconds of F forwards] + Σ_l P(L = l)·T_v(B, l + 1) + overhead."""
    verify = sum(p * verify_time(profile, batch_size, length + 1) for length, p in stats.draft_length_dist.items())
    return expected_draft_seconds(profile, stats, batch_size, checked) + verify + profile.cycle_overhead_s


def predict(profile: ModelProfile, config: SpecConfig) -> Prediction:
    """Predict throughput of one configuration (renewal-reward: B·E[τ] / E[T_cycle]).

    N = 0 is plain decoding and returns the baseline (speedup 1). The heuristic schedule is a
    Markov chain over N_cur in 1..N, the adaptive θ one over θ's levels (:func:`chain_stats`); the
    throughput is Σ π_s E[τ|s]·B / Σ π_s E[T|s] with π the stationary distribution. "Grow" means
    every *proposed* token was accepted (A == L, so a cycle cut to L = 0 by θ grows too), the one
    rule of ``specdec_tune.core.schedules`` that the engine runs and HF's heuristic uses.

    Raises:
        InputError: the profile lacks what the config needs (traces, batch size, N beyond traces).
    """
    b = config.batch_size
    base = baseline_tokens_per_s(profile, b)
    n = config.spec.num_speculative_tokens
    if n == 0:
        step = b / base
        return Prediction(base, 1.0, base, 1.0, 0.0, 0.0, step, (), "baseline")
    stats, source = chain_stats(profile, config)
    time = _cycle_time(profile, stats, b, config.spec.threshold > 0)
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
