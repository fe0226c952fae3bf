"""Drafted tokens' own probabilities on each acceptance trace (the cumulative threshold kind's replay).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``acceptance_traces.token_probs`` (nullable: traces stored before it lack it)."""
    with op.batch_alter_table("acceptance_traces") as batch:
        batch.add_column(sa.Column("token_probs", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop the column again (batch mode rebuilds the table on SQLite)."""
    with op.batch_alter_table("acceptance_traces") as batch:
        batch.drop_column("token_probs")
