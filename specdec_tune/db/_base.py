"""The declarative base of the results database's tables and its column types: the constraint naming
convention, timestamps in UTC on every backend, and the columns of a row registered once by fingerprint.
The tables themselves are in ``_models.py``; importing that module registers them on ``Base.metadata``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, DateTime, MetaData, String, TypeDecorator
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named constraints: SQLite ALTERs run in Alembic "batch" mode, which can only drop or alter a
# constraint that has a name.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timestamp stored as naive UTC and read back as an aware UTC ``datetime``.

    SQLite has no time zones and returns naive values while PostgreSQL ``timestamptz`` returns aware
    ones; normalising here gives callers the same value from both backends.
    """

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"timestamp {value!r} has no time zone; pass an aware datetime")
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


def utcnow() -> dt.datetime:
    """The current time as an aware UTC datetime (the only clock the database layer uses)."""
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    """Declarative base with the project's constraint naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dt.datetime: UTCDateTime(), dict[str, Any]: JSON(), list[Any]: JSON()}


class _Fingerprinted:
    """Columns of a table whose rows are registered once: ``get_or_create_*`` finds a row by the
    hash of its values (``fingerprint``). ``id`` and ``fingerprint`` come first in the table,
    ``created_at`` last, as in the migrations."""

    id: Mapped[int] = mapped_column(primary_key=True, sort_order=-2)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True, sort_order=-1)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, sort_order=1)
