"""Pure statistics helpers shared by the profiler (which measures) and the tuner (which predicts).

Neither room may import the other (ARCHITECTURE §2), so what both need lives here: no torch, no
database, no timing.
"""
from __future__ import annotations

from collections.abc import Sequence


def trimmed_mean(values: Sequence[float], cut: float = 0.01) -> float:
    """Mean without the slowest ``cut`` fraction (the rare stall of a shared machine).

    Throughput is a ratio of *expected* times (renewal-reward), and times inside a decode loop have a
    right tail that a measurement pays as well, so means, not medians, are what predictions need.
    """
    xs = sorted(values)
    keep = max(1, len(xs) - int(len(xs) * cut))
    return sum(xs[:keep]) / keep
