"""A prediction moved to a machine running faster or slower than the profile's (private half of
:mod:`tuner.model`)."""
from __future__ import annotations

from dataclasses import replace

from specdec_tune.tuner.model._predict import RunPrediction
from specdec_tune.tuner.model._profile import RunProfile


def machine_speed(rp: RunProfile, probe_now_s: float | None) -> float:
    """How fast the machine runs now relative to the profile: the profile's machine-probe seconds over
    the probe's seconds now (``profiler.machine_probe``: a fixed decoder-shaped workload no model or
    code of ours can move). 1.0 when either was not measured."""
    if not rp.machine_probe_s or not probe_now_s or probe_now_s <= 0:
        return 1.0
    return rp.machine_probe_s / probe_now_s


def at_machine_speed(p: RunPrediction, factor: float) -> RunPrediction:
    """``p`` on a machine ``factor`` times as fast as the profile's: every rate times ``factor``, every
    time divided by it; speedups and acceptance are ratios of the same machine and stay."""
    if factor == 1.0:
        return p
    return replace(p, tokens_per_s=p.tokens_per_s * factor, baseline_tokens_per_s=p.baseline_tokens_per_s * factor,
                   decode_tokens_per_s=p.decode_tokens_per_s * factor, cycle_time_s=p.cycle_time_s / factor,
                   seconds=p.seconds / factor, machine_speed=p.machine_speed * factor)
