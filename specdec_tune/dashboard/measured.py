"""Measured runs next to their predictions: the Model vs measurement page and the error table.

A measured row's split says whether its prompts were the ones the profile ran (in-sample: the model
replays what it recorded) or prompts it never saw (held-out: the honest test). Rows written before
prompt splits existed ran the profile's own prompts, so they count as in-sample. The confidence
interval is the measured 95% CI of tokens/s where the measurement stored one.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specdec_tune.db import Database, MeasuredRecord, RunRecord, list_measured

HELD_OUT = "held-out"
IN_SAMPLE = "in-sample"


def measured_split(rec: MeasuredRecord) -> str:
    """``held-out`` or ``in-sample`` for one measured row (see the module docstring)."""
    c = rec.config
    split = str(c.get("split") or c.get("prompt_split") or "").lower().replace("_", "-")
    if split in ("holdout", "held-out", "heldout", "test") or c.get("heldout") is True or c.get("in_sample") is False:
        return HELD_OUT
    return IN_SAMPLE


def measured_ci(rec: MeasuredRecord) -> tuple[float, float] | None:
    """The measured 95% CI of tokens/s (revision 0003 columns; ``None`` for rows measured before)."""
    ci = rec.ci95
    if ci is None or not (math.isfinite(ci[0]) and math.isfinite(ci[1])):
        return None
    return float(ci[0]), float(ci[1])


def is_baseline(rec: MeasuredRecord) -> bool:
    """Plain decoding (no draft, or N = 0)."""
    return rec.draft is None or int(rec.config.get("num_speculative_tokens", 1) or 0) == 0


def backend_of(rec: MeasuredRecord) -> str:
    """Who ran the measurement: ``engine`` (ours) or a server (``vllm``)."""
    return str(rec.config.get("backend") or "engine")


def config_label(rec: MeasuredRecord) -> str:
    """``mini-draft-1l N=4 θ=0.3`` (draft shown by its last path part); a server-backed run is
    labelled with its backend and batch size: ``mini-draft-1l N=4 [vllm, B=4]``."""
    backend = backend_of(rec)
    tag = "" if backend == "engine" else f" [{backend}, B={rec.config.get('batch_size', 1)}]"
    return _label(rec) + tag


def _label(rec: MeasuredRecord) -> str:
    if is_baseline(rec):
        return "plain decoding" + (" (hooked profile pass)" if rec.config.get("hooked") else "")
    c = rec.config
    parts = [short_name(rec.draft), f"N={c.get('num_speculative_tokens')}"]
    if float(c.get("threshold") or 0) > 0:
        parts.append(f"θ={float(c['threshold']):g}")
    if c.get("schedule", "constant") != "constant":
        parts.append(str(c["schedule"]))
    if float(c.get("temperature") or 0) > 0:
        parts.append(f"T={float(c['temperature']):g}")
    return " ".join(parts)


def short_name(name: str | None) -> str:
    """A model's last path component (``/models/mini-draft-1l`` -> ``mini-draft-1l``)."""
    if not name:
        return "none"
    return name.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class FidelityPoint:
    """One measured configuration with its prediction (tokens/s)."""

    measured_id: int
    run_id: int
    draft: str | None
    label: str
    split: str
    measured: float
    predicted: float
    ci: tuple[float, float] | None
    measured_tau: float | None
    predicted_tau: float | None

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured

    @property
    def inside_ci(self) -> bool | None:
        return None if self.ci is None else self.ci[0] <= self.predicted <= self.ci[1]


@dataclass(frozen=True)
class ErrorSummary:
    """The model's error over one split (median |error|, share inside the measured CI).

    Attributes:
        split: ``in-sample`` or ``held-out``.
        count: configurations with a prediction.
        median_abs_error / worst_abs_error: of (predicted - measured) / measured.
        inside_ci: share of predictions inside the measured 95% CI (over rows that have a CI).
        with_ci: rows that have a CI.
        spearman: rank correlation of predicted and measured (``None`` below 3 points or no spread).
        regret: measured tokens/s of the predicted best ÷ measured best, averaged over the groups of
            configurations measured on the same prompts (one run, one split), 1.0 = no regret.
    """

    split: str
    count: int
    median_abs_error: float
    worst_abs_error: float
    inside_ci: float | None
    with_ci: int
    spearman: float | None
    regret: float | None


@dataclass(frozen=True)
class FidelityInfo:
    points: tuple[FidelityPoint, ...]
    summaries: tuple[ErrorSummary, ...]
    unpredicted: int  # measured rows without a prediction (baselines, older rows)


def _spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    from scipy.stats import spearmanr

    return float(spearmanr(xs, ys).statistic)


def summarize(points: Sequence[FidelityPoint], split: str) -> ErrorSummary | None:
    """The error summary of ``points`` of one split (``None`` when there are none)."""
    pts = [p for p in points if p.split == split]
    if not pts:
        return None
    errors = [abs(p.error) for p in pts]
    with_ci = [p for p in pts if p.ci is not None]
    groups: dict[int, list[FidelityPoint]] = defaultdict(list)
    for p in pts:
        groups[p.run_id].append(p)
    regrets = []
    for group in groups.values():
        if len(group) >= 2:
            chosen = max(group, key=lambda p: p.predicted)
            regrets.append(chosen.measured / max(p.measured for p in group))
    return ErrorSummary(
        split=split, count=len(pts), median_abs_error=statistics.median(errors), worst_abs_error=max(errors),
        inside_ci=sum(bool(p.inside_ci) for p in with_ci) / len(with_ci) if with_ci else None,
        with_ci=len(with_ci), spearman=_spearman([p.predicted for p in pts], [p.measured for p in pts]),
        regret=statistics.fmean(regrets) if regrets else None,
    )


def fidelity_points(records: Iterable[MeasuredRecord]) -> tuple[list[FidelityPoint], int]:
    """Measured rows with a prediction, and how many rows had none."""
    points, missing = [], 0
    for r in records:
        if r.predicted_tokens_per_s is None or r.measured_tokens_per_s <= 0:
            missing += 1
            continue
        points.append(FidelityPoint(
            measured_id=r.id, run_id=r.run_id, draft=r.draft, label=config_label(r), split=measured_split(r),
            measured=r.measured_tokens_per_s, predicted=r.predicted_tokens_per_s, ci=measured_ci(r),
            measured_tau=r.measured_tau, predicted_tau=r.predicted_tau,
        ))
    return points, missing


def load_fidelity(db: Database, runs: Sequence[RunRecord] | None = None, draft: str | None = None) -> FidelityInfo:
    """Predicted vs measured tokens/s of the given runs (all runs when ``None``), optionally one draft."""
    records = list_measured(db)  # one query; filtering here beats one query per run
    if runs is not None:
        ids = {run.id for run in runs}
        records = [r for r in records if r.run_id in ids]
    if draft is not None:
        records = [r for r in records if r.draft == draft]
    points, missing = fidelity_points(records)
    summaries = tuple(s for s in (summarize(points, HELD_OUT), summarize(points, IN_SAMPLE)) if s is not None)
    return FidelityInfo(points=tuple(points), summaries=summaries, unpredicted=missing)
