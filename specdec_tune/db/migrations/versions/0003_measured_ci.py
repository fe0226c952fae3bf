"""Confidence interval and raw per-prompt samples on each measured run.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the 95% CI bounds and the raw samples (nullable: older measurements lack them)."""
    with op.batch_alter_table("measured_runs") as batch:
        batch.add_column(sa.Column("ci_low", sa.Float(), nullable=True))
        batch.add_column(sa.Column("ci_high", sa.Float(), nullable=True))
        batch.add_column(sa.Column("samples", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop the columns again (batch mode rebuilds measured_runs on SQLite)."""
    with op.batch_alter_table("measured_runs") as batch:
        batch.drop_column("samples")
        batch.drop_column("ci_high")
        batch.drop_column("ci_low")
