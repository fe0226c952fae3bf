"""Two costs of the decode loop that its θ = 0 terms do not hold (used by :mod:`._profile`; docs/model.md,
The hooks' cost and The cost of θ > 0). Pure Python.

- **The hooks' tax.** Every in-loop term was measured with the profiler's hooks attached. The profile times
  each pass design with and without them (``profiler.hook_tax``): the difference per hooked forward is what
  the hooks added, and it comes off the terms that hold it (:func:`hook_tax`), where it stands clear of the
  timing noise.
- **A checked draft forward.** With θ > 0 the drafter reads each forward's confidence on the host
  (``engine/drafters.py``: ``float(conf)``), so the host waits for the device after every draft forward, on
  top of the confidence's own kernels. At θ = 0 the host runs ahead of the draft's kernels; at θ > 0 the work
  between forwards is exposed. The profile's θ > 0 pass measures that: each of its cycles' hooked wall time,
  less the hooks' tax, less what the θ = 0 terms predict for the same (F, L), is the checks' cost, and
  :func:`threshold_forward_s` spreads it over the cycles' draft forwards.
- **A decode's first cycle** overlaps its prefills' work: :func:`first_cycle_residuals`.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from specdec_tune.core.stats import trimmed_mean
from specdec_tune.tuner.model._throughput import ModelProfile, draft_seconds, verify_time

CLEAR_OF_NOISE = 2.0  # standard errors a mean tax must stand above 0 to be taken off


def hook_tax(samples: Sequence[float]) -> float:
    """The hooks' cost per hooked forward from paired (hooked - unhooked) samples: their mean where it lies
    more than :data:`CLEAR_OF_NOISE` standard errors above 0, else 0 (on a shared CPU a few microseconds per
    forward drown in the spread of whole calls, and subtracting that noise would add error, not remove it)."""
    xs = [float(x) for x in samples if math.isfinite(x)]
    if len(xs) < 2:
        return 0.0
    mean = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs))
    return mean if mean > CLEAR_OF_NOISE * se and mean > 0 else 0.0


def threshold_forward_s(cycles: Sequence[Sequence[float]], model: ModelProfile, cycle_overhead_s: float,
                        context_cost: Callable[[int, float], float], tax: float = 0.0) -> float:
    """Seconds a checked draft forward costs beyond the θ = 0 terms, fitted to the θ > 0 pass's cycles.

    Args:
        cycles: ``[F, L, hooked wall seconds, context]`` per cycle (``profiler.decode_passes.threshold_cycles``).
        model: the θ = 0 terms (T_s, the warm-up, T_v(k)) at B = 1, hooks' tax already off.
        cycle_overhead_s: o_c, hooks' tax already off.
        context_cost: seconds a verify of k tokens costs at a context beyond the typical one.
        tax: the hooks' cost per hooked forward in the θ > 0 pass's design (a cycle hooks F + 1 forwards).

    Returns:
        Σ (wall - tax·(F + 1) - θ = 0 cycle) / Σ F over the cycles where it lies more than
        :data:`CLEAR_OF_NOISE` standard errors above 0 (a check never makes a forward cheaper, and on a
        loaded CPU a few cycles' spread would otherwise become a term); 0 without cycles.
    """
    pairs = []  # (excess seconds, draft forwards) per cycle
    for f, length, wall, context in cycles:
        f, length = int(f), int(length)
        if f < 1:
            continue
        zero = draft_seconds(model, 1, f) + verify_time(model, 1, length + 1) + cycle_overhead_s \
            + context_cost(length + 1, context)
        pairs.append((float(wall) - tax * (f + 1) - zero, f))
    forwards = sum(f for _, f in pairs)
    if len(pairs) < 2 or not forwards:
        return 0.0
    cost = sum(e for e, _ in pairs) / forwards
    spread = math.sqrt(sum(f * (e / f - cost) ** 2 for e, f in pairs) / forwards / (len(pairs) - 1))
    return cost if cost > CLEAR_OF_NOISE * spread else 0.0


def first_cycle_residuals(rows: Sequence[Sequence[float]], model: ModelProfile,
                          context_cost: Callable[[int, float], float], prefill: Callable[[int], float],
                          tax: float = 0.0, checked: bool = False) -> list[float]:
    """Per decode, what its first cycle and its end cost beyond the model's own terms for them.

    A decode's first cycle runs while its prefills' work drains: on a GPU a long prefill's kernels are still
    running while the host launches the draft's, so its forwards are not what a steady cycle costs, and
    their hooked spans are not what the loop paid for them. The prediction charges the first cycle the
    prefills (``prefill(T)``: target and draft, less the draft step the draft's prefill replaces) and a
    steady cycle of its (F, L) at context T; this is the rest, so that the predicted first cycles add up to
    the measured ones. At θ > 0 (``checked``) the first check waits for the prefills to finish, so the θ
    pass's first cycles give their own.

    Args:
        rows: ``(F, L, hooked seconds of the first cycle and the tail, prompt tokens T)`` per decode.
        model: the steady terms at B = 1, hooks' tax already off.
        context_cost: seconds a verify of k tokens costs at a context beyond the typical one.
        prefill: T -> the prefills the prediction charges a prompt of T tokens.
        tax: the hooks' cost per hooked forward (the first cycle hooks F + 2: two prefills, F - 1 draft
            steps, the verify).
        checked: the rows are the θ > 0 pass's (each draft forward pays the check, ``threshold_forward_s``).

    Returns:
        The residual of each decode.
    """
    return [float(wall) - tax * (int(f) + 2) - prefill(int(t)) - draft_seconds(model, 1, int(f), checked)
            - verify_time(model, 1, int(length) + 1) - context_cost(int(length) + 1, t) for f, length, wall, t in rows]


def first_cycle_terms(steady: Sequence[float], checked: Sequence[float]) -> tuple[float | None, float | None]:
    """(θ = 0, θ > 0) first-cycle residuals per decode from :func:`first_cycle_residuals` of the θ = 0 passes and
    of the θ pass: the trimmed mean of the first (:func:`trimmed_mean`; None without rows), and for θ > 0 the
    same moved by the two passes' difference where that lies more than :data:`CLEAR_OF_NOISE` standard errors
    from 0 (the θ pass decodes a few prompts: on a loaded CPU their first cycles differ by hundreds of
    milliseconds), else None (θ > 0 decodes pay the θ = 0 one)."""
    if not steady:
        return None, None
    base = trimmed_mean(steady)
    if len(steady) < 2 or len(checked) < 2:
        return base, None
    diff = statistics.fmean(checked) - statistics.fmean(steady)
    se = math.sqrt(statistics.variance(checked) / len(checked) + statistics.variance(steady) / len(steady))
    return base, (base + diff if abs(diff) > CLEAR_OF_NOISE * se else None)
