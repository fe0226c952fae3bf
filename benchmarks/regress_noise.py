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

Every comparison is made twice on the same measurements: with the machine probe divided out of
tokens/s and latency (the default rule, ``profiler.machine_probe``) and on raw absolute speed, each
with its own noise floor, persistence and newest passing baseline; so the probe's effect on false
alarms and on detection is measured paired, not across two stretches of machine time.

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

import torch

from specdec_tune.profiler.suite_runs import measure_arms
from specdec_tune.tuner.regress import (
    FLAGGED,
    SPEED_METRICS,
    compare_benchmark,
    decide,
    default_suite_path,
    load_suite,
    noise_floor,
    resolve_config,
)
from specdec_tune.tuner.regress._run import _arm


def measure(configs: dict[str, dict], delays: dict[str, float] | None = None) -> dict[str, list[dict]]:
    arms = [_arm(dict(c, draft_delay_ms=(delays or {}).get(n, 0.0)), n) for n, c in configs.items()]
    return {k: [s.to_json() for s in v] for k, v in measure_arms(arms).items()}


def compare(suite, configs, base, cur, history, calib=None, machine=True):
    cells = []
    for name, cfg in configs.items():
        cells += compare_benchmark(name, base[name], cur[name], cfg, suite.rules, calib=calib, machine=machine)
    cells = decide(cells, suite.rules, history)
    flagged = {(c.benchmark, c.metric) for c in cells if c.verdict in FLAGGED}
    new_history = {k: history.get(k, 0) + 1 for k in flagged}
    return cells, new_history


