"""How often does ``regress`` cry wolf, and which planted slowdown does it catch?

On the bundled suite (or ``--suite``), mimicking nightly runs on one machine:

1. Measure the suite once: the first baseline. Then ``--calib-runs`` further runs, each compared with
   the one before, measure the run-to-run noise floor of every speed metric, as
   ``regress --calibrate`` does (``tuner.regress.noise_floor``); the comparisons below
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

No database is touched: the comparison is the library's (``tuner.regress.compare_benchmark`` and
``decide``), the measurement the profiler's (``profiler.measure_arms``). Results go to ``--out``
(JSON) and stdout.

    OMP_NUM_THREADS=1 python benchmarks/regress_noise.py --out benchmarks/results/regress_noise.json
"""
from __future__ import annotations

import json
import math
import statistics
import time
from typing import Annotated

import torch
import typer

from specdec_tune.cli import _options as opts
from specdec_tune.profiler import measure_arms
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
from specdec_tune.tuner.regress import arm_spec

AaRuns = Annotated[int, typer.Option("--aa-runs", help=(
    "A/A runs: unchanged code, each compared with the newest passing run."))]
CalibRuns = Annotated[int, typer.Option("--calib-runs", help="Runs measuring the run-to-run noise floor first.")]
Slowdowns = Annotated[str, typer.Option("--slowdowns", help="Planted per-cycle delays, percent, comma-separated.")]
RunsPerSlowdown = Annotated[int, typer.Option("--runs-per-slowdown", help="Runs at each planted slowdown.")]
Prompts = Annotated[int | None, typer.Option("--prompts", help="Override every benchmark's prompt count.")]
Repeats = Annotated[int | None, typer.Option("--repeats", help="Override every benchmark's repeats.")]
Out = Annotated[str | None, typer.Option("--out", help="Write the results here (JSON; rewritten after every run).")]


def measure(configs: dict[str, dict], delays: dict[str, float] | None = None) -> dict[str, list[dict]]:
    arms = [arm_spec(dict(c, draft_delay_ms=(delays or {}).get(n, 0.0)), n) for n, c in configs.items()]
    return {k: [s.to_json() for s in v] for k, v in measure_arms(arms).items()}


def compare(suite, configs, base, cur, history, calib=None, machine=True):
    cells = []
    for name, cfg in configs.items():
        cells += compare_benchmark(name, base[name], cur[name], cfg, suite.rules, calib=calib, machine=machine)
    cells = decide(cells, suite.rules, history)
    flagged = {(c.benchmark, c.metric) for c in cells if c.verdict in FLAGGED}
    new_history = {k: history.get(k, 0) + 1 for k in flagged}
    return cells, new_history


