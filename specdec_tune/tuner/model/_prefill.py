"""Prefill cost of a prompt: the profiled prompts' own prefills, or a line in the prompt length for others."""
from __future__ import annotations

from collections.abc import Sequence

from specdec_tune.tuner.model._profile import RunProfile

PrefillFits = tuple[tuple[float, float], tuple[float, float]]  # ((intercept, slope) target, (intercept, slope) draft)


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys on xs; a constant when xs do not vary."""
    if not xs:
        return 0.0, 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope < 0:  # noise over similar lengths: a prefill does not get cheaper with a longer prompt
        return my, 0.0
    return my - slope * mx, slope


def prefill_fits(rp: RunProfile) -> PrefillFits:
    """Prefill cost as a line in the prompt length, fitted to the profiled prompts' (calibrated) prefills.

    Prefill of a short prompt on one sequence is close to linear in its length; a fitted line also
    extrapolates to held-out prompts longer or shorter than every profiled one (interpolation between
    measured lengths would clamp at the ends).
    """
    lengths = [p.prompt_tokens for p in rp.prompts]
    target = line_fit([t - 1 for t in lengths], list(rp.prefill_target_s))
    draft = line_fit(lengths, list(rp.prefill_draft_s))
    return target, draft


def prompt_prefill(rp: RunProfile, profiled_index: int | None, prompt_tokens: int, fits: PrefillFits) -> tuple[float, float]:
    """(target prefill of T_p - 1 tokens, draft prefill of T_p tokens) of one prompt."""
    i = profiled_index
    if i is not None:
        return rp.prefill_target_s[i], rp.prefill_draft_s[i]
    (at, bt), (ad, bd) = fits
    draft = max(ad + bd * prompt_tokens, 0.0) if any(rp.prefill_draft_s) else 0.0
    return max(at + bt * (prompt_tokens - 1), 0.0), draft
