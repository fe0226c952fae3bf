"""``regress --calibrate``: the suite against itself (A/A), the measured noise floor of every metric.

Each calibration round measures every benchmark twice, interleaved (arms A and B, same code, same
configuration), compares B with A exactly as a nightly run compares with its baseline, and counts
the cells the rule would have flagged (false alarms). Rounds run one after another, so each round's
A arm is also compared with the previous round's: the run-to-run drift a nightly comparison sees (a
shared machine's speed wanders by more than one run's own noise). Each metric's spread is the larger
of the standard deviation of log(B/A) within rounds and the root mean square of log(A_i/A_{i-1})
between rounds; its minimum detectable change (80 % power, 1 % two-sided test) comes from the
larger of that spread and the comparisons' own bootstrap standard error, and is the floor below
which ``decide`` gives a speed change no verdict (:func:`noise_floor`).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from specdec_tune.db import Database
from specdec_tune import db as q
from specdec_tune.profiler import environment_fingerprint, measure_arms
from specdec_tune.tuner.regress._compare import FLAGGED, compare_benchmark, decide
from specdec_tune.tuner.regress._run import EXIT_OK, RegressReport, arm_spec, resolve_config, stored_cell, suite_backend
from specdec_tune.tuner.regress._significance import minimum_detectable_change, proportion_mdc
from specdec_tune.tuner.regress._suite import Suite


def noise_spread(within_logs: list[float], between_logs: list[float]) -> float:
    """The larger of the within-round spread (stdev of log(B/A)) and the run-to-run drift (RMS of
    log(A_i/A_{i-1}), whose expectation is 0 for unchanged code); NaN when neither is known."""
    within = statistics.stdev(within_logs) if len(within_logs) > 1 else math.nan
    drift = math.sqrt(statistics.fmean(x * x for x in between_logs)) if between_logs else math.nan
    known = [x for x in (within, drift) if math.isfinite(x)]
    return max(known) if known else math.nan


def noise_floor(within_logs: list[float], between_logs: list[float], se_logs: list[float] = ()) -> float:
    """Minimum detectable change of a speed metric from its measured spreads (see module docstring)."""
    se = max([x for x in se_logs if math.isfinite(x)] + [noise_spread(within_logs, between_logs)], default=math.nan)
    return minimum_detectable_change(se) if math.isfinite(se) else math.nan


def aa_round(suite: Suite, configs: dict[str, dict], measure: Callable[..., dict] = measure_arms, progress=None):
    """One A/A round: both arms of every benchmark measured interleaved; returns (cells, samples A)."""
    arms = [arm_spec(c, f"{name}#{side}") for name, c in configs.items() for side in "AB"]
    samples = measure(arms, progress=progress)
    cells = []
    for name, cfg in configs.items():
        a = [s.to_json() for s in samples[f"{name}#A"]]
        b = [s.to_json() for s in samples[f"{name}#B"]]
        cells += compare_benchmark(name, a, b, cfg, suite.rules)
    return decide(cells, suite.rules, {}), {name: samples[f"{name}#A"] for name in configs}


def run_calibration(suite: Suite, db: Database, *, rounds: int | None = None, progress=None,
                    measure: Callable[..., dict] | None = None, vllm_python: str | None = None) -> RegressReport:
    """Run ``rounds`` (default ``rules.calibrate_runs``) A/A rounds; store each metric's spread."""
    rounds = rounds or suite.rules.calibrate_runs
    configs = {b.name: resolve_config(b) for b in suite.benchmark}
    default_measure, server = suite_backend(suite, vllm_python)
    measure = measure or default_measure
    fp = environment_fingerprint(suite.benchmark[0].device, suite.benchmark[0].backend, server)
    per_metric: dict[tuple[str, str], list] = {}
    between: dict[tuple[str, str], list] = {}
    last_cells, last_samples = [], {}
    for _ in range(rounds):
        previous = last_samples
        last_cells, last_samples = aa_round(suite, configs, measure, progress)
        for c in last_cells:
            if c.effect is not None and c.effect > 0 and math.isfinite(c.effect):
                per_metric.setdefault((c.benchmark, c.metric), []).append(c)
        for name, cfg in configs.items() if previous else ():
            for c in compare_benchmark(name, [s.to_json() for s in previous[name]],
                                       [s.to_json() for s in last_samples[name]], cfg, suite.rules):
                if c.effect is not None and c.effect > 0 and math.isfinite(c.effect):
                    between.setdefault((c.benchmark, c.metric), []).append(math.log(c.effect))
    run_id = q.create_regress_run(db, suite.name, kind="calibration", fingerprint=fp)
    for name, cfg in configs.items():
        q.add_regress_benchmark(db, run_id, name, cfg, [s.to_json() for s in last_samples[name]])
    rows, table = [], []
    for (bench, metric), cells in per_metric.items():
        logs = [math.log(c.effect) for c in cells]
        spread = noise_spread(logs, between.get((bench, metric), []))
        ses = [c.details.get("se_log") for c in cells if c.details.get("se_log") is not None]
        if metric.startswith("acceptance@"):
            k1, n1, *_ = cells[-1].details["counts"]
            floor = proportion_mdc(k1 / n1 if n1 else math.nan, n1)
            mdc = max(x for x in (floor, minimum_detectable_change(spread)) if not math.isnan(x)) \
                if not (math.isnan(floor) and math.isnan(spread)) else math.nan
        else:
            se = max([s for s in ses if math.isfinite(s)] + ([spread] if math.isfinite(spread) else []), default=math.nan)
            mdc = minimum_detectable_change(se)
        alarms = sum(c.verdict in FLAGGED for c in cells)
        rows.append(q.CalibrationRecord(run_id, suite.name, bench, metric, len(cells),
                                        spread if math.isfinite(spread) else None,
                                        max(abs(c.effect - 1) for c in cells), mdc if math.isfinite(mdc) else None,
                                        alarms))
        table.append({"benchmark": bench, "metric": metric, "runs": len(cells), "spread_log": spread,
                      "max_abs_change": max(abs(c.effect - 1) for c in cells), "mdc": mdc, "false_alarms": alarms})
    q.add_calibration(db, rows)
    report = RegressReport(suite.name, "calibration", run_id, None, "calibration", EXIT_OK, fp, cells=last_cells,
                           calibration=table)
    alarms = sum(r["false_alarms"] for r in table)
    report.notes.append(f"A/A calibration: {rounds} rounds; {alarms} cell(s) flagged by the rule in total "
                        "(each is a false alarm: both sides ran the same code)")
    q.add_regress_cells(db, [stored_cell(c, run_id) for c in last_cells])
    q.finish_regress_run(db, run_id, status="completed", verdict="calibration", exit_code=EXIT_OK,
                         summary={"calibration": table, "notes": report.notes})
    return report