def cycle_ms(samples: list[dict]) -> float:
    cycles = sum(s["cycles"] for s in samples)
    wall = sum(statistics.median(s["seconds"]) for s in samples)
    return 1e3 * wall / max(cycles, 1)


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

    def calibrate(self, suite, configs: dict, cur: dict) -> str:
        """One calibration run: each speed cell's log ratio to the run before; this run becomes the baseline."""
        for name, cfg in configs.items():
            for c in compare_benchmark(name, self.baseline[name], cur[name], cfg, suite.rules, machine=self.machine):
                if c.metric in SPEED_METRICS and c.effect:
                    self.drift.setdefault((name, c.metric), []).append(math.log(c.effect))
                    self.ses.setdefault((name, c.metric), []).append(c.details.get("se_log", math.nan))
        self.baseline = cur
        return self.name + " " + ", ".join(f"{k[0]}/{k[1]} {math.exp(v[-1]):.3f}" for k, v in self.drift.items()
                                           if k[1] == "tokens_per_s")

    def aa_run(self, suite, configs: dict, cur: dict, run: int) -> str:
        """One A/A run compared as ``regress --baseline auto`` does; a passing run becomes the baseline."""
        cells, self.history = compare(suite, configs, self.baseline, cur, self.history, self.calib, self.machine)
        flagged = sorted({f"{c.benchmark}/{c.metric}" for c in cells if c.verdict in FLAGGED})
        regressed = sorted({f"{c.benchmark}/{c.metric}" for c in cells if c.verdict == "regression"})
        tps = {c.benchmark: c for c in cells if c.metric == "tokens_per_s"}
        self.aa.append({"run": run, "flagged": flagged, "regression": regressed,
                        "tokens_per_s_ratio": {k: c.effect for k, c in tps.items()},
                        "machine_ratio": {k: c.details.get("machine_ratio") for k, c in tps.items()},
                        "speedup_ratio": {c.benchmark: c.effect for c in cells if c.metric == "speedup"}})
        if not flagged:
            self.baseline = cur  # --baseline auto: the newest passing run
        return (f"{self.name}: flagged {flagged or 'none'}, tokens/s "
                + ", ".join("-" if v is None else f"{v:.3f}" for v in self.aa[-1]["tokens_per_s_ratio"].values()))

    def summary(self) -> dict:
        return {"machine_probe_divided_out": self.machine,
                "noise_floor": {f"{k[0]}/{k[1]}": v for k, v in self.calib.items()},
                "false_alarm_runs": sum(bool(x["flagged"]) for x in self.aa),
                "confirmed_false_alarm_runs": sum(bool(x["regression"]) for x in self.aa), "aa": self.aa,
                "planted": self.planted}


class Session:
    """The suite's benchmarks and the two rules; the results file is rewritten after every run, so a
    killed benchmark keeps what it measured."""

    def __init__(self, suite, configs: dict[str, dict], out: str | None) -> None:
        self.suite, self.configs, self.out = suite, configs, out
        self.rules = [Rule("machine", True), Rule("raw", False)]
        self.start = time.time()

    def save(self) -> None:
        if self.out:
            with open(self.out, "w") as f:
                json.dump({"suite": self.suite.name, "complete": False, "seconds": time.time() - self.start,
                           **{r.name: {"aa": r.aa, "planted": r.planted} for r in self.rules}},
                          f, indent=1, default=float)


def main(
    suite: opts.SuiteOption = None,
    aa_runs: AaRuns = 20,
    calib_runs: CalibRuns = 3,
    slowdowns: Slowdowns = "5,10,20",
    runs_per_slowdown: RunsPerSlowdown = 10,
    prompts: Prompts = None,
    repeats: Repeats = None,
    out: Out = None,
) -> None:
    spec = load_suite(suite or default_suite_path())
    if spec.threads:
        torch.set_num_threads(spec.threads)
    configs = {b.name: resolve_config(b) for b in spec.benchmark}
    for c in configs.values():
        c.update({k: v for k, v in (("prompts", prompts), ("repeats", repeats)) if v is not None})
    session = Session(spec, configs, out)
    first = measure(configs)
    for r in session.rules:
        r.baseline = first
    for i in range(calib_runs):
        cur = measure(configs)
        print(f"calibration {i + 1}/{calib_runs}: " + "; ".join(r.calibrate(spec, configs, cur) for r in session.rules),
              flush=True)
    for r in session.rules:
        r.calib = {k: noise_floor([], v, r.ses[k]) for k, v in r.drift.items()}
        print(f"noise floor ({r.name}): " + ", ".join(f"{k[0]}/{k[1]} {v:.1%}" for k, v in r.calib.items()), flush=True)
    for i in range(aa_runs):
        cur = measure(configs)
        line = [r.aa_run(spec, configs, cur, i + 1) for r in session.rules]
        machine = [v for v in session.rules[0].aa[-1]["machine_ratio"].values() if v]
        print(f"A/A {i + 1}/{aa_runs}: " + "; ".join(line)
              + (f"; probe current/baseline {statistics.median(machine):.3f}" if machine else ""), flush=True)
        session.save()
    for pct in [float(x) for x in slowdowns.split(",") if x]:
        _planted(session, pct, runs_per_slowdown)
    _report(session, aa_runs, calib_runs)


