"""Core tables: hardware, models, workloads, profile runs, timings, acceptance, measured runs.

Revision ID: 0001
Revises:
Create Date: 2026-05-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), nullable=False)


def _run_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["run_id"], ["profile_runs.id"], name=f"fk_{table}_run_id_profile_runs", ondelete="CASCADE"
    )


def upgrade() -> None:
    """Create the core tables."""
    op.create_table(
        "hardware",
        _id(),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("device", sa.String(16), nullable=False),
        sa.Column("device_name", sa.String(256), nullable=False),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Float(), nullable=True),
        sa.Column("driver_version", sa.String(64), nullable=True),
        sa.Column("cuda_version", sa.String(64), nullable=True),
        sa.Column("torch_version", sa.String(64), nullable=True),
        sa.Column("transformers_version", sa.String(64), nullable=True),
        sa.Column("hostname", sa.String(256), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_hardware"),
        sa.UniqueConstraint("fingerprint", name="uq_hardware_fingerprint"),
    )
    op.create_table(
        "models",
        _id(),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("name", sa.String(512), nullable=False),
        sa.Column("revision", sa.String(128), nullable=True),
        sa.Column("num_parameters", sa.BigInteger(), nullable=True),
        sa.Column("num_layers", sa.Integer(), nullable=True),
        sa.Column("dtype", sa.String(32), nullable=True),
        sa.Column("vocab_size", sa.Integer(), nullable=True),
        sa.Column("tokenizer_hash", sa.String(64), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
        sa.UniqueConstraint("fingerprint", name="uq_models_fingerprint"),
    )
    op.create_table(
        "workloads",
        _id(),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("prompt_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workloads"),
        sa.UniqueConstraint("fingerprint", name="uq_workloads_fingerprint"),
    )
    op.create_table(
        "profile_runs",
        _id(),
        sa.Column("label", sa.String(256), nullable=True),
        sa.Column("target_model_id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=True),
        sa.Column("hardware_id", sa.Integer(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_model_id"], ["models.id"], name="fk_profile_runs_target_model_id_models"
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name="fk_profile_runs_workload_id_workloads"
        ),
        sa.ForeignKeyConstraint(
            ["hardware_id"], ["hardware.id"], name="fk_profile_runs_hardware_id_hardware"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_profile_runs"),
    )
    op.create_index("ix_profile_runs_target_model_id", "profile_runs", ["target_model_id"])
    op.create_table(
        "run_drafts",
        _id(),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(512), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=True),
        sa.Column("role", sa.String(32), nullable=False),
        _run_fk("run_drafts"),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name="fk_run_drafts_model_id_models"),
        sa.PrimaryKeyConstraint("id", name="pk_run_drafts"),
    )
    op.create_index("ix_run_drafts_run_id", "run_drafts", ["run_id"])
    op.create_table(
        "timing_samples",
        _id(),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("draft", sa.String(512), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("context_len", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("warmup", sa.Boolean(), nullable=False),
        _run_fk("timing_samples"),
        sa.PrimaryKeyConstraint("id", name="pk_timing_samples"),
    )
    op.create_index("ix_timing_samples_run_id_kind", "timing_samples", ["run_id", "kind"])
    op.create_table(
        "acceptance",
        _id(),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("draft", sa.String(512), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("num_speculative", sa.Integer(), nullable=False),
        sa.Column("cycles", sa.Integer(), nullable=False),
        sa.Column("position_attempts", sa.JSON(), nullable=False),
        sa.Column("position_accepts", sa.JSON(), nullable=False),
        sa.Column("alpha", sa.JSON(), nullable=False),
        sa.Column("beta", sa.JSON(), nullable=False),
        sa.Column("confidence_bins", sa.JSON(), nullable=False),
        sa.Column("teacher_forced_tokens", sa.Integer(), nullable=True),
        sa.Column("greedy_agreement", sa.Float(), nullable=True),
        sa.Column("one_minus_tv", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        _run_fk("acceptance"),
        sa.PrimaryKeyConstraint("id", name="pk_acceptance"),
    )
    op.create_index("ix_acceptance_run_id_draft", "acceptance", ["run_id", "draft"])
    op.create_table(
        "acceptance_traces",
        _id(),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("draft", sa.String(512), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("prompt_index", sa.Integer(), nullable=True),
        sa.Column("cycle_index", sa.Integer(), nullable=False),
        sa.Column("confidences", sa.JSON(), nullable=False),
        sa.Column("num_accepted", sa.Integer(), nullable=False),
        _run_fk("acceptance_traces"),
        sa.PrimaryKeyConstraint("id", name="pk_acceptance_traces"),
    )
    op.create_index(
        "ix_acceptance_traces_run_id_draft_mode", "acceptance_traces", ["run_id", "draft", "mode"]
    )
    op.create_table(
        "measured_runs",
        _id(),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("draft", sa.String(512), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("measured_tokens_per_s", sa.Float(), nullable=False),
        sa.Column("predicted_tokens_per_s", sa.Float(), nullable=True),
        sa.Column("measured_tau", sa.Float(), nullable=True),
        sa.Column("predicted_tau", sa.Float(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("new_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        _run_fk("measured_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_measured_runs"),
    )
    op.create_index("ix_measured_runs_run_id", "measured_runs", ["run_id"])


def downgrade() -> None:
    """Drop the core tables (children first)."""
    for table in (
        "measured_runs",
        "acceptance_traces",
        "acceptance",
        "timing_samples",
        "run_drafts",
        "profile_runs",
        "workloads",
        "models",
        "hardware",
    ):
        op.drop_table(table)
