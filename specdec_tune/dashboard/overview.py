"""The Overview page's data: hardware, models, workloads, latest runs, studies, regression verdicts and
the best configuration for each (target, hardware, workload, server).

The best configuration comes from the tuning studies when there are any (the winner inside each
server's space, with its held-out measured speedup and CI). Where no study covers a (target,
hardware, workload), the best *measured* configuration of its runs stands in, labelled with the
prompts it was measured on.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from specdec_tune.dashboard.measured import (
    HELD_OUT,
    backend_of,
    config_label,
    is_baseline,
    measured_ci,
    measured_split,
    short_name,
)
from specdec_tune.dashboard.studies import StudyRow
from specdec_tune.dashboard.trends import TrendsInfo, Verdict
from specdec_tune.db import Database, HardwareRecord, MeasuredRecord, RunRecord, RunSettings, list_measured, list_models
from specdec_tune.db import list_runs

NGRAM_ROLE = "draft (n-gram lookup, no model)"


def hardware_label(h: HardwareRecord) -> str:
    """``AMD EPYC (cpu, 1 thread)`` / ``NVIDIA H100 (cuda, driver 550)``."""
    detail = [h.device]
    threads = h.extra.get("threads")
    if h.device == "cpu" and threads:
        detail.append(f"{threads} thread{'s' if threads != 1 else ''}")
    if h.driver_version:
        detail.append(f"driver {h.driver_version}")
    return f"{h.device_name} ({', '.join(detail)})"


def run_label(run: RunRecord) -> str:
    """``run 3: mini-target on functions, 2026-11-22 20:10 (completed)``; ``, synthetic acceptance`` is
    added for a run whose acceptance was given (:func:`synthetic_note`)."""
    workload = run.workload.name if run.workload else "no workload"
    when = run.started_at.strftime("%Y-%m-%d %H:%M")
    synthetic = ", synthetic acceptance" if synthetic_note(run.settings) else ""
    return f"run {run.id}: {short_name(run.target.name)} on {short_name(workload)}, {when} ({run.status}{synthetic})"


def synthetic_note(settings: RunSettings) -> str | None:
    """The label of a run profiled with synthetic acceptance (model shapes with random weights: the
    verify step accepted at given rates), None for a run whose target decided."""
    rates = settings.synthetic_acceptance
    if not rates:
        return None
    alphas = ", ".join(f"{float(a):g}" for a in rates)
    return (f"Synthetic acceptance α = {alphas} (given, not measured): this run's models have random weights, so "
            "its acceptance, τ and every prediction rest on these rates; its timings are measured.")


@dataclass(frozen=True)
class RunRow:
    id: int
    status: str
    started: str
    target: str
    hardware: str
    workload: str
    drafts: str
    label: str
    measured: int


@dataclass(frozen=True)
class BestRow:
    """The best configuration of one (target, hardware, workload, server).

    ``heldout`` is ``True`` when the speedup was measured on prompts the tuning never saw;
    ``speedup_ci`` is its 95% CI; ``tokens_ci`` the measured tokens/s CI where a row has one.
    """

    target: str
    hardware: str
    workload: str
    server: str
    config: str
    measured_tokens_per_s: float | None
    predicted_tokens_per_s: float | None
    speedup: float | None
    speedup_ci: tuple[float, float] | None
    tokens_ci: tuple[float, float] | None
    heldout: bool | None
    source: str


@dataclass(frozen=True)
class OverviewInfo:
    hardware: tuple[str, ...]
    models: tuple[tuple[str, str, int | None, int | None], ...]  # name, role, parameters, layers
    workloads: tuple[tuple[str, int, int], ...]  # name, prompts, runs
    runs: tuple[RunRow, ...]
    run_count: int
    measured_count: int
    studies: tuple[StudyRow, ...]
    best: tuple[BestRow, ...]
    verdicts: tuple[Verdict, ...]
    regress_runs: int = 0

    @property
    def empty(self) -> bool:
        return self.run_count == 0 and not self.studies and self.regress_runs == 0


def stored_ci(measured: Sequence[MeasuredRecord], run_id: int | None, tokens_per_s: float | None
              ) -> tuple[float, float] | None:
    """The measured 95% CI of the stored row a study's measured tokens/s came from (same run, same
    tokens/s: the study keeps the number, the results database its CI); ``None`` where none is stored."""
    if run_id is None or tokens_per_s is None:
        return None
    rows = [m for m in measured if m.run_id == run_id and not is_baseline(m)
            and math.isclose(m.measured_tokens_per_s, tokens_per_s, rel_tol=1e-9)]
    return measured_ci(rows[-1]) if rows else None


def _best_from_studies(studies: Sequence[StudyRow], measured: Sequence[MeasuredRecord] = ()) -> list[BestRow]:
    rows = []
    for s in studies:
        r = s.result
        if r is None:
            continue
        rows.append(BestRow(
            target=short_name(r.target), hardware=r.hardware or "?", workload=short_name(r.workload), server=r.server,
            config=r.candidate.label(), measured_tokens_per_s=r.measured_tokens_per_s,
            predicted_tokens_per_s=r.predicted_tokens_per_s, speedup=r.speedup, speedup_ci=r.speedup_ci,
            tokens_ci=stored_ci(measured, r.run_id, r.measured_tokens_per_s), heldout=r.heldout,
            source=f"study {s.name}",
        ))
        for server, best in sorted(r.best_per_server.items()):
            if server == r.server:
                continue
            from specdec_tune.tuner.model import Candidate

            rows.append(BestRow(
                target=short_name(r.target), hardware=r.hardware or "?", workload=short_name(r.workload),
                server=server, config=Candidate.from_dict(best).label(),
                measured_tokens_per_s=best.get("measured_tokens_per_s"),
                predicted_tokens_per_s=best.get("predicted_tokens_per_s"), speedup=best.get("speedup"),
                speedup_ci=tuple(best["speedup_ci"]) if best.get("speedup_ci") else None,
                tokens_ci=stored_ci(measured, r.run_id, best.get("measured_tokens_per_s")),
                heldout=best.get("heldout"), source=f"study {s.name} (best inside {server}'s space)",
            ))
    return rows


def _best_from_measured(runs: Sequence[RunRecord], measured: Sequence[MeasuredRecord]) -> list[BestRow]:
    by_run: dict[int, list[MeasuredRecord]] = defaultdict(list)
    for m in measured:
        by_run[m.run_id].append(m)
    groups: dict[tuple, list[tuple[RunRecord, MeasuredRecord]]] = defaultdict(list)
    for run in runs:
        key = (short_name(run.target.name), hardware_label(run.hardware), short_name(run.workload.name if run.workload else None))
        for m in by_run.get(run.id, []):
            if not is_baseline(m):  # a server's batch-B totals are compared only with the same server and B
                groups[(*key, backend_of(m), int(m.config.get("batch_size", 1) or 1))].append((run, m))
    rows = []
    for (target, hw, workload, backend, batch), cands in sorted(groups.items()):
        if not cands:
            continue
        held = [c for c in cands if measured_split(c[1]) == HELD_OUT]
        run, best = max(held or cands, key=lambda c: c[1].measured_tokens_per_s)
        split = measured_split(best)
        # Speedup only against plain decoding measured the same way (not the profile's hooked pass).
        bases = [m for m in by_run[run.id] if is_baseline(m) and not m.config.get("hooked") and measured_split(m) == split
                 and backend_of(m) == backend and int(m.config.get("batch_size", 1) or 1) == batch]
        # the plain decoding measured in the same passes (measure stores it right after the configuration)
        base = min(bases, key=lambda m: (m.id < best.id, abs(m.id - best.id))) if bases else None
        rows.append(BestRow(
            target=target, hardware=hw, workload=workload, server=f"{backend} (measured)", config=config_label(best),
            measured_tokens_per_s=best.measured_tokens_per_s, predicted_tokens_per_s=best.predicted_tokens_per_s,
            speedup=best.measured_tokens_per_s / base.measured_tokens_per_s if base else None,
            speedup_ci=None, tokens_ci=measured_ci(best), heldout=split == HELD_OUT,
            source=f"run {run.id}, measured {split}",
        ))
    return rows


def load_overview(db: Database, studies: Sequence[StudyRow] = (), trends: TrendsInfo | None = None,
                  latest: int = 20) -> OverviewInfo:
    """Everything the Overview page shows (studies and verdicts are read by their own loaders)."""
    runs = list_runs(db)
    measured = list_measured(db)
    per_run = Counter(m.run_id for m in measured)
    known = {x.id: x for x in list_models(db)}
    hardware: dict[int, str] = {}
    models: dict[str, tuple[str, str, int | None, int | None]] = {}
    workloads: dict[str, list[int]] = {}
    for run in runs:
        hardware.setdefault(run.hardware.id, hardware_label(run.hardware))
        t = run.target
        models.setdefault(t.name, (t.name, "target", t.num_parameters, t.num_layers))
        for d in run.drafts:
            if d.model_id is None:  # a drafter that runs no model: the n-gram (prompt) lookup
                models.setdefault(d.name, (d.name, NGRAM_ROLE, None, None))
                continue
            rec = known.get(d.model_id)
            models.setdefault(d.name, (d.name, "draft", rec.num_parameters if rec else None,
                                       rec.num_layers if rec else None))
        if run.workload is not None:
            workloads.setdefault(run.workload.name, [run.workload.prompt_count, 0])[1] += 1
    rows = tuple(
        RunRow(id=r.id, status=r.status, started=r.started_at.strftime("%Y-%m-%d %H:%M"),
               target=short_name(r.target.name), hardware=hardware_label(r.hardware),
               workload=short_name(r.workload.name) if r.workload else "-",
               drafts=", ".join(short_name(d.name) for d in r.drafts), label=r.label or "", measured=per_run[r.id])
        for r in runs[:latest]
    )
    best = _best_from_studies(studies, measured)
    covered = {(b.target, b.workload) for b in best}
    best += [b for b in _best_from_measured(runs, measured) if (b.target, b.workload) not in covered]
    return OverviewInfo(
        hardware=tuple(hardware.values()), models=tuple(models.values()),
        workloads=tuple((name, n, count) for name, (n, count) in workloads.items()), runs=rows,
        run_count=len(runs), measured_count=len(measured), studies=tuple(studies), best=tuple(best),
        verdicts=trends.verdicts if trends else (), regress_runs=trends.runs if trends else 0,
    )


def _with_ci(x: float | None, ci: tuple[float, float] | None, digits: int, suffix: str = "") -> str:
    if x is None:
        return "–"
    return f"{x:,.{digits}f}{suffix}" + (f" [{ci[0]:,.{digits}f}, {ci[1]:,.{digits}f}]" if ci else "")


def _short_models(label: str) -> str:
    """A configuration's label with each model path cut to its folder's name (a local draft's label names its
    whole path, as long as the folder it lives in)."""
    return " ".join(short_name(word) if "/" in word else word for word in label.split(" "))


def best_tables(rows: Sequence[BestRow]) -> dict[tuple[str, str, str], list[dict[str, str]]]:
    """The best-configuration table split by (target, hardware, workload), each group's name shown above
    its table: seven short columns a page's width holds (twelve ran off its right edge), each measured
    value in one cell with its 95% CI (tokens/s and speedup measured; ``predicted``: tokens/s)."""
    groups: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for b in rows:
        groups.setdefault((b.target, b.hardware, b.workload), []).append({
            "server": b.server, "configuration": _short_models(b.config),
            "tokens/s [95% CI]": _with_ci(b.measured_tokens_per_s, b.tokens_ci, 1),
            "predicted": _with_ci(b.predicted_tokens_per_s, None, 1),
            "speedup [95% CI]": _with_ci(b.speedup, b.speedup_ci, 2, "×"),
            "prompts": "held-out" if b.heldout else "in-sample",
            "from": b.source.split(" (best inside")[0],  # the caption says what a server's own row is
        })
    return groups
