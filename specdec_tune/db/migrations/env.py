"""Alembic environment of the results database.

specdec-tune runs migrations in code (:mod:`specdec_tune.db._migrate`), passing an open connection in
``config.attributes["connection"]``; the whole upgrade then runs inside that connection's
transaction. Running ``alembic`` by hand against ``sqlalchemy.url`` also works (for developers
writing a new revision with ``alembic revision --autogenerate``).
"""

from __future__ import annotations

from alembic import context

from specdec_tune.db._connection import make_engine
from specdec_tune.db._models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table (copy, drop, rename).
        render_as_batch=True,
        compare_type=True,
    )


def run_migrations_online() -> None:
    """Run the migrations on the given connection, or on one made from ``sqlalchemy.url``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    # Run by hand (`alembic -c db/alembic.ini ...`): same URL checks and SQLite pragmas as the tool.
    url = context.get_x_argument(as_dictionary=True).get("db") or config.get_main_option(
        "sqlalchemy.url"
    )
    engine = make_engine(url, foreign_keys=False)
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it (``alembic upgrade head --sql``)."""
    context.configure(
        url=context.get_x_argument(as_dictionary=True).get("db")
        or config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
