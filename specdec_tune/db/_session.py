"""The storage session context manager: commit on success, roll back on error, one error type.

Modelled on Optuna's ``_create_scoped_session``: every database error leaves as the project's
:class:`~specdec_tune.core.errors.StorageError` with the URL and the database's one-line complaint, so
the CLI prints one line and exits 2 instead of a SQLAlchemy traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from specdec_tune.db._connection import Database, describe_error
from specdec_tune.core.errors import StorageError


@contextmanager
def session_scope(db: Database, *, write: bool = False) -> Iterator[Session]:
    """Yield a session; commit when the block ends, roll back if it raises.

    Args:
        db: An opened database (:func:`~specdec_tune.db._connection.open_database`).
        write: Take the write lock when the transaction starts (SQLite ``BEGIN IMMEDIATE``), so
            that concurrent writers wait for each other (busy timeout) instead of failing.

    Raises:
        StorageError: Any SQLAlchemy error inside the block or at commit (the transaction is
            rolled back, so nothing half-written stays). Other exceptions, including
            ``KeyboardInterrupt``, roll back and propagate unchanged.
    """
    session: Session = (db.write_sessions if write else db.sessions)()
    try:
        yield session
        session.commit()
    except SQLAlchemyError as exc:
        session.rollback()
        raise StorageError(f"database error in {describe_error(db.url, exc)}") from exc
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