def _planted(session: Session, pct: float, runs: int) -> None:
    """``runs`` runs with a draft delay of ``pct`` % of each benchmark's cycle time, each compared with
    the last passing A/A run; what each rule detected and confirmed."""
    configs, rules = session.configs, session.rules
    ref = rules[0].baseline
    delays = {n: cycle_ms(ref[n]) * pct / 100 for n in configs}
    found: dict[str, list] = {r.name: [] for r in rules}
    history: dict[str, dict] = {r.name: {} for r in rules}
    for i in range(runs):
        cur = measure(configs, delays)
        for r in rules:
            cells, history[r.name] = compare(session.suite, configs, r.baseline, cur, history[r.name], r.calib,
                                             r.machine)
            found[r.name].append({n: _detection(cells, n) for n in configs})
        session.save()
        print(f"slowdown {pct:g}% run {i + 1}: " + "; ".join(r.name + " " + ", ".join(
            f"{n} tokens/s {v['ratio']:.3f} speedup {v['speedup_ratio']:.3f} {v['verdict']}"
            for n, v in found[r.name][-1].items()) for r in rules), flush=True)
    for r in rules:
        rs = found[r.name]
        summary = {n: {"delay_ms": delays[n], "detected": sum(x[n]["verdict"] in FLAGGED for x in rs),
                       "detected_by_tokens_per_s": sum(x[n]["tokens_per_s_verdict"] in FLAGGED for x in rs),
                       "confirmed": sum(x[n]["verdict"] == "regression" for x in rs),
                       "median_ratio": statistics.median(x[n]["ratio"] for x in rs)} for n in configs}
        r.planted.append({"slowdown_pct": pct, "runs": len(rs), "per_benchmark": summary, "detail": rs})


def _detection(cells: list, benchmark: str) -> dict:
    """One benchmark's speed cells in one planted run: detected = either speed cell flagged."""
    tps = next(c for c in cells if c.benchmark == benchmark and c.metric == "tokens_per_s")
    sp = next(c for c in cells if c.benchmark == benchmark and c.metric == "speedup")
    verdict = next((c.verdict for c in (sp, tps) if c.verdict == "regression"),
                   next((c.verdict for c in (sp, tps) if c.verdict in FLAGGED), tps.verdict))
    return {"ratio": tps.effect, "verdict": verdict, "q": tps.q_value, "mdc": tps.mdc,
            "speedup_ratio": sp.effect, "speedup_verdict": sp.verdict, "speedup_mdc": sp.mdc,
            "tokens_per_s_verdict": tps.verdict}


def _report(session: Session, aa_runs: int, calib_runs: int) -> None:
    """False alarms and detections per rule, printed and (with --out) written."""
    suite = session.suite
    result = {"suite": suite.name, "rules": suite.rules.model_dump(), "aa_runs": aa_runs,
              "calib_runs": calib_runs, "seconds": time.time() - session.start, "threads": torch.get_num_threads(),
              "comparisons": {}}
    print()
    for r in session.rules:
        s = result["comparisons"][r.name] = r.summary()
        print(f"{r.name}: A/A {s['false_alarm_runs']}/{len(r.aa)} runs with a flagged cell, "
              f"{s['confirmed_false_alarm_runs']}/{len(r.aa)} with a confirmed regression")
        for p in r.planted:
            for n, x in p["per_benchmark"].items():
                print(f"  +{p['slowdown_pct']:g}% cycle time ({x['delay_ms']:.2f} ms/proposal) {n}: detected "
                      f"{x['detected']}/{p['runs']} (tokens/s cell {x['detected_by_tokens_per_s']}), confirmed "
                      f"{x['confirmed']}/{p['runs']}, median tokens/s ratio {x['median_ratio']:.3f}")
    print(f"total {result['seconds']:.0f} s")
    if session.out:
        with open(session.out, "w") as f:
            json.dump(result, f, indent=1, default=float)


if __name__ == "__main__":
    opts.run_script(main)
