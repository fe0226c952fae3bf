"""Token-tree and staged-drafting data per prompt (``tree_traces``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``tree_traces`` (one JSON document per run, draft, kind and prompt)."""
    op.create_table(
        "tree_traces",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("draft", sa.String(512), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("prompt_index", sa.Integer(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["profile_runs.id"], name="fk_tree_traces_run_id_profile_runs",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_tree_traces"),
    )
    op.create_index("ix_tree_traces_run_id_draft_kind", "tree_traces", ["run_id", "draft", "kind"])


def downgrade() -> None:
    """Drop ``tree_traces``."""
    op.drop_index("ix_tree_traces_run_id_draft_kind", table_name="tree_traces")
    op.drop_table("tree_traces")
