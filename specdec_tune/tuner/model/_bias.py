"""The bias of a lossy acceptance rule, read from the front a profile stored (private half of
:mod:`tuner.model`; pure Python).

Bias is the mean total variation distance between the distribution one verified position emits and
the target's, computed exactly from p and q at teacher-forced positions of target-sampled text
(``profiler.lossy_front``; Yin et al. 2024, Theorem 4): a per-step number, the same for every N and θ
(a bonus token, emitted from p, carries none). An ε between two profiled ones is interpolated
linearly and labelled so; outside the profiled grid nothing is predicted.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdec_tune.db import BiasFrontRow
from specdec_tune.core.errors import InputError


@dataclass(frozen=True)
class BiasPrediction:
    """Bias and rejection per verified position of one rule (``label`` says where they come from)."""

    bias: float
    rejection: float | None
    label: str
    measured_bias: float | None = None
    measured_rejection: float | None = None


def bias_of(front: Sequence[BiasFrontRow], method: str, epsilon: float) -> BiasPrediction:
    """The bias of ``method`` at ``epsilon`` from a stored front (``exact``: 0 by construction).

    Raises:
        InputError: a lossy rule and no front (profile with --temperature), or ε outside its grid.
    """
    if method == "exact":
        return BiasPrediction(0.0, None, "exact (unbiased by construction)")
    theory = sorted((r for r in front if r.source == "theory" and r.method == method), key=lambda r: r.epsilon)
    if not theory:
        raise InputError(f"no bias front for {method!r}: profile a model draft with --temperature")
    measured = {r.epsilon: r for r in front if r.source == "measured" and r.method == method}
    for r in theory:
        if abs(r.epsilon - epsilon) < 1e-9:
            m = measured.get(r.epsilon)
            return BiasPrediction(r.bias, r.rejection, "computed at teacher-forced positions",
                                  m.bias if m else None, m.rejection if m else None)
    below = [r for r in theory if r.epsilon < epsilon]
    above = [r for r in theory if r.epsilon > epsilon]
    if not below or not above:
        grid = ", ".join(f"{r.epsilon:g}" for r in theory)
        raise InputError(f"epsilon {epsilon:g} is outside the profiled grid ({grid}); the bias is not extrapolated")
    lo, hi = below[-1], above[0]
    w = (epsilon - lo.epsilon) / (hi.epsilon - lo.epsilon)
    return BiasPrediction(lo.bias + w * (hi.bias - lo.bias), lo.rejection + w * (hi.rejection - lo.rejection),
                          f"interpolated between ε = {lo.epsilon:g} and {hi.epsilon:g}")


def front_epsilons(front: Sequence[BiasFrontRow]) -> tuple[float, ...]:
    """The over-acceptance grid a profile stored (theory rows)."""
    return tuple(sorted({r.epsilon for r in front if r.source == "theory"}))
