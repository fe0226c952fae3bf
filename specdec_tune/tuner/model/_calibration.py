"""Overhead fit and in-loop calibration of the micro-benchmarks (used by :mod:`._profile`)."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from specdec_tune.core.stats import trimmed_mean


@dataclass(frozen=True)
class OverheadFit:
    """Per-cycle overhead model ``overhead = intercept_s + per_forward_s · F`` (least squares).

    Attributes:
        intercept_s: fixed overhead per cycle (verification, rollback, loop bookkeeping).
        per_forward_s: overhead per draft forward (argmax, confidence, stacking), outside the forward.
        cycles: cycles the fit used.
    """

    intercept_s: float
    per_forward_s: float
    cycles: int


def fit_overhead(samples: Sequence[tuple[int, float]]) -> OverheadFit:
    """Fit ``overhead = intercept + slope · F`` to per-cycle (draft forwards F, overhead seconds).

    The line is a count-weighted least-squares fit through the trimmed mean overhead of each distinct
    F (:func:`trimmed_mean`: expected costs, without the rare stall). With a single distinct F the
    slope is not identifiable and the mean goes to the intercept. A negative coefficient (noise) is
    clipped to 0 and the other refitted.
    """
    if not samples:
        return OverheadFit(0.0, 0.0, 0)
    groups: dict[int, list[float]] = defaultdict(list)
    for f, y in samples:
        groups[f].append(y)
    pts = [(f, trimmed_mean(ys), len(ys)) for f, ys in groups.items()]
    total = sum(w for _, _, w in pts)
    mx = sum(f * w for f, _, w in pts) / total
    my = sum(y * w for _, y, w in pts) / total
    sxx = sum(w * (f - mx) ** 2 for f, _, w in pts)
    if sxx == 0:
        return OverheadFit(max(my, 0.0), 0.0, len(samples))
    slope = sum(w * (f - mx) * (y - my) for f, y, w in pts) / sxx
    intercept = my - slope * mx
    if slope < 0:
        slope, intercept = 0.0, my
    if intercept < 0:
        sff = sum(w * f * f for f, _, w in pts)
        slope, intercept = (sum(w * f * y for f, y, w in pts) / sff if sff else 0.0), 0.0
    return OverheadFit(max(intercept, 0.0), max(slope, 0.0), len(samples))



def interp(points: dict[int, float], context: int) -> float:
    """Value at ``context`` from measurements at several context lengths (linear, clamped ends)."""
    xs = sorted(points)
    if not xs:
        return math.nan
    if context <= xs[0]:
        return points[xs[0]]
    if context >= xs[-1]:
        return points[xs[-1]]
    hi = next(x for x in xs if x >= context)
    lo = max(x for x in xs if x <= context)
    if hi == lo:
        return points[lo]
    return points[lo] + (points[hi] - points[lo]) * (context - lo) / (hi - lo)


MIN_IN_LOOP_SAMPLES = 8  # an in-loop mean at a width the profile designed, from fewer forwards, is too noisy
# A width the profile's passes did not design (core.pass_design.steady_widths) is seen only in the cycles
# cut by the end of a sequence: a handful of forwards, where one capture or stall is an eighth of the mean.
# Such a width anchors the calibration only when it was seen this often anyway.
MIN_UNDESIGNED_SAMPLES = 30
# In-loop ÷ isolated outside this band is not the loop's caching or overlap but something the loop paid
# once (captures, an eager fallback, a poisoned sample): the ratio is clamped to it, with a warning.
RATIO_BOUNDS = (0.5, 2.0)


@dataclass(frozen=True)
class Calibration:
    """B = 1 timings scaled to what the decode loop pays (see :func:`calibrate_b1`)."""

    verify_s: dict[int, float]
    prefill_target_s: tuple[float, ...]
    prefill_draft_s: tuple[float, ...]
    draft_first_s: float | None
    draft_rest_s: float | None
    ar_forward_s: float | None
    applied: bool
    draft_warmup_s: tuple[float, ...] = ()
    warnings: tuple[str, ...] = ()
    # in-loop ÷ isolated as measured: "verify" the largest at the anchors, "draft_step" the later draft forward's
    loop_ratios: dict[str, float] = field(default_factory=dict)


def _in_loop_mean(in_loop: dict, name: str):
    """An in-loop mean by name: the robust one (one-off costs left out) where the profile stored it, else the
    trimmed one, else the median (profiles stored before either)."""
    for key in (f"{name}_robust_s", f"{name}_mean_s", f"{name}_s"):
        if in_loop.get(key) is not None:
            return in_loop[key]
    return None


def anchor_ratios(verify: dict[int, float], in_loop: dict,
                  designed: Collection[int]) -> tuple[dict[int, float], list[str], dict[int, float]]:
    """k -> in-loop ÷ isolated T_v(k) at the widths that anchor the calibration, warnings, and the ratios as
    measured (before clamping).

    A width anchors where the profile designed it (``designed``, its passes' steady widths) and measured it at
    least :data:`MIN_IN_LOOP_SAMPLES` times, or, designed or not, at least :data:`MIN_UNDESIGNED_SAMPLES` times.
    A ratio outside :data:`RATIO_BOUNDS` is clamped to the band and warned about.
    """
    counts = {int(k): int(n) for k, n in in_loop.get("verify_n", {}).items()}
    ratios: dict[int, float] = {}
    raw: dict[int, float] = {}
    warnings = []
    lo, hi = RATIO_BOUNDS
    for k, v in (_in_loop_mean(in_loop, "verify") or {}).items():
        k, n = int(k), counts.get(int(k), 0)
        if not verify.get(k) or not ((k in designed and n >= MIN_IN_LOOP_SAMPLES) or n >= MIN_UNDESIGNED_SAMPLES):
            continue
        r = raw[k] = float(v) / verify[k]
        if not lo <= r <= hi:
            warnings.append(f"in-loop T_v({k}) is {r:.2f}× the isolated one over {n} forwards (outside "
                            f"{lo:g}-{hi:g}×: one-off costs inside the loop?); calibrated at "
                            f"{min(max(r, lo), hi):g}×")
            r = min(max(r, lo), hi)
        ratios[k] = r
    return ratios, warnings, raw


def calibrate_b1(
    verify: dict[int, float],
    draft_step: float | None,
    prefill_target: tuple[float, ...],
    prefill_draft: tuple[float, ...],
    in_loop: dict,
    ar_loop: Sequence[float],
    designed: Collection[int] = (),
    prompt_tokens: Sequence[int] = (),
) -> Calibration:
    """Scale the isolated micro-benchmarks to the forwards hooked inside the decode loop.

    A forward costs more or less inside the loop than alone (which weights and KV entries are still
    in the CPU caches depends on what ran just before: a verify after k - 1 draft forwards finds less
    of the target cached than after one; on a GPU the host's launches overlap the work queued before),
    so the loop's own mean times are the truth for the shapes it ran often: T_v(k) at the anchors
    (:func:`anchor_ratios`: the steady widths ``designed`` by the profile's passes, robust means), T_ar
    from the plain decoding loop (for the baseline), the draft's first and later forwards of a cycle, each
    prefill. Between anchors T_v(k) is interpolated linearly in k from the in-loop values (an isolated
    curve's shape is noisier than the line between in-loop anchors); outside them the
    micro-benchmark is scaled by the nearest anchor's in-loop/isolated ratio. Prefills (the micro-benchmark
    of each prompt, ``prompt_tokens`` long) are scaled by the median ratio of each in-loop prefill to the
    micro-benchmark of a prompt of its length.
    """
    ratios, warnings, raw = anchor_ratios(verify, in_loop, designed)
    ar_forward = trimmed_mean(ar_loop) if ar_loop else None
    if not ratios and ar_forward is not None and verify.get(1):
        # Target only: the plain loop's one-token forwards are the only in-loop verify-like samples.
        # (With a draft they are not used for T_v(1): in a cycle the target runs after a draft.)
        ratios[1] = ar_forward / verify[1]
    anchors = {k: r * verify[k] for k, r in ratios.items()}
    lo, hi = (min(anchors), max(anchors)) if anchors else (0, 0)
    out_verify = {
        k: interp(anchors, k) if lo <= k <= hi and len(anchors) > 1 else t * interp(ratios, k)
        for k, t in verify.items()
    } if ratios else dict(verify)

    def scaled(micro: tuple[float, ...], role: str, lengths: Sequence[int]) -> tuple[float, ...]:
        loop, tokens = in_loop.get(f"{role}_prefill_s", []), in_loop.get(f"{role}_prefill_tokens")
        pairs = _prefill_ratios(micro, lengths, loop, tokens)
        return tuple(t * statistics.median(pairs) for t in micro) if pairs else micro

    first, rest = _in_loop_mean(in_loop, "draft_first"), _in_loop_mean(in_loop, "draft_rest")
    if draft_step is not None and (first is None) != (rest is None):
        first = rest = first if first is not None else rest
    warmup = draft_warmup(in_loop, rest) if draft_step is not None and rest is not None else ()
    loop_ratios = {"verify": max(raw.values())} if raw else {}
    if draft_step and rest is not None:
        loop_ratios["draft_step"] = float(rest) / draft_step
    return Calibration(
        verify_s=out_verify,
        prefill_target_s=scaled(prefill_target, "target", [n - 1 for n in prompt_tokens]),
        prefill_draft_s=scaled(prefill_draft, "draft", prompt_tokens),
        draft_first_s=float(first) if first is not None else None,
        draft_rest_s=float(rest) if rest is not None else None,
        ar_forward_s=ar_forward,
        applied=bool(ratios) or first is not None,
        draft_warmup_s=warmup,
        warnings=tuple(warnings),
        loop_ratios=loop_ratios,
    )


def _prefill_ratios(micro: Sequence[float], lengths: Sequence[int], loop: Sequence[float],
                    loop_tokens: Sequence[int] | None) -> list[float]:
    """In-loop ÷ micro-benchmark of each in-loop prefill, against the micro-benchmark of a prompt of its length.

    The in-loop prefills come one per decoding pass, and the first prompts run several passes (the small-N
    ones), so pairing them with the prompts in order compared prompts of different lengths. Profiles stored
    before the lengths were kept (no ``loop_tokens``) pair them in order, as they always did."""
    if loop_tokens is None:
        return [a / b for a, b in zip(loop[: len(micro)], micro) if b > 0]
    by_length = {int(n): t for n, t in zip(lengths, micro) if t > 0}
    return [a / by_length[int(n)] for a, n in zip(loop, loop_tokens) if int(n) in by_length]


def draft_warmup(in_loop: dict, rest: float) -> tuple[float, ...]:
    """Each later draft forward's excess over the mean later forward, by its position in the cycle.

    The in-loop forwards of one cycle warm up one after another (``profiler.overhead.in_loop_medians``):
    the second costs more than the tenth. ``rest`` (their mean over the profile's passes, mostly N_max
    long) is T_s; element i is the excess of the (i + 2)-th forward of a cycle over it (negative for
    the late, warm forwards), for the contiguous positions j = 2, 3, ... measured at least
    :data:`MIN_IN_LOOP_SAMPLES` times. Empty for a profile without positions (before they were kept).
    """
    means = {int(j): float(t) for j, t in (_in_loop_mean(in_loop, "draft_position") or {}).items()}
    counts = {int(j): int(n) for j, n in (in_loop.get("draft_position_n") or {}).items()}
    out = []
    j = 2
    while j in means and counts.get(j, 0) >= MIN_IN_LOOP_SAMPLES:
        out.append(means[j] - float(rest))
        j += 1
    return tuple(out)
