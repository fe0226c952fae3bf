"""Rescaling predictions to how fast the machine runs now (issue 37, F6; docs/model.md, Machine speed).

A prediction is made at the speed the machine ran during the profile. Where a measurement runs at another
speed (a shared CPU under load, clocks, a neighbour), its rates are rescaled by a gauge of that speed:
plain decoding measured in the same passes where there is one (``tuner.search._validate``), else the
machine probe (``profiler.machine_probe``): a fixed eager decoder step no code of ours can move. Two limits:

- the probe is eager and bound by kernel launches on a GPU; it does not follow CUDA-graphed decoding
  (on the H200 it moved predictions by 0.82-0.98 while graphed decoding did not move), so a graphed run is
  not rescaled by it;
- a probe ratio within twice the probe's own spread during the profile (its coefficient of variation) is
  noise, not a change of machine, and rescales nothing.
"""
from __future__ import annotations

import math
from dataclasses import replace

from specdec_tune.tuner.model._predict import RunPrediction
from specdec_tune.tuner.model._profile import RunProfile

NOISE_SPREADS = 2.0  # a probe ratio within this many coefficients of variation of 1 is noise


def probe_tracks(rp: RunProfile) -> bool:
    """Whether the machine probe follows this run's decoding: not where it ran CUDA graphs (the probe is eager)."""
    s = rp.run.settings
    return not (s.device == "cuda" and s.cuda_graphs_used == "on")


def machine_speed(rp: RunProfile, probe_now_s: float | None) -> float:
    """How fast the machine runs now relative to the profile: the profile's machine-probe seconds over the
    probe's seconds now. 1.0 when either was not measured, where the probe does not follow the run's
    decoding (:func:`probe_tracks`), and where the ratio lies within the probe's own noise."""
    if not rp.machine_probe_s or not probe_now_s or probe_now_s <= 0 or not probe_tracks(rp):
        return 1.0
    factor = rp.machine_probe_s / probe_now_s
    if rp.machine_probe_cv is not None and abs(math.log(factor)) <= NOISE_SPREADS * rp.machine_probe_cv:
        return 1.0
    return factor


def at_machine_speed(p: RunPrediction, factor: float) -> RunPrediction:
    """``p`` on a machine ``factor`` times as fast as the profile's: every rate times ``factor``, every
    time divided by it; speedups and acceptance are ratios of the same machine and stay."""
    if factor == 1.0:
        return p
    return replace(p, tokens_per_s=p.tokens_per_s * factor, baseline_tokens_per_s=p.baseline_tokens_per_s * factor,
                   decode_tokens_per_s=p.decode_tokens_per_s * factor, cycle_time_s=p.cycle_time_s / factor,
                   seconds=p.seconds / factor, machine_speed=p.machine_speed * factor)
