"""Regression runs: runs, benchmarks (raw per-prompt samples), verdict cells, A/A calibration.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create the four regression tables (``specdec-tune regress``)."""
    op.create_table(
        "regress_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("suite", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("baseline_id", sa.Integer(), nullable=True),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["baseline_id"], ["regress_runs.id"],
                                name="fk_regress_runs_baseline_id_regress_runs", ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name="pk_regress_runs"),
    )
    op.create_index("ix_regress_runs_suite", "regress_runs", ["suite"])
    op.create_table(
        "regress_benchmarks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("samples", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["regress_runs.id"],
                                name="fk_regress_benchmarks_run_id_regress_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_regress_benchmarks"),
    )
    op.create_index("ix_regress_benchmarks_run_id", "regress_benchmarks", ["run_id"])
    op.create_table(
        "regress_cells",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("benchmark", sa.String(200), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("baseline_value", sa.Float(), nullable=True),
        sa.Column("current_value", sa.Float(), nullable=True),
        sa.Column("effect", sa.Float(), nullable=True),
        sa.Column("ci_low", sa.Float(), nullable=True),
        sa.Column("ci_high", sa.Float(), nullable=True),
        sa.Column("p_value", sa.Float(), nullable=True),
        sa.Column("q_value", sa.Float(), nullable=True),
        sa.Column("mdc", sa.Float(), nullable=True),
        sa.Column("explanation", sa.Text(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["regress_runs.id"],
                                name="fk_regress_cells_run_id_regress_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_regress_cells"),
    )
    op.create_index("ix_regress_cells_run_id", "regress_cells", ["run_id"])
    op.create_index("ix_regress_cells_benchmark_metric", "regress_cells", ["benchmark", "metric"])
    op.create_table(
        "regress_calibration",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("suite", sa.String(200), nullable=False),
        sa.Column("benchmark", sa.String(200), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("spread", sa.Float(), nullable=True),
        sa.Column("max_abs_change", sa.Float(), nullable=True),
        sa.Column("mdc", sa.Float(), nullable=True),
        sa.Column("false_alarms", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["regress_runs.id"],
                                name="fk_regress_calibration_run_id_regress_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_regress_calibration"),
    )
    op.create_index("ix_regress_calibration_run_id", "regress_calibration", ["run_id"])
    op.create_index("ix_regress_calibration_suite", "regress_calibration", ["suite"])


def downgrade() -> None:
    """Drop the regression tables (children first)."""
    op.drop_index("ix_regress_calibration_suite", table_name="regress_calibration")
    op.drop_index("ix_regress_calibration_run_id", table_name="regress_calibration")
    op.drop_table("regress_calibration")
    op.drop_index("ix_regress_cells_benchmark_metric", table_name="regress_cells")
    op.drop_index("ix_regress_cells_run_id", table_name="regress_cells")
    op.drop_table("regress_cells")
    op.drop_index("ix_regress_benchmarks_run_id", table_name="regress_benchmarks")
    op.drop_table("regress_benchmarks")
    op.drop_index("ix_regress_runs_suite", table_name="regress_runs")
    op.drop_table("regress_runs")
