"""What operators pay for, on each measured run: latency percentiles and raw arrivals, energy, cost and
memory, measured and predicted.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FLOATS = ("ttft_p50_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "predicted_tpot_p50_s", "predicted_tpot_p90_s",
          "energy_j", "joules_per_token", "gpu_price_usd_per_hour", "usd_per_million_tokens", "peak_memory_bytes",
          "predicted_memory_bytes")
JSONS = ("latency", "energy")


def upgrade() -> None:
    """Add the columns, all nullable: older measurements have none, a CPU measurement has no energy."""
    with op.batch_alter_table("measured_runs") as batch:
        for name in FLOATS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))
        for name in JSONS:
            batch.add_column(sa.Column(name, sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop them again (batch mode rebuilds measured_runs on SQLite)."""
    with op.batch_alter_table("measured_runs") as batch:
        for name in reversed(FLOATS + JSONS):
            batch.drop_column(name)
