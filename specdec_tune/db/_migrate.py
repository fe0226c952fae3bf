"""Alembic migrations, configured in code (no alembic.ini needed at run time).

A whole upgrade runs in one transaction (SQLite: BEGIN IMMEDIATE with foreign-key enforcement
paused, as SQLite's documented table-rebuild procedure asks; PostgreSQL: transactional DDL under an
advisory lock), so two processes opening a new database at once do not both create tables, and a
failed migration leaves the database exactly as it was.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.exc import DatabaseError, OperationalError, SQLAlchemyError

import specdec_tune.db.migrations as _migrations_pkg
from specdec_tune.db._connection import WRITE_OPTION, describe_error, make_engine, mask_url, resolve_url
from specdec_tune.core.errors import StorageError

# Arbitrary constant key for pg_advisory_xact_lock: serialises concurrent migrations of one server.
_PG_LOCK_KEY = 7_355_608_042


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic :class:`Config` pointing at the installed ``specdec_tune.db.migrations`` folder.

    Args:
        connection: If given, ``env.py`` runs the migrations on it (inside its transaction).
    """
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(_migrations_pkg.__file__).parent))
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def _script() -> ScriptDirectory:
    # Parsing the revision files takes milliseconds; every open_database asks for the head.
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest schema revision this version of specdec-tune knows."""
    head = _script().get_current_head()
    assert head is not None, "no Alembic revisions are installed"
    return head


def known_revisions() -> list[str]:
    """Every revision id, oldest first."""
    return [rev.revision for rev in reversed(list(_script().walk_revisions()))]


def _current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def _check_known(url: str, revision: str | None) -> None:
    if revision is not None and revision not in known_revisions():
        raise StorageError(
            f"database {mask_url(url)} is at schema revision {revision!r}, which this specdec-tune "
            f"does not know (known: {', '.join(known_revisions())}); it was probably written by a "
            f"newer specdec-tune - upgrade specdec-tune to use it"
        )


def _wrap(url: str, exc: SQLAlchemyError | CommandError) -> StorageError:
    hint = ""
    if isinstance(exc, OperationalError) and url.startswith("postgres"):
        hint = "; check that the server runs and that host, port, user, password and database fit"
    elif isinstance(exc, DatabaseError) and url.startswith("sqlite"):
        hint = "; the file is damaged or not a database: restore a backup or give another path"
    return StorageError(f"cannot open {describe_error(url, exc)}{hint}")


def current_revision_engine(engine: Engine, url: str) -> str | None:
    """The schema revision stored in the database behind ``engine`` (``None``: empty database)."""
    try:
        with engine.connect() as conn:
            return _current(conn)
    except SQLAlchemyError as exc:
        raise _wrap(url, exc) from None


def check_engine(engine: Engine, url: str) -> None:
    """Raise :class:`StorageError` unless the database is at the newest revision (never writes)."""
    current = current_revision_engine(engine, url)
    _check_known(url, current)
    if current != head_revision():
        raise StorageError(
            f"database {mask_url(url)} is at schema revision {current or 'none (empty)'}, not "
            f"{head_revision()}; run `specdec-tune db upgrade --db {mask_url(url)}`"
        )


def upgrade_engine(
    engine: Engine, url: str, revision: str = "head"
) -> tuple[str | None, str | None]:
    """Upgrade the database behind ``engine`` to ``revision``; return (before, after).

    Does nothing (one query) when the database is already there.
    """
    target = head_revision() if revision == "head" else revision
    before = current_revision_engine(engine, url)
    _check_known(url, before)
    if before == target:
        return before, before
    try:
        with engine.connect() as conn:
            return _upgrade_on(conn, url, target)
    except (SQLAlchemyError, CommandError) as exc:
        raise _wrap(url, exc) from None


def _check_foreign_tables(conn: Connection, url: str) -> None:
    """Refuse to add our schema to a database that holds another application's tables."""
    from specdec_tune.db._models import Base

    existing = set(inspect(conn).get_table_names())
    ours = set(Base.metadata.tables)
    # A SQLite file is one database per file, so any table means it belongs to someone else; a
    # PostgreSQL database may be shared, so only a clash of names is refused.
    clash = existing if conn.dialect.name == "sqlite" else existing & ours
    if clash:
        raise StorageError(
            f"database {mask_url(url)} already holds tables that specdec-tune did not create "
            f"({', '.join(sorted(clash)[:5])}); it was left untouched - give a new database or an "
            f"existing specdec-tune database"
        )


def _upgrade_on(conn: Connection, url: str, target: str) -> tuple[str | None, str | None]:
    sqlite = conn.dialect.name == "sqlite"
    raw: Any = conn.connection.driver_connection
    if sqlite:
        # A no-op inside a transaction, so it must precede BEGIN.
        raw.execute("PRAGMA foreign_keys=OFF")
    try:
        conn.execution_options(**{WRITE_OPTION: True})
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")
            # Read again under the lock: another process may have migrated in the meantime.
            before = _current(conn)
            _check_known(url, before)
            if before is None:
                _check_foreign_tables(conn, url)
            if before != target:
                command.upgrade(alembic_config(conn), target)
            if sqlite:
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:  # raising rolls the whole upgrade back
                    raise StorageError(
                        f"migrating {mask_url(url)} to {target} would break {len(broken)} "
                        f"foreign-key references (first: {tuple(broken[0])}); nothing was changed"
                    )
            after = _current(conn)
    finally:
        if sqlite:
            raw.execute("PRAGMA foreign_keys=ON")
    return before, after


def upgrade(url: str | None = None, revision: str = "head") -> tuple[str | None, str | None]:
    """Create or upgrade the database at ``url`` to ``revision`` (default: newest).

    Args:
        url: Database URL; ``None`` resolves through ``$SPECDEC_DB`` to ``sqlite:///specdec.db``.
        revision: Target revision id, or ``"head"``.

    Returns:
        The revision before and after (``None`` for an empty database).

    Raises:
        StorageError: The database cannot be opened or written, or ``revision`` is unknown.
    """
    resolved = resolve_url(url)
    if revision != "head" and revision not in known_revisions():
        raise StorageError(
            f"unknown schema revision {revision!r}; valid: head, {', '.join(known_revisions())}"
        )
    engine = make_engine(resolved)
    try:
        return upgrade_engine(engine, resolved, revision)
    finally:
        engine.dispose()


def current_revision(url: str | None = None) -> str | None:
    """The schema revision of the database at ``url`` without changing it (``None``: empty).

    A SQLite file that does not exist yet is reported as empty and is not created.
    """
    from specdec_tune.db._connection import sqlite_path

    resolved = resolve_url(url)
    engine = make_engine(resolved, read_only=True)
    try:
        if engine.dialect.name == "sqlite":
            path = sqlite_path(engine.url)
            if path is not None and not path.exists():
                return None
        return current_revision_engine(engine, resolved)
    finally:
        engine.dispose()
