"""Where the dashboard reads from: the results database and the Optuna storage of the tuning studies.

The ``specdec-tune dashboard`` command checks both before Streamlit starts (one line and exit 2 on
bad input) and hands them to the app through the environment: ``SPECDEC_DB`` (the same variable the
other commands read) and ``SPECDEC_STORAGE``. The Optuna storage is opened read-only in spirit: a
storage that does not exist yet is reported as "no studies", never created by the dashboard.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from specdec_tune.db import Database, default_storage_url, mask_url, open_database, resolve_url, sqlite_file
from specdec_tune.core.errors import StorageError

STORAGE_ENV = "SPECDEC_STORAGE"

# What to run first, shown by every page whose data is missing (never an error); {run}: see first_command.
FIRST_COMMANDS = {
    "profile": "specdec-tune profile --target mini-target --draft mini-draft-1l,ngram --workload functions",
    "measure": "specdec-tune measure --run {run} --num-speculative-tokens 4",
    "tune": "specdec-tune tune --target mini-target --drafts mini-draft-1l,ngram --workload functions",
    "regress": "specdec-tune regress",
}


def first_command(what: str, run_id: int | None = None) -> str:
    """The command that fills the missing data ``what``; ``measure`` names the run ``run_id`` (the
    selected one; run 1, the first profile's, when none is selected yet)."""
    return FIRST_COMMANDS[what].format(run=1 if run_id is None else run_id)


@dataclass(frozen=True)
class Sources:
    """The two URLs the dashboard reads (``storage`` is ``None`` when no study storage exists).

    Attributes:
        db_url: the results database URL (resolved, may hold a password: print ``display_db``).
        storage_url: the Optuna RDB storage URL of the tuning studies, or ``None``.
    """

    db_url: str
    storage_url: str | None = None

    @property
    def display_db(self) -> str:
        return mask_url(self.db_url)

    @property
    def display_storage(self) -> str:
        return "none" if self.storage_url is None else mask_url(self.storage_url)


def resolve_sources(db: str | None = None, storage: str | None = None) -> Sources:
    """The URLs to read: arguments, else ``$SPECDEC_DB`` / ``$SPECDEC_STORAGE``, else the defaults."""
    db_url = resolve_url(db)
    storage_url = (storage or "").strip() or os.environ.get(STORAGE_ENV, "").strip() or default_storage_url(db_url)
    return Sources(db_url=db_url, storage_url=storage_url or None)


def check_sources(sources: Sources) -> Database:
    """Open (create or migrate, never wipe) the results database and check the study storage.

    Raises:
        StorageError: one line naming the URL that cannot be opened and what would be valid.
    """
    database = open_database(sources.db_url)
    if sources.storage_url is not None:
        try:
            check_storage(sources.storage_url)
        except BaseException:
            database.close()
            raise
    return database


def storage_exists(url: str) -> bool:
    """Whether there is anything to read at ``url`` (a SQLite file that is not there is not)."""
    path = sqlite_file(url)
    return path is None or (path.exists() and path.stat().st_size > 0)


def check_storage(url: str) -> None:
    """Raise :class:`StorageError` unless ``url`` is an Optuna storage that can be read (or absent)."""
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.engine import make_url

    shown = mask_url(url)
    try:
        make_url(url)
    except Exception:  # noqa: BLE001 - any parse failure is the same bad input
        raise StorageError(f"cannot open study storage {shown!r}: not a database URL "
                           "(e.g. sqlite:///studies.db or postgresql+psycopg://user:pw@host/db)") from None
    path = sqlite_file(url)
    if path is not None:
        if path.is_dir() or (path.exists() and path.stat().st_size and path.read_bytes()[:16] != b"SQLite format 3\x00"):
            raise StorageError(f"cannot open study storage {shown}: {path} is not a SQLite database")
        if not path.exists():
            return  # no studies yet; the dashboard says so and creates nothing
    try:
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                tables = set(inspect(conn).get_table_names())
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - driver errors of any backend become one line
        first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StorageError(f"cannot open study storage {shown}: {first}") from None
    # A storage shared with the results database holds our tables before the first study: no studies yet.
    if tables and "studies" not in tables and "profile_runs" not in tables:
        raise StorageError(f"study storage {shown} holds no Optuna tables (found {', '.join(sorted(tables)[:4])}); "
                           "give the --storage that `specdec-tune tune` wrote")
