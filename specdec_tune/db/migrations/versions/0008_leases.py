"""Leases: which process is working on a tuning study now (``leases``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``leases`` (one row per key: the primary key makes an insert race have one winner)."""
    op.create_table(
        "leases",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("command", sa.String(64), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid_scope", sa.String(255), nullable=True),
        sa.Column("acquired_at", sa.DateTime(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_leases"),
    )


def downgrade() -> None:
    """Drop ``leases``."""
    op.drop_table("leases")
