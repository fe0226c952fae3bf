"""Tuning studies read from the Optuna storage: summaries, one study's trials and its tuning result.

``specdec-tune tune`` keeps one Optuna study per tuning; the study's user attribute ``result`` holds a
:class:`~specdec_tune.tuner.model.TuningResult` (as a dict or a JSON string) and every trial carries
its prediction in its user attributes. Nothing here writes to the storage.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec_tune.dashboard.sources import storage_exists
from specdec_tune.dashboard.study_charts import objective_names
from specdec_tune.dashboard.study_reader import snapshot, trial_counts
from specdec_tune.dashboard.wiring import ExportFiles, server_room
from specdec_tune.core.errors import SpecdecError
from specdec_tune.tuner.model import TuningResult

RESULT_ATTR = "result"


@dataclass(frozen=True)
class StudyRow:
    """One study in the storage, as the overview and the study picker list it."""

    name: str
    directions: tuple[str, ...]
    trials: int
    best_values: tuple[float, ...] | None
    started: dt.datetime | None
    result: TuningResult | None
    best_label: str | None = None  # the configuration of the best trial (the search's best prediction)

    @property
    def multi_objective(self) -> bool:
        return len(self.directions) > 1


@dataclass(frozen=True)
class TrialRow:
    """One finished trial: its parameters, objective values and the prediction it stored."""

    number: int
    state: str
    values: tuple[float, ...] | None
    params: dict[str, Any]
    user_attrs: dict[str, Any]


@dataclass(frozen=True)
class StudyInfo:
    """What the Tuning study page shows besides Optuna's own figures.

    Attributes:
        row: the study's summary.
        objective_names: one name per objective (Optuna's metric names, else ``objective 1`` ...).
        states: trial count per state (``COMPLETE``, ``PRUNED``, ``FAIL``, ``RUNNING`` ...).
        best: the best trial (single objective) or the Pareto-optimal trials (several).
        per_batch_size: batch size -> best N (0 = do not speculate), from the tuning result.
        result: the finished tuning, when the study holds one.
    """

    row: StudyRow
    objective_names: tuple[str, ...]
    states: dict[str, int]
    best: tuple[TrialRow, ...]
    per_batch_size: dict[int, int] = field(default_factory=dict)
    result: TuningResult | None = None
    top: tuple[TrialRow, ...] = ()  # the best distinct configurations by the first objective

    @property
    def complete(self) -> int:
        return self.states.get("COMPLETE", 0)


def parse_result(raw: Any) -> TuningResult | None:
    """A :class:`TuningResult` from a study's ``result`` attribute (dict or JSON), ``None`` if unreadable."""
    if raw is None:
        return None
    try:
        data = json.loads(raw) if isinstance(raw, str) else dict(raw)
        return TuningResult.from_dict(data)
    except (TypeError, ValueError, KeyError):
        return None


def open_storage(url: str | None) -> Any | None:
    """An Optuna RDB storage for ``url``; ``None`` when there is none (nothing is created)."""
    if url is None or not storage_exists(url):
        return None
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.storages.RDBStorage(url, skip_table_creation=True)


def list_studies(storage: Any | None) -> list[StudyRow]:
    """Every study in the storage, newest first (an absent or empty storage gives ``[]``)."""
    if storage is None:
        return []
    from sqlalchemy.exc import OperationalError, ProgrammingError

    try:
        frozen = storage.get_all_studies()
        counts = trial_counts(storage)
    except (OperationalError, ProgrammingError):
        return []  # a database without Optuna's tables yet: no studies
    rows = []
    for s in sorted(frozen, key=lambda s: -s._study_id):  # newest first
        best, label = None, None
        if len(s.directions) == 1 and counts.get(s._study_id):
            try:
                trial = storage.get_best_trial(s._study_id)
                best, label = tuple(trial.values), trial_label(_trial_row(trial))
            except ValueError:  # no completed trial yet
                best = None
        rows.append(StudyRow(
            name=s.study_name, directions=tuple(d.name.lower() for d in s.directions),
            trials=counts.get(s._study_id, 0), best_values=best, started=None,
            result=parse_result(s.user_attrs.get(RESULT_ATTR)), best_label=label,
        ))
    return rows


def newest_tuned_run(studies: Sequence[StudyRow], run_ids: Sequence[int]) -> int | None:
    """The run the dashboard opens on: the profile run of the newest study that holds a finished tuning
    (its winner is what a user came to see), where that run is among ``run_ids``; else the newest of
    ``run_ids`` (``studies`` and ``run_ids`` newest first, as :func:`list_studies` and ``db.list_runs``
    give them); ``None`` when there is no run."""
    offered = set(run_ids)
    tuned = next((s.result.run_id for s in studies if s.result is not None and s.result.run_id in offered), None)
    return tuned if tuned is not None else next(iter(run_ids), None)


def load_study(storage: Any, name: str) -> Any:
    """An in-memory snapshot of the study called ``name`` (``KeyError`` naming the known ones if absent)."""
    try:
        return snapshot(storage, name)
    except KeyError:
        known = [s.study_name for s in storage.get_all_studies()]
        raise KeyError(f"no study {name!r} in the storage; studies: {', '.join(known) or 'none'}") from None


def _trial_row(t: Any) -> TrialRow:
    return TrialRow(number=t.number, state=t.state.name, values=tuple(t.values) if t.values else None,
                    params=dict(t.params), user_attrs=dict(t.user_attrs))


def study_info(study: Any) -> StudyInfo:
    """Summarise a loaded Optuna study (pure apart from reading the study's trials)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    states: dict[str, int] = {}
    for t in trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    directions = tuple(d.name.lower() for d in study.directions)
    names = tuple(objective_names(study))
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        best: tuple[TrialRow, ...] = ()
    elif len(directions) > 1:
        best = tuple(_trial_row(t) for t in sorted(study.best_trials, key=lambda t: t.number))
    else:
        best = (_trial_row(study.best_trial),)
    result = parse_result(study.user_attrs.get(RESULT_ATTR))
    sign = -1.0 if directions and directions[0] == "maximize" else 1.0
    top, seen = [], set()
    for t in sorted(complete, key=lambda t: sign * t.values[0]):
        key = json.dumps(t.params, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            top.append(_trial_row(t))
        if len(top) == 10:
            break
    started = min((t.datetime_start for t in trials if t.datetime_start), default=None)
    row = StudyRow(name=study.study_name, directions=directions, trials=len(trials),
                   best_values=best[0].values if best and len(directions) == 1 else None, started=started,
                   result=result, best_label=trial_label(best[0]) if best and len(directions) == 1 else None)
    return StudyInfo(row=row, objective_names=names, states=states, best=best,
                     per_batch_size=dict(result.per_batch_size) if result else {}, result=result, top=tuple(top))


def export_formats() -> tuple[str, ...]:
    """The formats the installed server room exports (empty when the dashboard runs without one)."""
    room = server_room()
    return room.formats if room else ()


def export_files(result: TuningResult) -> ExportFiles:
    """Every file ``specdec-tune export --format all`` writes for ``result``, for download.

    Returns:
        the files (format -> relative path -> content) and the formats left out with why: one that
        cannot express the configuration, or llamacpp when its GGUF files are not converted on this
        machine or too large to download (its flags name them). The README says the same.

    Raises:
        SpecdecError: the exporter refused the result (its own one-line message), or no server room
            is installed.
    """
    room = server_room()
    if room is None:
        raise SpecdecError("the exporters are not wired into this dashboard (start it with `specdec-tune dashboard`)")
    return room.export_files(result)


def zip_files(files: dict[str, dict[str, bytes]]) -> bytes:
    """All exported files in one zip archive (paths as written); GGUF weights stored, not deflated
    (float weights barely compress, and deflating megabytes would slow every page render)."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for group in files.values():
            for path, data in group.items():
                zf.writestr(path, data, compress_type=zipfile.ZIP_STORED if path.endswith(".gguf") else None)
    return buf.getvalue()


def trial_label(t: TrialRow) -> str:
    """The trial's configuration: the tuner's candidate when stored, else its parameters."""
    cand = t.user_attrs.get("candidate")
    if isinstance(cand, dict):
        from specdec_tune.tuner.model import Candidate

        try:
            return Candidate.from_dict(cand).label()
        except TypeError:
            pass
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={short(v)}" for k, v in t.params.items())


def objective_text(name: str, value: float | None) -> str:
    """An objective value for a table: bytes as MiB, rates with one decimal."""
    if value is None:
        return "–"
    if "bytes" in name or name == "memory":
        return f"{value / 2**20:,.1f} MiB"
    return f"{value:,.1f}"


def short(value: object) -> str:
    text = str(value)
    return text.rstrip("/").rsplit("/", 1)[-1] if "/" in text else text
