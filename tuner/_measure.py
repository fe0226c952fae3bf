"""Measured confirmation for ``tune``: candidates -> ``tuner.validate.measure_predicted`` -> numbers.

Thin glue between the search's :class:`Candidate` and the validation API (which predicts, has the
profiler measure interleaved, and stores the pair): plain decoding is measured in the same
interleaved set as the candidates, and the held-out speedup's CI is the paired one of
``specdec_tune.stats.speedup_ci`` (both measured prompt by prompt in the same passes).
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec_tune.db import Database
from specdec_tune.errors import InputError
from specdec_tune.profiler.session import ProfileSettings, Progress
from specdec_tune.tuner.configs import Candidate, TuningResult


@dataclass
class Measured:
    """One candidate measured (and predicted) on one prompt split."""

    candidate: Candidate
    tokens_per_s: float
    predicted_tokens_per_s: float | None
    ci: tuple[float, float] | None
    heldout: bool
    validated: Any  # tuner.validate.Validated


def has_splits() -> bool:
    """Whether profiles and measurements take a prompt split (issue 9 §3)."""
    return "split" in ProfileSettings.__dataclass_fields__


def _ci(v: Any) -> tuple[float, float] | None:
    for obj in (v, getattr(v, "measurement", None)):
        for name in ("ci", "tokens_per_s_ci", "ci95"):
            value = getattr(obj, name, None)
            if value is not None and len(value) == 2:
                return (float(value[0]), float(value[1]))
    return None


def measure(db: Database, run_id: int, candidates: Sequence[Candidate], *, split: str, max_prompts: int,
            temperature: float, repeats: int, seed: int, progress: Progress | None) -> list[Measured]:
    """Measure ``candidates`` interleaved on ``split`` of the run's workload (stored with predictions)."""
    from specdec_tune.tuner.search import spec_config
    from specdec_tune.tuner.validate import measure_predicted

    mode = "sampling" if temperature > 0 else "greedy"
    params = inspect.signature(measure_predicted).parameters
    if "split" not in params:
        return _fallback(db, run_id, candidates, split=split, max_prompts=max_prompts, temperature=temperature,
                         repeats=repeats, seed=seed, progress=progress)
    items = [(None if c.is_plain else c.drafter, spec_config(c, mode)) for c in candidates]
    kwargs: dict[str, Any] = dict(temperature=temperature, max_prompts=max_prompts, repeats=repeats, seed=seed,
                                  progress=progress)
    kwargs["split"] = split
    heldout = split == "holdout"
    validated = measure_predicted(db, run_id, items, **kwargs)
    out = []
    for c, v in zip(candidates, validated):
        p = getattr(v, "prediction", None)
        out.append(Measured(c, float(v.measurement.tokens_per_s), None if p is None else float(p.tokens_per_s),
                            _ci(v), bool(heldout and not getattr(v, "in_sample", False)), v))
    return out


def _fallback(db: Database, run_id: int, candidates: Sequence[Candidate], *, split: str, max_prompts: int,
              temperature: float, repeats: int, seed: int, progress: Progress | None) -> list[Measured]:
    """``tuner._interleave``: the split and plain decoding without issue 9 §3's API."""
    from specdec_tune.tuner import _interleave as il
    from specdec_tune.tuner.profile_data import load_run_profile, predict_baseline, predict_config
    from specdec_tune.tuner.search import spec_config

    mode = "sampling" if temperature > 0 else "greedy"
    predicted = []
    for c in candidates:  # predicted on the profiled (tuning) prompts; labelled so where stored
        rp = load_run_profile(db, run_id, None if c.is_plain else c.drafter, baseline_only=c.is_plain)
        predicted.append((predict_baseline(rp) if c.is_plain else predict_config(rp, spec_config(c, mode))).tokens_per_s)
    configs = [il.Timed("none" if c.is_plain else c.drafter, 0 if c.is_plain else c.num_speculative_tokens,
                        c.threshold, c.threshold_rule, c.schedule) for c in candidates]
    timed = il.measure_interleaved(db, run_id, configs, split=split, max_prompts=max_prompts, temperature=temperature,
                                   repeats=repeats, seed=seed, progress=progress or Progress(), predicted=predicted)
    return [Measured(c, t.tokens_per_s, p, il.tokens_per_s_ci(t), split == "holdout", t)
            for c, t, p in zip(candidates, timed, predicted)]


def speedup(win: Measured, base: Measured) -> tuple[float | None, tuple[float, float] | None]:
    """Measured speedup of ``win`` over plain decoding ``base`` and its paired 95% CI."""
    if win is base or win.candidate.is_plain:
        return 1.0, (1.0, 1.0)
    value = win.tokens_per_s / base.tokens_per_s if base.tokens_per_s > 0 else None
    from specdec_tune.tuner import _interleave as il

    if isinstance(win.validated, il.Timed):
        return value, il.speedup_ci(win.validated, base.validated)
    try:
        from specdec_tune.stats import speedup_ci
    except ImportError:
        return value, None
    try:
        ci = speedup_ci(win.validated.measurement, base.validated.measurement)
    except TypeError:
        return value, None
    lo, hi = (ci.low, ci.high) if hasattr(ci, "low") else (ci[0], ci[1])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return value, None
    return value, (float(lo), float(hi))


def notes(measured: Sequence[Measured]) -> list[str]:
    if measured and not measured[0].heldout:
        return ["held-out measurement unavailable in this build: the reported numbers are on the tuning prompts"]
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


def write_exports(result: TuningResult, formats: Sequence[str], out_dir: str) -> list[str]:
    """The exporters' files for ``result`` (``tuner.exports``), as paths."""
    try:
        from specdec_tune.tuner import exports
    except ImportError:
        raise InputError("--export needs specdec_tune.tuner.exports, which this build lacks") from None
    written = exports.write_exports(result, list(formats), out_dir)
    if isinstance(written, dict):
        written = [p for v in written.values() for p in (v if isinstance(v, (list, tuple)) else [v])]
    return [str(p) for p in (written or [])]
