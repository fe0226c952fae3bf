"""Opening the results database: URL resolution, input checks, SQLite pragmas, first-use migration.

Every failure to open becomes a one-line :class:`~specdec_tune.core.errors.StorageError` that names
the URL (password masked) and says what would be valid. Opening never rewrites a file that is not
already a SQLite database, so a wrong ``--db`` cannot destroy anything.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import StaticPool

from specdec_tune.core.errors import StorageError
from specdec_tune.core.jsonsafe import finite

DEFAULT_URL = "sqlite:///specdec.db"
ENV_VAR = "SPECDEC_DB"
VALID_URLS = (
    "sqlite:///specdec.db (a file, relative to the current directory), sqlite:////abs/path.db "
    "or postgresql+psycopg://user:password@host:5432/dbname"
)
BUSY_TIMEOUT_MS = 5000
_SQLITE_MAGIC = b"SQLite format 3\x00"
# Kernel interfaces mounted as file systems: files there are not files (SQLite fails on them late,
# with an error that reads like a damaged database).
_PSEUDO_FILESYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
                                 "pstore", "bpf", "configfs", "devpts", "mqueue", "binfmt_misc", "efivarfs",
                                 "fusectl", "nsfs", "hugetlbfs"})
# Execution option read by the "begin" hook: write transactions take SQLite's write lock up front
# (BEGIN IMMEDIATE), so two writers queue on busy_timeout instead of failing on a lock upgrade.
WRITE_OPTION = "specdec_write"


def resolve_url(url: str | None) -> str:
    """Return the database URL to use: the argument, else ``$SPECDEC_DB``, else ``sqlite:///specdec.db``.

    Args:
        url: A URL given on the command line, or ``None``.
    """
    if url is not None and url.strip():
        return url.strip()
    env = os.environ.get(ENV_VAR, "").strip()
    return env or DEFAULT_URL


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (safe to print)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)
    # Re-rendering escapes characters (``file:`` becomes ``file%3A``); keep the user's spelling
    # unless there is a password to hide.
    return url if parsed.password is None else parsed.render_as_string(hide_password=True)


def _parse(url: str) -> URL:
    try:
        return make_url(url)
    except ArgumentError:
        # A bare file name is the likeliest mistake; say the URL that was probably meant.
        hint = f" (for a file: sqlite:///{url})" if "://" not in url and url.strip() else ""
        raise StorageError(
            f"cannot open database {mask_url(url)!r}: not a database URL{hint}; valid: {VALID_URLS}"
        ) from None


def sqlite_path(parsed: URL) -> Path | None:
    """The file behind a SQLite URL, or ``None`` for an in-memory database."""
    database = parsed.database or ""
    if parsed.query.get("uri") in ("true", "1") and database.startswith("file:"):
        database = database[len("file:") :].split("?", 1)[0]
        if parsed.query.get("mode") == "memory":
            return None
    if database in ("", ":memory:") or database.startswith(":memory:"):
        return None
    return Path(database)


def sqlite_file(url: str) -> Path | None:
    """The absolute file behind a SQLite URL string (``None``: another backend, in memory, or not a URL)."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - any parse failure means "not a SQLite file"
        return None
    if parsed.get_backend_name() != "sqlite":
        return None
    path = sqlite_path(parsed)
    return None if path is None else path.expanduser().resolve()


def default_storage_url(db_url: str) -> str:
    """Where ``tune`` keeps its Optuna studies by default: a SQLite file beside the results database
    (``x.db`` -> ``x-studies.db``), else ``specdec-studies.db`` in the current directory.

    Optuna's RDB storage has its own ``alembic_version`` table, so studies never share the results
    database (``docs/architecture.md``, Storage).
    """
    path = sqlite_file(db_url)
    if path is None:
        return "sqlite:///specdec-studies.db"
    return f"sqlite:///{path.with_name(path.stem + '-studies' + (path.suffix or '.db'))}"


def _check_sqlite_file(url: str, path: Path, read_only: bool) -> None:
    """Refuse paths that SQLite would fail on late or, worse, silently mishandle."""
    problem = sqlite_file_problem(path, read_only)
    if problem is not None:
        raise StorageError(f"cannot open {mask_url(url)}: {problem}")


