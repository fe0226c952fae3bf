"""What operators pay for, per measured configuration: latency percentiles, energy, cost and memory,
measured and (where stored) predicted. Pure loaders over ``db``'s measured rows; the page shows them.

Energy is shown only for rows that measured it (NVML on a GPU): on a CPU the column is absent, never
a zero. Cost is the stored dollars per million tokens at the price given when measuring, with the CI
of the measured throughput inverted (``specdec_tune.core.costs.usd_ci``).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specdec_tune.core.costs import usd_ci
from specdec_tune.dashboard.measured import config_label, measured_ci, measured_split
from specdec_tune.db import Database, MeasuredRecord, list_measured


@dataclass(frozen=True)
class OperatorRow:
    """One measured configuration's operator numbers (seconds, joules, dollars, bytes)."""

    measured_id: int
    run_id: int
    label: str
    split: str
    tokens_per_s: float
    ttft_p50_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    tpot_p99_s: float | None
    tpot_p50_ci: tuple[float, float] | None
    predicted_tpot_p50_s: float | None
    predicted_tpot_p90_s: float | None
    mean_burst: float | None
    joules_per_token: float | None
    joules_per_token_ci: tuple[float, float] | None
    usd_per_million_tokens: float | None
    usd_ci: tuple[float, float] | None
    gpu_price_usd_per_hour: float | None
    peak_memory_bytes: float | None
    predicted_memory_bytes: float | None


@dataclass(frozen=True)
class OperatorInfo:
    rows: tuple[OperatorRow, ...]
    has_energy: bool  # some row measured energy (a GPU with NVML); otherwise the column is left out
    has_cost: bool
    has_memory: bool


def _ci(x: object) -> tuple[float, float] | None:
    return (float(x[0]), float(x[1])) if isinstance(x, (list, tuple)) and len(x) == 2 and None not in x else None


def operator_row(r: MeasuredRecord) -> OperatorRow | None:
    """The row's operator numbers, or None for a row measured before latency was recorded."""
    if r.tpot_p50_s is None and r.joules_per_token is None and r.usd_per_million_tokens is None \
            and r.peak_memory_bytes is None:
        return None
    summary = (r.latency or {}).get("summary") or {}
    p50 = ((summary.get("tpot_s") or {}).get("p50") or {})
    price = r.gpu_price_usd_per_hour
    return OperatorRow(
        measured_id=r.id, run_id=r.run_id, label=config_label(r), split=measured_split(r),
        tokens_per_s=r.measured_tokens_per_s, ttft_p50_s=r.ttft_p50_s, tpot_p50_s=r.tpot_p50_s,
        tpot_p90_s=r.tpot_p90_s, tpot_p99_s=r.tpot_p99_s, tpot_p50_ci=_ci(p50.get("ci")),
        predicted_tpot_p50_s=r.predicted_tpot_p50_s, predicted_tpot_p90_s=r.predicted_tpot_p90_s,
        mean_burst=summary.get("mean_burst"), joules_per_token=r.joules_per_token,
        joules_per_token_ci=_ci((r.energy or {}).get("joules_per_token_ci")),
        usd_per_million_tokens=r.usd_per_million_tokens,
        usd_ci=usd_ci(price, measured_ci(r)) if price is not None else None, gpu_price_usd_per_hour=price,
        peak_memory_bytes=r.peak_memory_bytes, predicted_memory_bytes=r.predicted_memory_bytes)


def operator_info(records: Iterable[MeasuredRecord]) -> OperatorInfo:
    rows = tuple(x for x in (operator_row(r) for r in records) if x is not None)
    return OperatorInfo(rows, any(x.joules_per_token is not None for x in rows),
                        any(x.usd_per_million_tokens is not None for x in rows),
                        any(x.peak_memory_bytes is not None for x in rows))


def load_operator(db: Database, run_ids: Sequence[int] | None = None) -> OperatorInfo:
    """The operator numbers of the given runs' measured configurations (all runs when ``None``)."""
    records = list_measured(db)
    if run_ids is not None:
        ids = set(run_ids)
        records = [r for r in records if r.run_id in ids]
    return operator_info(records)
