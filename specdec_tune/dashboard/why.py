"""The Why it wins page's data: predicted cycle budgets, the (N, θ) throughput map per draft with the
measured points on it, and what each server can express.

Every predicted number comes from the tuner: :func:`~specdec_tune.tuner.model.load_run_profile`
builds the run's profile, :func:`~specdec_tune.tuner.model.best_configs` predicts and ranks
the whole (N, θ) grid (its ``top`` is set to the grid size, so one call gives both the map and the
ranking), and :func:`~specdec_tune.tuner.model.draft_step_time` prices a draft step. A cycle's time
splits as the model sums it: E[F]·T_s(B) (draft steps) + Σ P(L = l)·T_v(B, l + 1) (verify) + o_c.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from specdec_tune.dashboard.measured import is_baseline, measured_ci, measured_split, short_name
from specdec_tune.db import Database, MeasuredRecord, get_run, list_measured
from specdec_tune.core.errors import SpecdecError
from specdec_tune.tuner.model import (
    THRESHOLD_GRID,
    Candidate,
    RunPrediction,
    RunProfile,
    SpecConfig,
    best_configs,
    draft_step_time,
    load_run_profile,
    predict_baseline,
    predict_config,
)


CHOSEN = "tuner's choice: "  # the label prefix of the bar of the configuration a tuning chose


@dataclass(frozen=True)
class CycleBudget:
    """Where one configuration's average decode cycle goes (predicted, milliseconds) and what it yields.

    ``speedup`` is ``tokens_per_s`` over the page's one plain-decoding prediction (the target-only profile's,
    which the search ranks every configuration against): every speedup on the page divides by the plain
    decoding it shows. (A draft's own profile is calibrated to that draft's decoding passes, so the plain
    decoding predicted from it differs by a few percent.)
    """

    draft: str
    label: str
    num_speculative_tokens: int
    threshold: float
    draft_ms: float
    verify_ms: float
    overhead_ms: float
    tokens_per_cycle: float
    draft_length: float
    tokens_per_s: float
    speedup: float
    source: str

    @property
    def cycle_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.overhead_ms

    @property
    def ms_per_token(self) -> float:
        return self.cycle_ms / self.tokens_per_cycle


@dataclass(frozen=True)
class MeasuredPoint:
    """A measured configuration of this draft placed on the heat map."""

    num_speculative_tokens: int
    threshold: float
    measured: float
    predicted: float | None
    ci: tuple[float, float] | None
    split: str


@dataclass(frozen=True)
class HeatMap:
    """Predicted end-to-end tokens/s over N (columns) and θ (rows) for one draft."""

    draft: str
    ns: tuple[int, ...]
    thresholds: tuple[float, ...]
    tokens_per_s: tuple[tuple[float | None, ...], ...]  # [θ][N]
    measured: tuple[MeasuredPoint, ...]


@dataclass(frozen=True)
class WhyInfo:
    run_id: int
    batch_size: int
    baseline: CycleBudget
    ranked: tuple[CycleBudget, ...]  # best first: the chosen configuration and its runners-up
    heatmaps: tuple[HeatMap, ...]
    skipped: tuple[str, ...]  # drafts that could not be predicted, with the reason


def budget(rp: RunProfile, config: SpecConfig, p: RunPrediction,
           plain_tokens_per_s: float | None = None) -> CycleBudget:
    """Split the predicted cycle of ``config`` into draft steps, verify and overhead; its speedup is over
    ``plain_tokens_per_s`` (default: the prediction's own baseline)."""
    if p.source == "baseline":
        overhead = rp.model.ar_overhead_s
        draft_s = 0.0
    else:
        overhead = rp.cycle_overhead_s
        draft_s = p.expected_draft_forwards * draft_step_time(rp.model, config.batch_size)
    verify = max(p.cycle_time_s - draft_s - overhead, 0.0)
    name = rp.draft or "none"
    spec = config.spec
    label = "plain decoding" if p.source == "baseline" else (
        f"{short_name(name)} N={spec.num_speculative_tokens}" + (f" θ={spec.threshold:g}" if spec.threshold else ""))
    return CycleBudget(
        draft=name, label=label, num_speculative_tokens=spec.num_speculative_tokens, threshold=spec.threshold,
        draft_ms=draft_s * 1e3, verify_ms=verify * 1e3, overhead_ms=overhead * 1e3,
        tokens_per_cycle=p.expected_tokens_per_cycle, draft_length=p.expected_draft_length,
        tokens_per_s=p.tokens_per_s, source=p.source,
        speedup=p.tokens_per_s / plain_tokens_per_s if plain_tokens_per_s else p.speedup,
    )


def chosen_budget(db: Database, run_id: int, candidate: Candidate, batch_size: int = 1,
                  temperature: float = 0.0) -> CycleBudget | None:
    """The cycle budget of the configuration a tuning chose (``None`` if this run cannot predict it).

    The candidate becomes the model's configuration through ``tuner.model.spec_config`` (schedule
    and θ rule included), so the bar shows exactly what the tuner predicted for it.
    """
    from specdec_tune.tuner.model import spec_config

    try:
        mode = "sampling" if temperature > 0 else "greedy"
        config = spec_config(candidate, mode, batch_size)
        base_rp = load_run_profile(db, run_id, baseline_only=True)
        plain = predict_baseline(base_rp, batch_size)
        if candidate.is_plain:
            return budget(base_rp, config, plain)
        rp = load_run_profile(db, run_id, candidate.drafter)
        b = budget(rp, config, predict_config(rp, config), plain.tokens_per_s)
    except SpecdecError:
        return None
    return replace(b, label=f"{CHOSEN}{candidate.label().replace(candidate.drafter, short_name(candidate.drafter))}")


def _measured_points(records: Sequence[MeasuredRecord], draft: str, batch_size: int,
                     temperature: float) -> tuple[MeasuredPoint, ...]:
    out = []
    for r in records:
        c = r.config
        if (r.draft != draft or is_baseline(r) or int(c.get("batch_size", 1)) != batch_size
                or float(c.get("temperature") or 0.0) != temperature or c.get("schedule", "constant") != "constant"):
            continue
        out.append(MeasuredPoint(int(c["num_speculative_tokens"]), float(c.get("threshold") or 0.0),
                                 r.measured_tokens_per_s, r.predicted_tokens_per_s, measured_ci(r), measured_split(r)))
    return tuple(out)


def heat_map(rp: RunProfile, scored: Sequence[tuple[SpecConfig, RunPrediction]], ns: Sequence[int],
             thresholds: Sequence[float], measured: tuple[MeasuredPoint, ...] = ()) -> HeatMap:
    """Arrange ``best_configs`` output on the (θ, N) grid (cells the model cannot predict stay ``None``)."""
    cells = {(c.spec.num_speculative_tokens, c.spec.threshold): p.tokens_per_s for c, p in scored}
    return HeatMap(draft=rp.draft or "none", ns=tuple(ns), thresholds=tuple(thresholds),
                   tokens_per_s=tuple(tuple(cells.get((n, t)) for n in ns) for t in thresholds), measured=measured)


def load_why(db: Database, run_id: int, drafts: Sequence[str] | None = None, batch_size: int = 1,
             runners_up: int = 4) -> WhyInfo:
    """Predict the (N, θ) grid of every draft of run ``run_id`` and rank it (greedy, constant schedule).

    Args:
        db: the results database.
        run_id: a profile run.
        drafts: the drafts to include (default: all of the run's).
        batch_size: B for the predictions (a batch size the run profiled).
        runners_up: how many configurations to show after the best one.
    """
    run = get_run(db, run_id)
    names = list(drafts) if drafts is not None else run.draft_names
    ns = list(range(1, run.settings.n_max + 1))
    records = list_measured(db, run_id)
    base_rp = load_run_profile(db, run_id, baseline_only=True)
    base_pred = predict_baseline(base_rp, batch_size)
    baseline = budget(base_rp, SpecConfig(0, 0.0, batch_size=batch_size), base_pred)
    ranked: list[CycleBudget] = []
    maps, skipped = [], []
    for name in names:
        try:
            rp = load_run_profile(db, run_id, name)
            thresholds = [0.0] if rp.is_ngram else list(THRESHOLD_GRID)
            scored = best_configs(rp, ns, thresholds, batch_size=batch_size, top=len(ns) * len(thresholds))
        except SpecdecError as exc:
            skipped.append(f"{short_name(name)}: {exc}")
            continue
        if not scored:
            skipped.append(f"{short_name(name)}: no configuration could be predicted (no acceptance traces)")
            continue
        maps.append(heat_map(rp, scored, ns, thresholds, _measured_points(records, name, batch_size, 0.0)))
        ranked.extend(budget(rp, c, p, base_pred.tokens_per_s) for c, p in scored[: runners_up + 1])
    ranked.sort(key=lambda b: -b.tokens_per_s)
    return WhyInfo(run_id=run_id, batch_size=batch_size, baseline=baseline, ranked=tuple(ranked[: runners_up + 1]),
                   heatmaps=tuple(maps), skipped=tuple(skipped))
