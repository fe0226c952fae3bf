"""The Profile run page's data: what ``specdec-tune profile`` measured, summarised for charts.

Everything here is *measured* (timings, counts of accepted tokens, telemetry); the θ values shown on
the calibration curve are the grid the tuner's :func:`~specdec_tune.tuner.model.best_configs`
searches. Panels follow vLLM's Grafana board: acceptance rate (accepted ÷ drafted tokens), mean
acceptance length (1 + accepted ÷ cycles, i.e. E[τ] at N_max) and acceptance by draft position
(β_i, vLLM's per-position metric, next to our conditional α_i).
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from specdec_tune.db import (
    AcceptanceRecord,
    BiasFrontRow,
    Database,
    RunRecord,
    TelemetryRow,
    TimingRow,
    get_run,
    load_acceptance,
    load_bias_front,
    load_telemetry,
    load_timings,
)
from specdec_tune.tuner.model import THRESHOLD_GRID


@dataclass(frozen=True)
class Spread:
    """Median and 10th/90th percentiles of raw samples (milliseconds), and how many."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    n: int


def spread(seconds: Sequence[float]) -> Spread:
    """The :class:`Spread` of samples given in seconds (nearest-rank percentiles)."""
    xs = sorted(s * 1e3 for s in seconds)
    n = len(xs)

    def pct(q: float) -> float:
        return xs[min(n - 1, max(0, round(q * (n - 1))))]

    return Spread(statistics.median(xs), pct(0.1), pct(0.9), n)


@dataclass(frozen=True)
class AcceptancePanel:
    """One draft's acceptance in one mode, with vLLM's headline numbers.

    Attributes:
        alpha: conditional α_i per position (``None`` where no cycle reached it).
        beta: unconditional β_i = accepted at i ÷ cycles.
        acceptance_rate: accepted ÷ drafted tokens (vLLM ``spec_decode`` acceptance rate).
        mean_acceptance_length: 1 + accepted ÷ cycles (E[τ] at N_max, θ = 0).
        calibration: (bin low, bin high, drafted, accepted) per draft-confidence bin.
    """

    draft: str
    mode: str
    temperature: float
    cycles: int
    n_max: int
    alpha: tuple[float | None, ...]
    beta: tuple[float | None, ...]
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    calibration: tuple[tuple[float, float, int, int], ...]
    greedy_agreement: float | None
    one_minus_tv: float | None


@dataclass(frozen=True)
class ProfileInfo:
    """Measured curves of one profile run.

    Attributes:
        verify: batch size -> k -> spread of T_v(B, k) samples.
        draft_steps: draft -> batch size -> context length -> spread of T_s samples.
        typical_context: the context length T_v and T_s(B) were measured at.
        acceptance: one panel per (draft, mode).
        thresholds: the θ grid the tuner considers (marked on the calibration curve).
        telemetry: NVML samples (empty on a CPU).
        bias_front: the lossy acceptance front per draft (sampling profiles): theory and measured points.
    """

    run: RunRecord
    verify: dict[int, dict[int, Spread]]
    draft_steps: dict[str, dict[int, dict[int, Spread]]]
    typical_context: int | None
    acceptance: tuple[AcceptancePanel, ...]
    thresholds: tuple[float, ...]
    telemetry: tuple[TelemetryRow, ...]
    ar_step: Spread | None
    bias_front: tuple[BiasFrontRow, ...] = ()

    def front(self, draft: str) -> tuple[BiasFrontRow, ...]:
        """The front points of one draft (theory and measured)."""
        return tuple(r for r in self.bias_front if r.draft == draft)

    def panel(self, draft: str, mode: str = "greedy") -> AcceptancePanel | None:
        return next((p for p in self.acceptance if p.draft == draft and p.mode == mode), None)


def acceptance_panel(rec: AcceptanceRecord) -> AcceptancePanel:
    """Summarise one stored acceptance record (pure)."""
    bins = rec.confidence_bins
    edges = [float(e) for e in bins.get("edges") or []]
    drafted = [int(x) for x in bins.get("drafted") or []]
    accepted_bins = [int(x) for x in bins.get("accepted") or []]
    calibration = tuple((edges[i], edges[i + 1], drafted[i], accepted_bins[i])
                        for i in range(min(len(edges) - 1, len(drafted), len(accepted_bins))))
    accepted = sum(rec.position_accepts)
    total_drafted = sum(drafted) if drafted else None
    return AcceptancePanel(
        draft=rec.draft, mode=rec.mode, temperature=rec.temperature, cycles=rec.cycles,
        n_max=rec.num_speculative, alpha=rec.alpha, beta=rec.beta,
        acceptance_rate=accepted / total_drafted if total_drafted else None,
        mean_acceptance_length=1 + accepted / rec.cycles if rec.cycles else None,
        calibration=calibration, greedy_agreement=rec.greedy_agreement, one_minus_tv=rec.one_minus_tv,
    )


def summarize_timings(rows: Sequence[TimingRow]) -> tuple[dict, dict, Spread | None]:
    """(verify spreads by B and k, draft-step spreads by draft, B and context, plain-loop T_ar spread)."""
    verify: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    steps: dict[str, dict[int, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    ar: list[float] = []
    for r in rows:
        if r.kind == "verify":
            verify[r.batch_size][r.k].append(r.seconds)
        elif r.kind == "draft_step" and r.draft is not None:
            steps[r.draft][r.batch_size][r.context_len].append(r.seconds)
        elif r.kind == "autoregressive" and r.batch_size == 1:
            ar.append(r.seconds)
    v = {b: {k: spread(xs) for k, xs in sorted(ks.items())} for b, ks in sorted(verify.items())}
    s = {d: {b: {c: spread(xs) for c, xs in sorted(cs.items())} for b, cs in sorted(bs.items())}
         for d, bs in steps.items()}
    return v, s, spread(ar) if ar else None


def load_profile_info(db: Database, run_id: int) -> ProfileInfo:
    """Everything the Profile run page shows about run ``run_id``."""
    run = get_run(db, run_id)
    verify, steps, ar = summarize_timings(load_timings(db, run_id))
    order = {name: i for i, name in enumerate(run.draft_names)}
    panels = sorted((acceptance_panel(a) for a in load_acceptance(db, run_id)),
                    key=lambda p: (order.get(p.draft, len(order)), p.mode))
    typical = run.settings.typical_context
    return ProfileInfo(
        run=run, verify=verify, draft_steps=steps, typical_context=int(typical) if typical else None,
        acceptance=tuple(panels), thresholds=tuple(THRESHOLD_GRID), telemetry=tuple(load_telemetry(db, run_id)),
        ar_step=ar, bias_front=tuple(load_bias_front(db, run_id)),
    )
