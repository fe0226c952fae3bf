"""The in-loop forward times, the bonus-position continuations and the teacher-forced pass's temperature get
columns of their own in ``acceptance``; ``confidence_bins`` keeps the confidence histogram only.

Until 0009 the profiler stored all three inside ``confidence_bins`` (keys ``in_loop``, ``continuations`` and
``tv_temperature``). The upgrade moves each row's values into the new columns (NULL where the row had no such
key) and leaves the histogram (``edges``, ``drafted``, ``accepted``) in ``confidence_bins``; the downgrade moves
them back, ``tv_temperature`` always (every profiler wrote it, ``null`` for a drafter without a teacher-forced
pass), the other two where the row has them.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MOVED = ("in_loop", "continuations", "tv_temperature")

_acceptance = sa.table(
    "acceptance",
    sa.column("id", sa.Integer()),
    sa.column("confidence_bins", sa.JSON()),
    sa.column("in_loop", sa.JSON()),
    sa.column("continuations", sa.JSON()),
    sa.column("tv_temperature", sa.Float()),
)


def _rows(columns: Sequence[str]) -> list[sa.Row]:
    query = sa.select(_acceptance.c.id, *(_acceptance.c[c] for c in columns)).order_by(_acceptance.c.id)
    return list(op.get_bind().execute(query))


def upgrade() -> None:
    """Add the three columns (nullable: a sampling row has no in-loop times, an n-gram row no continuations),
    then move each row's values out of ``confidence_bins``."""
    with op.batch_alter_table("acceptance") as batch:
        batch.add_column(sa.Column("in_loop", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("continuations", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("tv_temperature", sa.Float(), nullable=True))
    bind = op.get_bind()
    for row_id, bins in _rows(["confidence_bins"]):
        bins = dict(bins or {})
        moved = {key: bins.pop(key) for key in MOVED if key in bins}  # an absent key stays SQL NULL
        if not moved:
            continue
        bind.execute(sa.update(_acceptance).where(_acceptance.c.id == row_id).values(confidence_bins=bins, **moved))


def downgrade() -> None:
    """Move the values back into ``confidence_bins``, then drop the columns (batch mode rebuilds the table on
    SQLite)."""
    bind = op.get_bind()
    for row_id, bins, in_loop, continuations, tv_temperature in _rows(["confidence_bins", *MOVED]):
        bins = {**(bins or {}), "tv_temperature": tv_temperature}
        if in_loop is not None:
            bins["in_loop"] = in_loop
        if continuations is not None:
            bins["continuations"] = continuations
        bind.execute(sa.update(_acceptance).where(_acceptance.c.id == row_id).values(confidence_bins=bins))
    with op.batch_alter_table("acceptance") as batch:
        for name in reversed(MOVED):
            batch.drop_column(name)
