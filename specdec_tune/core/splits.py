"""The one rule that splits a workload's prompts into a tuning half and a held-out half.

Shared by the engine's workloads, the profiler (which measures on one half) and the tuner's model
(which predicts the other half from stored prompt lengths), so it lives beside them, not in any room.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from specdec_tune.core.errors import InputError

T = TypeVar("T")

SPLITS = ("all", "tune", "holdout")


def check_split(split: str) -> str:
    """Validate a split name or ``A:B`` range without loading a workload; return it stripped.

    Raises:
        InputError: not ``all``, ``tune``, ``holdout`` or ``A:B`` with integers 0 <= A < B.
    """
    text = str(split).strip()
    if text in SPLITS:
        return text
    if text.count(":") == 1:
        a, b = text.split(":")
        try:
            start, stop = int(a), int(b)
        except ValueError:
            start = stop = -1
        if 0 <= start < stop:
            return f"{start}:{stop}"
        if start >= 0 and stop >= 0:
            raise InputError(f"--split {text!r}: the range A:B needs A < B (prompts A..B-1 of the workload)")
    raise InputError(f"--split must be one of {', '.join(SPLITS)} or a range A:B of prompt positions "
                     f"(0 <= A < B), got {split!r}")


def split_prompts(prompts: Sequence[T], split: str) -> list[T]:
    """The prompts of one split of a workload, in workload order.

    The split is defined once, here, and used by ``profile``, ``measure``, ``tune`` and the model's
    held-out predictions (which split stored prompt ids and lengths, not prompts):

    - ``tune``: prompts at even positions 0, 2, 4, ... of the workload;
    - ``holdout``: prompts at odd positions 1, 3, 5, ...;
    - ``all``: every prompt;
    - ``A:B``: positions A..B-1 (a Python slice of the workload order; B may not exceed its size).

    Alternating by position keeps both halves representative when a workload is ordered by topic or
    length (the bundled ones are), makes them disjoint and together the whole workload, and needs no
    random seed: the same file always gives the same split.

    Raises:
        InputError: an unknown split, or a range outside the workload.
    """
    split = check_split(split)
    if split == "all":
        return list(prompts)
    if split == "tune":
        return list(prompts[0::2])
    if split == "holdout":
        return list(prompts[1::2])
    start, stop = (int(x) for x in split.split(":"))
    if stop > len(prompts):
        raise InputError(f"--split {split}: the workload has only {len(prompts)} prompts (positions 0..{len(prompts) - 1})")
    return list(prompts[start:stop])


def split_words(split: str) -> str:
    """How a message names a split: ``tuning split (even positions)``, ``prompts 0:4``, ..."""
    return {"tune": "tuning split (even positions)", "holdout": "held-out split (odd positions)",
            "all": "whole workload"}.get(split, f"prompts {split}")


def check_split_prompts(prompts: Sequence[T], split: str, workload: str, flag: str = "--split") -> list[T]:
    """The prompts of ``split``, refused where there are none (before any model loads).

    Raises:
        InputError: an unknown split, a range outside the workload, or an empty split; one line with the
            counts (a one-prompt workload has no held-out half).
    """
    chosen = split_prompts(prompts, split)
    if not chosen:
        n = len(prompts)
        raise InputError(f"{flag} {split}: workload {workload!r} has {n} prompt{'' if n == 1 else 's'} and its "
                         f"{split_words(check_split(split))} has none; use --split all or a workload of >= 2 prompts")
    return chosen

