"""When two greedy outputs of the same target count as consistent: the one rule ``bench``, ``regress``
and the nightly workflow apply (docs/architecture.md, Measurement rules). Pure Python, no torch.

In float32 the rule is exact identity: greedy speculative decoding must reproduce target-only
decoding token for token. In bfloat16 and float16 a verify forward over k tokens and k one-token
forwards round differently (other matrix shapes, other summation orders), and greedy outputs may
part where the target's top two logits are nearly tied; HF assisted generation parts the same way.
So there a differing output counts as consistent only when, at the FIRST position where the two
outputs differ, the reference's margin between its own token and the token the other output chose
is within the rounding tolerance of the dtype: a *near-tie*. After the first difference the two
outputs continue from different contexts and are not compared.

The margin is ``l[ref] - l[other]`` of the reference's logits at that position. It equals the
reference's top-two margin when the other output picked the reference's runner-up, which is the
only way rounding flips an argmax; a flip to any other token has a larger margin and is judged by
it, so a verifier that accepts wrong tokens at a near-tie is still caught.

The tolerance: logits come out of the LM head in the model's dtype, so two forwards that round
differently disagree by whole units in the last place (ulp) of the logit. With an 8-bit
significand (bfloat16: 7 stored bits) one ulp of a logit x is 2^(⌊log2|x|⌋ - 7), 0.0625 for a
logit of 8 to 16. ``benchmarks/bf16_tolerance.py`` measures how far the margin between the
reference's top two logits moves between one-token forwards and forwards of k tokens or the whole
sequence at once; :data:`MEASURED_MAX_ULPS` is the largest movement it saw on the bundled models in
bfloat16 (docs/results.md, bf16 tolerance). A margin judged
here is recomputed by another forward (one teacher-forced forward over the prompt and the
reference's tokens), which may itself sit 2 ulps from the reference's own, so a genuine rounding
flip shows a recomputed margin of at most 4 ulps; a factor of two on top covers deeper models and
GPU kernels: :data:`TOLERANCE_ULPS` = 8 ulps of the reference's top logit at that position (0.5 for
a top logit of 8 to 16). docs/architecture.md, Measurement rules, states the rule.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

# Explicit significand bits: the ulp of a value x is 2^(⌊log2|x|⌋ - bits).
SIGNIFICAND_BITS = {"float64": 52, "float32": 23, "bfloat16": 7, "float16": 10}
EXACT = ("float64", "float32")  # dtypes in which greedy outputs must be identical
MEASURED_MAX_ULPS = 2.0  # benchmarks/bf16_tolerance.py: the largest margin movement seen, in ulps
TOLERANCE_ULPS = 2 * 2 * MEASURED_MAX_ULPS  # two rounding paths × a safety factor of 2
STATUSES = ("identical", "near-tie", "differ")


def ulp(x: float, dtype: str) -> float:
    """One unit in the last place of ``x`` in ``dtype`` (of the smallest normal number at 0)."""
    bits = SIGNIFICAND_BITS[check_dtype(dtype)]
    if x == 0 or not math.isfinite(x):
        return 2.0 ** (-14 - bits) if dtype == "float16" else 2.0 ** (-126 - bits)
    _, exp = math.frexp(abs(x))  # |x| = m·2^exp, 0.5 <= m < 1, so ⌊log2|x|⌋ = exp - 1
    return 2.0 ** (exp - 1 - bits)


def check_dtype(dtype: str) -> str:
    """``dtype`` as ``float32``/``bfloat16``/``float16`` (``torch.`` prefix dropped).

    Raises:
        ValueError: another dtype, named.
    """
    name = str(dtype).replace("torch.", "")
    if name not in SIGNIFICAND_BITS:
        raise ValueError(f"dtype must be one of {', '.join(SIGNIFICAND_BITS)}, got {dtype!r}")
    return name


def tolerance(dtype: str, top_logit: float) -> float:
    """The largest margin a rounding difference may flip: 0 in float32/float64 (exact identity), else
    :data:`TOLERANCE_ULPS` ulps of the reference's top logit."""
    if check_dtype(dtype) in EXACT:
        return 0.0
    return TOLERANCE_ULPS * ulp(top_logit, dtype)


def first_difference(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """The first index where the two outputs differ (a missing token counts), None when equal."""
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


@dataclass(frozen=True)
class Consistency:
    """How one output compares with its reference.

    Attributes:
        status: ``identical``, ``near-tie`` (parted within the dtype's tolerance) or ``differ``.
        dtype: the dtype the rule was applied for.
        position: the first differing token index (None when identical).
        margin: the reference's ``l[ref] - l[other]`` there (None where not measured).
        tolerance: the largest margin counted as a near-tie there (0 in float32).
        reason: one line saying why, for reports.
    """

    status: str
    dtype: str
    position: int | None = None
    margin: float | None = None
    tolerance: float | None = None
    reason: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def judge(reference: Sequence[int], other: Sequence[int], dtype: str, margin: float | None = None,
          top_logit: float | None = None) -> Consistency:
    """Apply the rule to one pair of greedy outputs.

    Args:
        reference: the target-only output.
        other: the output under test (speculative decoding, HF assisted generation).
        dtype: the dtype both were decoded in.
        margin: the reference's ``l[ref] - l[other]`` at the first difference (see the module
            docstring); needed for a near-tie.
        top_logit: the reference's top logit there (sets the ulp).
    """
    dtype = check_dtype(dtype)
    pos = first_difference(reference, other)
    if pos is None:
        return Consistency("identical", dtype, reason="identical")
    if pos >= min(len(reference), len(other)):
        return Consistency("differ", dtype, pos, reason=f"lengths differ after {pos} equal tokens")
    if dtype in EXACT:
        return Consistency("differ", dtype, pos, margin, 0.0, f"{dtype} must be identical; parted at token {pos}")
    if margin is None or top_logit is None:
        return Consistency("differ", dtype, pos, reason=f"parted at token {pos}; its margin was not measured")
    tol = tolerance(dtype, top_logit)
    if abs(margin) <= tol:
        return Consistency("near-tie", dtype, pos, margin, tol,
                           f"parted at token {pos} at a near-tie (margin {margin:.4g} <= {tol:.4g})")
    return Consistency("differ", dtype, pos, margin, tol,
                       f"parted at token {pos}, margin {margin:.4g} > tolerance {tol:.4g}")


def overall(statuses: Sequence[str]) -> str:
    """The verdict of a run: ``differ`` if any output differs, else ``near-tie`` if any parted, else
    ``identical``."""
    for status in ("differ", "near-tie"):
        if status in statuses:
            return status
    return "identical"
