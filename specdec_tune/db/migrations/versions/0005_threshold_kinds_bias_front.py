"""Drafted tokens' draft and target probabilities on each acceptance trace (the cumulative threshold
kind's and lossy acceptance's replay), the lossy rejection–bias front and teacher-forced positions.

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


def _run_columns() -> list[sa.Column]:
    return [sa.Column("id", sa.Integer(), nullable=False), sa.Column("run_id", sa.Integer(), nullable=False),
            sa.Column("draft", sa.String(512), nullable=False), sa.Column("temperature", sa.Float(), nullable=False)]


def upgrade() -> None:
    """Add the two trace columns (nullable: older traces lack them) and the two tables."""
    with op.batch_alter_table("acceptance_traces") as batch:
        batch.add_column(sa.Column("token_probs", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("target_probs", sa.JSON(), nullable=True))
    op.create_table(
        "bias_front", *_run_columns(),
        sa.Column("method", sa.String(16), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("rejection", sa.Float(), nullable=False),
        sa.Column("bias", sa.Float(), nullable=False),
        sa.Column("pareto_bias", sa.Float(), nullable=True),
        sa.Column("positions", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["profile_runs.id"], name="fk_bias_front_run_id_profile_runs",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_bias_front"),
    )
    op.create_index("ix_bias_front_run_id_draft", "bias_front", ["run_id", "draft"])
    op.create_table(
        "teacher_forced_positions", *_run_columns(),
        sa.Column("prompt_index", sa.Integer(), nullable=False),
        sa.Column("one_minus_tv", sa.JSON(), nullable=False),
        sa.Column("top_q", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["profile_runs.id"],
                                name="fk_teacher_forced_positions_run_id_profile_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_teacher_forced_positions"),
    )
    op.create_index("ix_teacher_forced_positions_run_id_draft", "teacher_forced_positions", ["run_id", "draft"])


def downgrade() -> None:
    """Drop the tables and the columns again (batch mode rebuilds acceptance_traces on SQLite)."""
    op.drop_index("ix_teacher_forced_positions_run_id_draft", table_name="teacher_forced_positions")
    op.drop_table("teacher_forced_positions")
    op.drop_index("ix_bias_front_run_id_draft", table_name="bias_front")
    op.drop_table("bias_front")
    with op.batch_alter_table("acceptance_traces") as batch:
        batch.drop_column("target_probs")
        batch.drop_column("token_probs")
