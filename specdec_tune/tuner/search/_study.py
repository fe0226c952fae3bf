"""Optuna storage for ``tune``: where studies live, and keeping them apart from the results database.

Optuna's RDB storage keeps its own Alembic version table, named ``alembic_version`` like ours
(``db/migrations``): in one database each would read the other's revision and refuse to start (or,
worse, one would stamp over the other). So studies live in their own database: by default a SQLite
file next to the results database (``specdec.db`` -> ``specdec-studies.db``); for teams any
PostgreSQL URL other than the results database's. The same URL for both is refused with one line,
and so is a storage URL whose database already holds specdec-tune's tables.
"""
from __future__ import annotations

import logging
import time
import warnings
from typing import Any

from specdec_tune.db import default_storage_url, mask_url, sqlite_file
from specdec_tune.db import sqlite_file_problem
from specdec_tune.core.errors import InputError, StorageError

OUR_TABLE = "profile_runs"  # a table only specdec-tune's results database has
# A trial predicts in milliseconds, so any trial still RUNNING after a few heartbeats is a killed worker's.
HEARTBEAT_S = 2
GRACE_S = 6


def _same_database(a: str, b: str) -> bool:
    from sqlalchemy.engine import make_url

    fa, fb = sqlite_file(a), sqlite_file(b)
    if fa is not None or fb is not None:
        return fa == fb
    try:
        ua, ub = make_url(a), make_url(b)
    except Exception:
        return a.strip() == b.strip()
    key = lambda u: (u.get_backend_name(), u.host or "", u.port or 5432, u.database or "")  # noqa: E731
    return key(ua) == key(ub)


def check_storage(storage_url: str, db_url: str) -> None:
    """Refuse a study storage that is (or looks like) the results database.

    Raises:
        InputError: the same URL for ``--storage`` and ``--db``.
    """
    if _same_database(storage_url, db_url):
        raise InputError(
            f"--storage {mask_url(storage_url)} is the results database (--db): Optuna keeps its own "
            "alembic_version table there, which would clash with specdec-tune's; give another database "
            f"(default: {mask_url(default_storage_url(db_url))})")


def open_storage(storage_url: str, grace_s: int = GRACE_S) -> Any:
    """Open Optuna's RDB storage (created on first use); a bad or unreachable URL is one line.

    Completed trials are committed one by one, so a kill loses none. A running trial records a
    heartbeat every ``HEARTBEAT_S`` seconds; one whose heartbeat is older than ``grace_s`` seconds
    belongs to a worker that was killed (``kill -9``): the next run fails it and runs its point again
    (Optuna's stale-trial retry; :func:`fail_stale`), instead of leaving it RUNNING for ever.

    Raises:
        StorageError: the URL cannot be parsed or reached, or its database holds specdec-tune's tables.
    """
    import optuna
    import sqlalchemy as sa

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    path = sqlite_file(storage_url)
    problem = None if path is None else sqlite_file_problem(path)
    if problem is not None:  # a missing or read-only folder, /proc: one line before SQLite fails late
        raise StorageError(f"cannot open study storage {mask_url(storage_url)}: {problem}")
    try:
        engine = sa.create_engine(storage_url)
        with engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
        engine.dispose()
    except Exception as exc:  # driver missing, bad URL, server down: say which URL and why
        raise StorageError(f"cannot open study storage {mask_url(storage_url)}: {_first_line(exc)}") from None
    if OUR_TABLE in tables:
        raise StorageError(
            f"study storage {mask_url(storage_url)} holds specdec-tune's results tables; Optuna's alembic_version "
            "would clash with ours: give a separate database for --storage")
    try:
        with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna 5.0; we rely on them knowingly
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            warnings.simplefilter("ignore", FutureWarning)  # RetryFailedTrialCallback's rename (Optuna < 4.9)
            return optuna.storages.RDBStorage(
                storage_url, heartbeat_interval=HEARTBEAT_S, grace_period=grace_s, **_retry_stale(optuna),
                engine_kwargs={"pool_pre_ping": True} if not storage_url.startswith("sqlite") else None,
            )
    except Exception as exc:
        raise StorageError(f"cannot open study storage {mask_url(storage_url)}: {_first_line(exc)}") from None


def _retry_stale(optuna: Any) -> dict[str, Any]:
    """The storage argument that re-queues a stale trial's point (its name changed in Optuna 4.9)."""
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is not None:
        return {"heartbeat_stale_trial_callback": retry(max_retry=3)}
    return {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback(max_retry=3)}


def fail_stale(study: Any, storage: Any) -> None:
    """Fail the trials a killed worker left RUNNING, so that their points run again (:func:`open_storage`).

    A trial RUNNING now is either another live worker's, which finishes within milliseconds, or a
    killed one's, whose heartbeat goes stale ``grace_s`` seconds after the kill: wait at most that long
    for each to do one or the other, so that a run started right after a ``kill -9`` retries it too.
    """
    import optuna
    from optuna.trial import TrialState

    interval, grace = getattr(storage, "heartbeat_interval", None), getattr(storage, "grace_period", None)
    if interval is None:  # no heartbeats (not an RDB storage from open_storage): nothing can go stale
        return
    deadline = time.monotonic() + (grace or 2 * interval) + interval
    running = lambda: {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}  # noqa: E731
    waiting_for = running()
    while waiting_for:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        waiting_for &= running()
        if not waiting_for or time.monotonic() > deadline:
            return
        time.sleep(0.5)


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__


def load_or_create(storage: Any, name: str, directions: list[str], attrs: dict[str, Any], sampler: Any) -> Any:
    """Create the study, or load it when it exists and was made for the same question from the same profile.

    ``attrs`` (target, drafts, workload, server, space, objectives, run_id, ...) are stored with a new study;
    a study of that name made with other attrs, or from another profile run, is refused rather than mixed
    (its trials' predictions come from its own run's profile).

    Raises:
        InputError: the study exists with other settings or was made from another profile run.
    """
    import optuna

    study = optuna.create_study(storage=storage, study_name=name, directions=directions, sampler=sampler,
                                load_if_exists=True)
    fail_stale(study, storage)  # a killed worker's trial is failed and queued again before this run counts
    stored = study.user_attrs
    if "tune" not in stored:
        study.set_user_attr("tune", attrs)
        return study
    old = stored["tune"]
    if old.get("run_id") is not None and old["run_id"] != attrs.get("run_id"):
        raise InputError(f"study {name!r} holds trials predicted from profile run {old['run_id']}, this tune's "
                         f"profile is run {attrs.get('run_id')}: give another --study (without --study each profile "
                         "run gets its own study)")
    diff = [k for k in attrs if k in old and old[k] != attrs[k] and k not in ("run_id", "request")]
    if diff or [d.name for d in study.directions] != [d.upper() for d in directions]:
        what = ", ".join(f"{k} {old[k]!r} (now {attrs[k]!r})" for k in diff) or "its objectives"
        raise InputError(f"study {name!r} was made for other settings: {what}; give another --study to start a new one")
    return study


def bound_run(storage: Any, name: str) -> int | None:
    """The profile run study ``name`` was made from (None: no such study, or one no ``tune`` has used yet)."""
    import optuna

    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None
    run_id = study.user_attrs.get("tune", {}).get("run_id")
    return None if run_id is None else int(run_id)


def load_existing(storage: Any, name: str) -> Any:
    """An existing study, or one line naming the studies there are."""
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = optuna.get_all_study_names(storage)
        raise InputError(f"no study {name!r} in the storage; studies: {', '.join(names) or '(none)'}") from None
