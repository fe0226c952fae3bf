"""How often does ``regress`` cry wolf, and which planted slowdown does it catch? (issue 13)

On the bundled suite (or ``--suite``), mimicking nightly runs on one machine:

1. Measure the suite once: the first baseline. Then ``--calib-runs`` further runs, each compared with
   the one before, measure the run-to-run noise floor of every speed metric, as
   ``regress --calibrate`` does (``tuner._regress_calibrate.noise_floor``); the comparisons below
   use it (``--calib-runs 0``: no floor, only the rule's min_drop).
2. A/A: ``--aa-runs`` further measurements of unchanged code, each compared with the newest passing
   run exactly as ``specdec-tune regress --baseline auto`` does (BH across all cells, persistence over
   consecutive runs). False-alarm rate = runs with at least one flagged cell; confirmed false alarms
   = runs with a regression (flagged twice in a row).
3. Planted slowdowns: for each percentage x in ``--slowdowns``, ``--runs-per-slowdown`` measurements
   with a test-only draft delay per proposal of x % of the benchmark's measured cycle time (so each
   cycle takes about x % longer), each compared with the last passing A/A run. Detected = the
   benchmark's tokens/s cell flagged; confirmed = regression (flagged in two consecutive runs).

No database is touched: the comparison is the library's (``tuner._regress_compare``), the
measurement the profiler's (``profiler.suite_runs``). Results go to ``--out`` (JSON) and stdout.

    OMP_NUM_THREADS=1 python benchmarks/regress_noise.py --out benchmarks/results/regress_noise.json
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace

import torch

from specdec_tune.profiler.suite_runs import measure_arms
from specdec_tune.tuner._regress_calibrate import noise_floor
from specdec_tune.tuner._regress_compare import FLAGGED, SPEED_METRICS, compare_benchmark, decide
from specdec_tune.tuner._suite import default_suite_path, load_suite
from specdec_tune.tuner.regress import _arm, resolve_config


def measure(configs: dict[str, dict], delays: dict[str, float] | None = None) -> dict[str, list[dict]]:
    arms = [_arm(dict(c, draft_delay_ms=(delays or {}).get(n, 0.0)), n) for n, c in configs.items()]
    return {k: [s.to_json() for s in v] for k, v in measure_arms(arms).items()}


def compare(suite, configs, base, cur, history, calib=None):
    cells = []
    for name, cfg in configs.items():
        cells += compare_benchmark(name, base[name], cur[name], cfg, suite.rules, calib=calib)
    cells = decide(cells, suite.rules, history)
    flagged = {(c.benchmark, c.metric) for c in cells if c.verdict in FLAGGED}
    new_history = {k: history.get(k, 0) + 1 for k in flagged}
    return cells, new_history


def cycle_ms(samples: list[dict]) -> float:
    cycles = sum(s["cycles"] for s in samples)
    wall = sum(statistics.median(s["seconds"]) for s in samples)
    return 1e3 * wall / max(cycles, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(default_suite_path()))
    ap.add_argument("--aa-runs", type=int, default=20)
    ap.add_argument("--calib-runs", type=int, default=3, help="runs measuring the run-to-run noise floor first")
    ap.add_argument("--slowdowns", default="5,10,20", help="planted per-cycle delays, percent")
    ap.add_argument("--runs-per-slowdown", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=None, help="override every benchmark's prompt count")
    ap.add_argument("--repeats", type=int, default=None, help="override every benchmark's repeats")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    suite = load_suite(args.suite)
    if suite.threads:
        torch.set_num_threads(suite.threads)
    configs = {b.name: resolve_config(b) for b in suite.benchmark}
    for c in configs.values():
        c.update({k: v for k, v in (("prompts", args.prompts), ("repeats", args.repeats)) if v is not None})
    start = time.time()
    aa: list = []
    planted: list = []

    def save(done: bool) -> None:  # after every run: a killed benchmark keeps what it measured
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"suite": suite.name, "complete": done, "aa": aa, "planted": planted,
                           "seconds": time.time() - start}, f, indent=1, default=float)

    baseline = measure(configs)
    drift: dict = {}
    ses: dict = {}
    for i in range(args.calib_runs):
        cur = measure(configs)
        for name, cfg in configs.items():
            for c in compare_benchmark(name, baseline[name], cur[name], cfg, suite.rules):
                if c.metric in SPEED_METRICS and c.effect:
                    drift.setdefault((name, c.metric), []).append(math.log(c.effect))
                    ses.setdefault((name, c.metric), []).append(c.details.get("se_log", math.nan))
        print(f"calibration {i + 1}/{args.calib_runs}: " + ", ".join(
            f"{k[0]}/{k[1]} {math.exp(v[-1]):.3f}" for k, v in drift.items() if k[1] != "latency"), flush=True)
        baseline = cur
    calib = {k: noise_floor([], v, ses[k]) for k, v in drift.items()}
    calib_out = {f"{k[0]}/{k[1]}": v for k, v in calib.items()}
    print("noise floor (minimum detectable change): " + ", ".join(f"{k} {v:.1%}" for k, v in calib_out.items()), flush=True)
    history: dict = {}
    for i in range(args.aa_runs):
        cur = measure(configs)
        cells, history = compare(suite, configs, baseline, cur, history, calib)
        flagged = sorted({f"{c.benchmark}/{c.metric}" for c in cells if c.verdict in FLAGGED})
        regressed = sorted({f"{c.benchmark}/{c.metric}" for c in cells if c.verdict == "regression"})
        ratios = {c.benchmark: c.effect for c in cells if c.metric == "tokens_per_s"}
        speedups = {c.benchmark: c.effect for c in cells if c.metric == "speedup"}
        aa.append({"run": i + 1, "flagged": flagged, "regression": regressed, "tokens_per_s_ratio": ratios,
                   "speedup_ratio": speedups})
        print(f"A/A {i + 1}/{args.aa_runs}: flagged {flagged or 'none'}; tokens/s ratios "
              + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()) + "; speedup ratios "
              + ", ".join(f"{k} {v:.3f}" for k, v in speedups.items() if v), flush=True)
        if not flagged:
            baseline = cur  # --baseline auto: the newest passing run
        save(False)
    base_cycle = {n: cycle_ms(baseline[n]) for n in configs}
    for pct in [float(x) for x in args.slowdowns.split(",") if x]:
        delays = {n: base_cycle[n] * pct / 100 for n in configs}
        history, runs = {}, []
        for i in range(args.runs_per_slowdown):
            cur = measure(configs, delays)
            cells, history = compare(suite, configs, baseline, cur, history, calib)
            per = {}
            for n in configs:
                tps = next(c for c in cells if c.benchmark == n and c.metric == "tokens_per_s")
                sp = next(c for c in cells if c.benchmark == n and c.metric == "speedup")
                # detected = either speed cell of the benchmark flagged
                verdict = next((c.verdict for c in (sp, tps) if c.verdict == "regression"),
                               next((c.verdict for c in (sp, tps) if c.verdict in FLAGGED), tps.verdict))
                per[n] = {"ratio": tps.effect, "verdict": verdict, "q": tps.q_value, "mdc": tps.mdc,
                          "speedup_ratio": sp.effect, "speedup_verdict": sp.verdict, "speedup_mdc": sp.mdc,
                          "tokens_per_s_verdict": tps.verdict}
            runs.append(per)
            save(False)
            print(f"slowdown {pct:g}% run {i + 1}: " + ", ".join(
                f"{n} tokens/s {v['ratio']:.3f} speedup {v['speedup_ratio']:.3f} {v['verdict']}" for n, v in per.items()),
                flush=True)
        summary = {n: {"delay_ms": delays[n],
                       "detected": sum(r[n]["verdict"] in FLAGGED for r in runs),
                       "confirmed": sum(r[n]["verdict"] == "regression" for r in runs),
                       "median_ratio": statistics.median(r[n]["ratio"] for r in runs)} for n in configs}
        planted.append({"slowdown_pct": pct, "runs": len(runs), "per_benchmark": summary, "detail": runs})
    fa = sum(bool(r["flagged"]) for r in aa)
    confirmed = sum(bool(r["regression"]) for r in aa)
    result = {"suite": suite.name, "rules": suite.rules.model_dump(), "aa_runs": len(aa), "noise_floor": calib_out,
              "calib_runs": args.calib_runs,
              "false_alarm_runs": fa, "confirmed_false_alarm_runs": confirmed, "aa": aa, "planted": planted,
              "cycle_ms": base_cycle, "seconds": time.time() - start, "threads": torch.get_num_threads()}
    print(f"\nA/A: {fa}/{len(aa)} runs with a flagged cell, {confirmed}/{len(aa)} with a confirmed regression")
    for p in planted:
        for n, s in p["per_benchmark"].items():
            print(f"+{p['slowdown_pct']:g}% cycle time ({s['delay_ms']:.2f} ms/proposal) {n}: detected "
                  f"{s['detected']}/{p['runs']}, confirmed {s['confirmed']}/{p['runs']}, median tokens/s ratio "
                  f"{s['median_ratio']:.3f}")
    print(f"total {result['seconds']:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
