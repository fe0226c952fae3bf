"""Per-cycle expectations of a configuration from the profile's acceptance sources, and the Markov
chains of the heuristic schedule and the adaptive θ (private half of :mod:`tuner.model`; pure Python).

Sources: greedy traces; sampling traces (outcomes as recorded, or under lossy acceptance the expected
outcome from each drafted token's p and q: :func:`tuner.model._tv.lossy_stats`); the teacher-forced
1 - TV per position (:func:`tuner.model._tv.tv_stats`); or one mean 1 - TV (constant α).
"""
from __future__ import annotations

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model._replay import ReplayStats, adaptive_stationary, alpha_stats, constant_alpha_stats
from specdec_tune.tuner.model._replay import heuristic_stationary, lookup_cycles, mix, replay
from specdec_tune.tuner.model._spec import ModelProfile, SpecConfig
from specdec_tune.tuner.model._tv import lossy_stats, tv_stats


def _stats_for(profile: ModelProfile, config: SpecConfig, n: int, theta: float) -> tuple[ReplayStats, str]:
    """Per-cycle expectations at N = n and θ from the best acceptance source for the config's mode."""
    kind = "per-token" if config.spec.threshold_kind == "adaptive" else config.spec.threshold_kind  # adaptive: per level
    if config.mode == "greedy" and profile.synthetic_acceptance is not None:
        if theta > 0:
            raise InputError(f"threshold={theta}: synthetic acceptance has no draft confidences to cut (θ must be 0)")
        rates = profile.synthetic_acceptance
        return alpha_stats([rates[min(i, len(rates) - 1)] for i in range(n)]), "synthetic"
    if config.mode == "greedy":
        if not profile.traces:
            raise InputError(f"profile {profile.name!r} has no greedy traces; profile acceptance first")
        traces = lookup_cycles(profile.traces, n) if profile.lookup and n > 0 else profile.traces
        return replay(traces, n, theta, config.spec.threshold_rule, kind), "traces"
    if config.acceptance_source == "tv":
        return _tv_stats(profile, config, n, theta, kind), "tv per position"
    if config.spec.acceptance != "exact":
        if not profile.sampling_traces:
            raise InputError(f"lossy acceptance needs sampling traces; profile {profile.name!r} with --temperature")
        return lossy_stats(profile.sampling_traces, n, theta, config.spec.epsilon, kind), "sampling_traces"
    if config.acceptance_source == "traces" and not profile.sampling_traces:
        raise InputError(f"profile {profile.name!r} has no sampling traces; profile with --temperature")
    if profile.sampling_traces:
        if kind == "cumulative" and theta > 0 and any(t.token_probs is None for t in profile.sampling_traces):
            raise InputError(f"the cumulative threshold needs the drafted tokens' probabilities, which the sampling "
                             f"traces of {profile.name!r} lack (recorded before they were stored); profile again")
        return replay(profile.sampling_traces, n, theta, config.spec.threshold_rule, kind), "sampling_traces"
    if profile.sampling_acceptance is None:
        raise InputError(f"profile {profile.name!r} has neither sampling traces nor a TV-based acceptance")
    if config.spec.threshold > 0:
        # A single TV number carries no confidences, so the threshold's cut cannot be predicted.
        raise InputError(f"threshold={config.spec.threshold} needs sampling traces; profile {profile.name!r} has only a TV number")
    return constant_alpha_stats(profile.sampling_acceptance, n), "tv"


def _tv_stats(profile: ModelProfile, config: SpecConfig, n: int, theta: float, kind: str) -> ReplayStats:
    """The 'tv' source: teacher-forced 1 - TV per position (exact acceptance, per-token θ)."""
    if not profile.teacher_forced:
        raise InputError(f"profile {profile.name!r} stores no teacher-forced 1 - TV per position; profile a model draft "
                         "with --temperature")
    if config.spec.acceptance != "exact" or kind == "cumulative":
        raise InputError("acceptance source 'tv' predicts exact acceptance with a per-token or adaptive θ; "
                         f"use traces for acceptance={config.spec.acceptance!r}, threshold kind {config.spec.threshold_kind!r}")
    return tv_stats(profile.teacher_forced, n, theta)


def chain_stats(profile: ModelProfile, config: SpecConfig) -> tuple[ReplayStats, str]:
    """Per-cycle expectations of ``config`` in the long run, with the source of its acceptance.

    Constant schedule, fixed θ: one replay. The heuristic schedule (a chain over N_cur) and the adaptive
    θ (a chain over θ's levels) are Markov chains whose "all proposed accepted" probability per
    state comes from the same replay; their stationary mixture is returned. Traces are treated as
    independent draws (no correlation between consecutive cycles), and the start-up transient from
    the starting state is ignored.
    """
    n = config.spec.num_speculative_tokens
    policy = config.spec.adaptive
    if policy is not None:
        states = [_stats_for(profile, config, n, theta) for theta in policy.levels()]
        pi = adaptive_stationary([s.all_accepted_rate for s, _ in states], policy)
    elif config.spec.schedule == "constant":
        return _stats_for(profile, config, n, config.spec.threshold)
    else:
        states = [_stats_for(profile, config, m, config.spec.threshold) for m in range(1, n + 1)]
        pi = heuristic_stationary([s.all_accepted_rate for s, _ in states])
    # E[T] is linear in the per-state stats, so mixing before timing equals Σ π_s E[T|s].
    return mix([s for s, _ in states], pi), states[0][1]