def sqlite_file_problem(path: Path, read_only: bool = False) -> str | None:
    """Why SQLite cannot use ``path`` as a database (one clause naming the path), or None."""
    directory = Path(os.path.abspath(path.parent if str(path.parent) else "."))  # named in full, never "."
    pseudo = pseudo_filesystem(directory)
    if pseudo is not None:
        return (f"{directory} is on the {pseudo} file system, which exposes the kernel, not files: it is no place "
                "for a database file; give a path on a disk, e.g. sqlite:///specdec.db")
    if path.is_dir():
        return f"{path} is a directory; give a file path"
    if path.exists():
        with path.open("rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
        # An empty file is a valid, empty SQLite database (sqlite3 creates one that way).
        if head and head != _SQLITE_MAGIC:
            return (f"{path} is not a SQLite database (it was left untouched); "
                    "give a new file name or an existing specdec-tune database")
        if not read_only and not os.access(path, os.W_OK):
            return (f"{path} is read-only; specdec-tune needs write access to the "
                    "database file (fix its permissions or copy it to a writable place)")
    if not directory.is_dir():
        return f"directory {directory} does not exist; create it or choose another path"
    if not read_only and not os.access(directory, os.W_OK):
        return (f"directory {directory} is read-only; SQLite needs to create "
                f"{path.name}-wal and {path.name}-shm next to the database (give a folder you can write)")
    return None


def pseudo_filesystem(directory: Path) -> str | None:
    """The type of the kernel file system (``proc``, ``sysfs``, ...) ``directory`` lies on, else None.

    Read from ``/proc/self/mountinfo`` (Linux): the longest mount point above ``directory``. As root
    every permission check passes there, and SQLite only fails when it opens the file.
    """
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:  # not Linux
        return None
    best, fstype = "", None
    for line in lines:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        mount = parts[4].encode().decode("unicode_escape")  # \040 is a space in a mount point
        inside = str(directory) == mount or str(directory).startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, fstype = mount, rest.split()[0]
    return fstype if fstype in _PSEUDO_FILESYSTEMS else None


def _json_serializer(obj: Any) -> str:
    # NaN and infinities are not JSON (PostgreSQL rejects them); an undefined rate such as α_i at a
    # position never reached is stored as null instead.
    return json.dumps(finite(obj), allow_nan=False)


def _install_sqlite_hooks(engine: Engine, foreign_keys: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # SQLAlchemy, not the sqlite3 module, emits BEGIN (see "begin" below); otherwise DDL would
        # run outside transactions and a failed migration could leave a half-altered schema.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cursor.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
            # WAL: the dashboard can read while a profiler writes.
            cursor.execute("PRAGMA journal_mode=WAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(url: str, *, foreign_keys: bool = True, read_only: bool = False) -> Engine:
    """Create a SQLAlchemy engine for ``url`` after checking the input; does not migrate.

    Args:
        url: A resolved database URL.
        foreign_keys: SQLite only; migrations turn enforcement off while tables are rebuilt.
        read_only: Skip the write-permission checks (``db current``, which never writes).

    Raises:
        StorageError: The URL cannot be parsed, names an unknown driver, or points at a path that is
            not a usable SQLite database.
    """
    parsed = _parse(url)
    kwargs: dict[str, Any] = {"json_serializer": _json_serializer}
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = sqlite_path(parsed)
        if path is None:
            # One shared connection, otherwise every pooled connection sees its own empty database.
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            _check_sqlite_file(url, path, read_only)
    try:
        engine = create_engine(parsed, **kwargs)
    except NoSuchModuleError:
        raise StorageError(
            f"cannot open {mask_url(url)}: unknown database dialect {parsed.drivername!r}; "
            f"valid: {VALID_URLS}"
        ) from None
    except ModuleNotFoundError as exc:
        hint = " (pip install 'specdec-tune[postgres]')" if backend == "postgresql" else ""
        raise StorageError(
            f"cannot open {mask_url(url)}: database driver {exc.name!r} is not installed{hint}"
        ) from None
    except (ArgumentError, TypeError, ValueError) as exc:
        raise StorageError(f"cannot open {mask_url(url)}: {exc}; valid: {VALID_URLS}") from None
    if backend == "sqlite":
        _install_sqlite_hooks(engine, foreign_keys)
    return engine


def describe_error(url: str, exc: BaseException) -> str:
    """One line naming the URL and the database's own complaint (first line only)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return f"{mask_url(url)}: {text}"


@dataclass
class Database:
    """An opened results database: the engine plus a session factory.

    Create with :func:`open_database`; use :func:`~specdec_tune.db._session.session_scope` or the
    helpers in :mod:`specdec_tune.db._writes` to read and write.
    """

    url: str
    engine: Engine
    sessions: sessionmaker = field(repr=False)
    write_sessions: sessionmaker = field(repr=False)

    @property
    def display_url(self) -> str:
        """The URL with its password masked, for messages."""
        return mask_url(self.url)

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self.engine.dialect.name

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_database(url: str | None = None, *, migrate: bool = True) -> Database:
    """Open (and on first use create or migrate) the results database.

    Args:
        url: Database URL; ``None`` resolves through ``$SPECDEC_DB`` to ``sqlite:///specdec.db``.
        migrate: Upgrade the schema to the newest revision if it is older (never drops data).

    Raises:
        StorageError: The database cannot be opened, is not a database, is read-only, or is at a
            schema revision this version of specdec-tune does not know.
    """
    from specdec_tune.db import _migrate  # import cycle: migrate uses make_engine

    resolved = resolve_url(url)
    engine = make_engine(resolved)
    try:
        if migrate:
            _migrate.upgrade_engine(engine, resolved)
        else:
            _migrate.check_engine(engine, resolved)
    except BaseException:
        engine.dispose()
        raise
    return Database(
        url=resolved,
        engine=engine,
        sessions=sessionmaker(engine, expire_on_commit=False),
        write_sessions=sessionmaker(
            engine.execution_options(**{WRITE_OPTION: True}), expire_on_commit=False
        ),
    )
