"""The profile's decoding-pass design, one definition for the profiler that runs the passes and the model
that calibrates on them (docs/model.md, In-loop calibration). Pure Python.

Per draft the profile decodes at θ = 0 with N = N_max on every prompt and with each small N of
``overhead_ns`` on the first prompts. Almost every cycle of a pass of N verifies N + 1 tokens (only the
cycles cut by the end of the sequence verify fewer), so those *steady widths* are the verify widths the
profile measures often; any other width is seen a handful of times, at the ends of sequences."""
from __future__ import annotations

from collections.abc import Iterable


def small_ns(n_max: int, overhead_ns: Iterable[int]) -> list[int]:
    """The N of the short overhead passes: each of ``overhead_ns`` (at most N_max) but N_max itself, or N = 1
    when that leaves none (they separate the per-cycle from the per-draft-forward overhead)."""
    return sorted({min(int(n), n_max) for n in overhead_ns} - {n_max}) or [1]


def steady_widths(n_max: int, overhead_ns: Iterable[int]) -> frozenset[int]:
    """The verify widths k = N + 1 of every θ = 0 pass the profile designs: the ones it measures often."""
    return frozenset({n_max + 1, *(n + 1 for n in small_ns(n_max, overhead_ns))})
