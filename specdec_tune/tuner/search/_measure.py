"""Measured confirmation for ``tune``: candidates -> :func:`measure_predicted` -> numbers.

Thin glue between the search's :class:`Candidate` and :func:`measure_predicted` (which
predicts, has the profiler measure interleaved on a prompt split, and stores the pair): plain
decoding is measured in the same interleaved passes as the candidates, and the held-out speedup's CI
is the paired bootstrap of ``specdec_tune.core.stats.speedup_ci`` (same prompts, same passes).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec_tune.db import Database
from specdec_tune.profiler import Progress
from specdec_tune.core.stats import speedup_ci, speedup_estimate
from specdec_tune.tuner.model import Candidate, predicted_basis


@dataclass
class Measured:
    """One candidate measured (and predicted) on one prompt split."""

    candidate: Candidate
    tokens_per_s: float
    predicted_tokens_per_s: float | None
    ci: tuple[float, float] | None
    heldout: bool
    validated: Any  # Validated (._validate)
    speedup: float | None = None  # over plain decoding measured in the same passes (None: none)

    @property
    def predicted_basis(self) -> str:
        """What ``predicted_tokens_per_s`` was computed for: these prompts, at the machine speed measured in
        the same passes (``._validate._speeds``), or the profile's where nothing rescaled it."""
        p = self.validated.prediction
        rescaled = p is not None and p.machine_speed != 1.0
        return predicted_basis(self.heldout, self.validated.speed_source if rescaled else None)


def measure_candidates(db: Database, run_id: int, candidates: Sequence[Candidate], *, split: str, max_prompts: int,
                       temperature: float, repeats: int, seed: int, progress: Progress | None,
                       threads: int | None = None, gpu_price: float | None = None) -> list[Measured]:
    """Measure ``candidates`` interleaved on ``split`` of the run's workload (stored with predictions).

    Where plain decoding is one of the candidates, each gets its speedup over it (``stats.speedup_estimate``,
    the estimator of its CI): what a decision ranks on, robust to a machine whose speed moves (both were
    measured prompt by prompt in the same passes).
    """
    from specdec_tune.tuner.model import spec_config
    from specdec_tune.tuner.search._validate import measure_predicted

    mode = "sampling" if temperature > 0 else "greedy"
    items = [(None if c.is_plain else c.drafter, spec_config(c, mode)) for c in candidates]
    kwargs: dict[str, Any] = dict(temperature=temperature, max_prompts=max_prompts, repeats=repeats, seed=seed,
                                  progress=progress, threads=threads, gpu_price=gpu_price)
    shapes = [("", "") if c.is_plain else (c.tree, c.staged) for c in candidates]
    validated = measure_predicted(db, run_id, items, split=split, shapes=shapes, **kwargs)
    heldout = split == "holdout"
    plain = next((v.measurement for c, v in zip(candidates, validated) if c.is_plain), None)
    out = []
    for c, v in zip(candidates, validated):
        p = v.prediction
        speedup = speedup_estimate(v.measurement, plain).value if plain is not None else None
        out.append(Measured(c, float(v.measurement.tokens_per_s), None if p is None else float(p.tokens_per_s),
                            v.ci95, bool(heldout and not v.in_sample), v, speedup))
    return out


def measured_speedup(win: Measured, base: Measured) -> tuple[float | None, tuple[float, float] | None]:
    """Measured speedup of ``win`` over plain decoding ``base`` and its paired 95% CI."""
    if win is base or win.candidate.is_plain:
        return 1.0, (1.0, 1.0)
    value = win.tokens_per_s / base.tokens_per_s if base.tokens_per_s > 0 else None
    ci = speedup_ci(win.validated.measurement, base.validated.measurement)  # None from one prompt
    if ci is None or not (math.isfinite(ci[0]) and math.isfinite(ci[1])):
        return value, None
    return value, (float(ci[0]), float(ci[1]))


def heldout_notes(measured: Sequence[Measured]) -> list[str]:
    if measured and not measured[0].heldout:
        return ["some 'held-out' prompts were profiled (in sample): the reported numbers are not held out"]
    return []


def completed_trials(storage: Any, name: str) -> int:
    """Completed trials of study ``name`` (0 when it does not exist yet)."""
    import optuna
    from optuna.trial import TrialState

    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return 0
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
