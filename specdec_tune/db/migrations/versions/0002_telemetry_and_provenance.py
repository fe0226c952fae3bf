"""Telemetry table; specdec-tune version and git revision on each profile run.

Revision ID: 0002
Revises: 0001
Create Date: 2026-05-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the provenance columns (nullable: older runs lack them) and the telemetry table."""
    with op.batch_alter_table("profile_runs") as batch:
        batch.add_column(sa.Column("specdec_version", sa.String(64), nullable=True))
        batch.add_column(sa.Column("git_revision", sa.String(64), nullable=True))
    op.create_table(
        "telemetry",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("energy_j", sa.Float(), nullable=True),
        sa.Column("memory_used_mb", sa.Float(), nullable=True),
        sa.Column("sm_clock_mhz", sa.Float(), nullable=True),
        sa.Column("utilization_pct", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["profile_runs.id"],
            name="fk_telemetry_run_id_profile_runs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_telemetry"),
    )
    op.create_index("ix_telemetry_run_id", "telemetry", ["run_id"])


def downgrade() -> None:
    """Drop telemetry and the provenance columns (batch mode rebuilds profile_runs on SQLite)."""
    op.drop_index("ix_telemetry_run_id", table_name="telemetry")
    op.drop_table("telemetry")
    with op.batch_alter_table("profile_runs") as batch:
        batch.drop_column("git_revision")
        batch.drop_column("specdec_version")