class Rule:
    """One way of comparing (machine probe divided out, or raw absolute speed), with its own noise
    floor, persistence history and newest passing run, all fed the same measurements."""

    def __init__(self, name: str, machine: bool) -> None:
        self.name, self.machine = name, machine
        self.baseline, self.history, self.calib = None, {}, None
        self.drift: dict = {}
        self.ses: dict = {}
        self.aa: list = []
        self.planted: list = []


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
    rules = [Rule("machine", True), Rule("raw", False)]

    def save(done: bool, extra=None) -> None:  # after every run: a killed benchmark keeps what it measured
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"suite": suite.name, "complete": done, "seconds": time.time() - start,
                           **{r.name: {"aa": r.aa, "planted": r.planted} for r in rules}, **(extra or {})},
                          f, indent=1, default=float)

    first = measure(configs)
    for r in rules:
        r.baseline = first
    for i in range(args.calib_runs):
        cur = measure(configs)
        for r in rules:
            for name, cfg in configs.items():
                for c in compare_benchmark(name, r.baseline[name], cur[name], cfg, suite.rules, machine=r.machine):
                    if c.metric in SPEED_METRICS and c.effect:
                        r.drift.setdefault((name, c.metric), []).append(math.log(c.effect))
                        r.ses.setdefault((name, c.metric), []).append(c.details.get("se_log", math.nan))
            r.baseline = cur
        print(f"calibration {i + 1}/{args.calib_runs}: " + "; ".join(
            r.name + " " + ", ".join(f"{k[0]}/{k[1]} {math.exp(v[-1]):.3f}" for k, v in r.drift.items()
                                     if k[1] == "tokens_per_s") for r in rules), flush=True)
    for r in rules:
        r.calib = {k: noise_floor([], v, r.ses[k]) for k, v in r.drift.items()}
        print(f"noise floor ({r.name}): " + ", ".join(f"{k[0]}/{k[1]} {v:.1%}" for k, v in r.calib.items()), flush=True)
    for i in range(args.aa_runs):
        cur = measure(configs)
        line = []
        for r in rules:
            cells, r.history = compare(suite, configs, r.baseline, cur, r.history, r.calib, r.machine)
            flagged = sorted({f"{c.benchmark}/{c.metric}" for c in cells if c.verdict in FLAGGED})
            regressed = sorted({f"{c.benchmark}/{c.metric}" for c in cells if c.verdict == "regression"})
            tps = {c.benchmark: c for c in cells if c.metric == "tokens_per_s"}
            r.aa.append({"run": i + 1, "flagged": flagged, "regression": regressed,
                         "tokens_per_s_ratio": {k: c.effect for k, c in tps.items()},
                         "machine_ratio": {k: c.details.get("machine_ratio") for k, c in tps.items()},
                         "speedup_ratio": {c.benchmark: c.effect for c in cells if c.metric == "speedup"}})
            if not flagged:
                r.baseline = cur  # --baseline auto: the newest passing run
            line.append(f"{r.name}: flagged {flagged or 'none'}, tokens/s "
                        + ", ".join("-" if v is None else f"{v:.3f}" for v in r.aa[-1]["tokens_per_s_ratio"].values()))
        machine = [v for v in rules[0].aa[-1]["machine_ratio"].values() if v]
        print(f"A/A {i + 1}/{args.aa_runs}: " + "; ".join(line)
              + (f"; probe current/baseline {statistics.median(machine):.3f}" if machine else ""), flush=True)
        save(False)
    for pct in [float(x) for x in args.slowdowns.split(",") if x]:
        ref = rules[0].baseline
        delays = {n: cycle_ms(ref[n]) * pct / 100 for n in configs}
        runs = {r.name: [] for r in rules}
        history = {r.name: {} for r in rules}
        for i in range(args.runs_per_slowdown):
            cur = measure(configs, delays)
            for r in rules:
                cells, history[r.name] = compare(suite, configs, r.baseline, cur, history[r.name], r.calib, r.machine)
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
                runs[r.name].append(per)
            save(False)
            print(f"slowdown {pct:g}% run {i + 1}: " + "; ".join(r.name + " " + ", ".join(
                f"{n} tokens/s {v['ratio']:.3f} speedup {v['speedup_ratio']:.3f} {v['verdict']}"
                for n, v in runs[r.name][-1].items()) for r in rules), flush=True)
        for r in rules:
            rs = runs[r.name]
            summary = {n: {"delay_ms": delays[n], "detected": sum(x[n]["verdict"] in FLAGGED for x in rs),
                           "detected_by_tokens_per_s": sum(x[n]["tokens_per_s_verdict"] in FLAGGED for x in rs),
                           "confirmed": sum(x[n]["verdict"] == "regression" for x in rs),
                           "median_ratio": statistics.median(x[n]["ratio"] for x in rs)} for n in configs}
            r.planted.append({"slowdown_pct": pct, "runs": len(rs), "per_benchmark": summary, "detail": rs})
    result = {"suite": suite.name, "rules": suite.rules.model_dump(), "aa_runs": args.aa_runs,
              "calib_runs": args.calib_runs, "seconds": time.time() - start, "threads": torch.get_num_threads(),
              "comparisons": {}}
    print()
    for r in rules:
        fa = sum(bool(x["flagged"]) for x in r.aa)
        confirmed = sum(bool(x["regression"]) for x in r.aa)
        result["comparisons"][r.name] = {
            "machine_probe_divided_out": r.machine, "noise_floor": {f"{k[0]}/{k[1]}": v for k, v in r.calib.items()},
            "false_alarm_runs": fa, "confirmed_false_alarm_runs": confirmed, "aa": r.aa, "planted": r.planted}
        print(f"{r.name}: A/A {fa}/{len(r.aa)} runs with a flagged cell, {confirmed}/{len(r.aa)} with a confirmed "
              f"regression")
        for p in r.planted:
            for n, x in p["per_benchmark"].items():
                print(f"  +{p['slowdown_pct']:g}% cycle time ({x['delay_ms']:.2f} ms/proposal) {n}: detected "
                      f"{x['detected']}/{p['runs']} (tokens/s cell {x['detected_by_tokens_per_s']}), confirmed "
                      f"{x['confirmed']}/{p['runs']}, median tokens/s ratio {x['median_ratio']:.3f}")
    print(f"total {result['seconds']:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
