"""Latency fidelity on held-out prompts: the predicted TPOT distribution (p50, p90) against measurement.

Profile on the tuning half of a workload (or reuse ``--run``), then measure a grid of configurations
interleaved on the held-out half (prompts the profile never saw) and compare, per configuration, the
measured p50 and p90 of per-request TPOT (decode window, first token excluded; each prompt's TPOT the
median of its repeats; 95% bootstrap CIs) with the model's prediction from the profile alone
(``tuner.model.predict_latency``: per-cycle times × the replayed acceptance of each profiled prompt).
The goal: median |error| ≤ 5 % for p50 and for p90, over the speculative configurations.

Three predictions are compared: at the profile's machine speed (primary); rescaled as ``measure``
stores them (to plain decoding's measured ÷ predicted tokens/s for the speculative configurations,
to the machine probe for plain decoding: ``tuner.search._validate._speeds``; the probe, a 20-40 ms
snapshot between turns, reads the load of that moment, and its factors have ranged 0.81-2.29); and
at the speed plain decoding measured in the same interleaved passes (its mean
TPOT measured over predicted), which removes the machine's drift between the profile and the
measurement (on the 2-core VM the profile's plain step has come out 5 % slow in one profile and 6 %
fast in the next) and leaves the model's error about speculation. The script also prints the
check's resolution: how far a model that knew the prompt population exactly would still be off,
given how many prompts the profile and the check hold (bootstrap of the measured per-prompt TPOTs).

With the bundled 40-prompt workloads (16 profiled, 20 held out) that resolution is about 4-7 % at
p50 and 9-12 % at p90, so a 5 % goal cannot be resolved there; ``build_workload.py`` makes a larger
set of the same population (``benchmarks/workloads/functions-240.jsonl``).

Usage (bundled set: about 5 minutes alone on one CPU thread; the 240-prompt set with 64 profiled
and 100 held-out prompts: about 14 minutes; a shared machine makes it slower and noisier):

    OMP_NUM_THREADS=1 python benchmarks/latency_fidelity.py --db sqlite:///latency.db
    OMP_NUM_THREADS=1 python benchmarks/latency_fidelity.py --db sqlite:///latency240.db \
        --workload benchmarks/workloads/functions-240.jsonl --profile-max-prompts 64 --max-prompts 100 --repeats 2

Writes ``benchmarks/results/latency_fidelity_cpu_<workload>.txt`` and ``.json`` (with the load
average before and after).
"""
from __future__ import annotations

import math
import os
import random
import statistics
import time
from typing import Annotated

import typer

from _bench import write_results  # benchmarks/ is this script's folder
from fidelity import _profile  # the same profile on the tune split (benchmarks/ is this script's folder)
from specdec_tune.cli import _options as opts
from specdec_tune.db import get_run, open_database
from specdec_tune.core.latency import quantile
from specdec_tune.tuner.model import SpecConfig
from specdec_tune.tuner.search import Validated, measure_predicted

GOAL = 0.05

Db = Annotated[str, typer.Option("--db", metavar="URL", help=(
    "Results database URL (here sqlite:///latency.db by default, not the CLI's specdec.db; $SPECDEC_DB is not read)."))]
Run = Annotated[int | None, typer.Option("--run", help="Reuse a stored profile run (profiled on --split tune).")]
Grid = Annotated[str, typer.Option("--grid", help=(
    "Configurations: draft:N[:θ] items, comma-separated (draft 'plain' is plain decoding)."))]
MaxPrompts = Annotated[int | None, typer.Option("--max-prompts", help="Held-out prompts measured (default: all).")]
Out = Annotated[str | None, typer.Option("--out", help="Result file stem (default in benchmarks/results).")]
ProfileMaxPrompts = Annotated[int, typer.Option("--profile-max-prompts", help="Tuning prompts the profile runs.")]

DEFAULT_GRID = ("plain:0,mini-draft-1l:2,mini-draft-1l:4,mini-draft-1l:6,mini-draft-1l:4:0.3,mini-draft-2l:3,"
                "mini-draft-2l:6,ngram:3,ngram:6")


def parse_grid(text: str) -> list[tuple[str | None, SpecConfig]]:
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) not in (2, 3):
            raise typer.BadParameter(f"--grid item {item!r} must be draft:N or draft:N:θ")
        draft, n = parts[0], int(parts[1])
        theta = float(parts[2]) if len(parts) == 3 else 0.0
        out.append((None if draft == "plain" else draft, SpecConfig(0 if draft == "plain" else n, theta)))
    return out


def sampling_floor(per_prompt: list[float], q: float, profiled: int, draws: int = 4000, seed: int = 0) -> float:
    """Median |error| of the q quantile that a model knowing the population exactly would still show here.

    The prediction sees ``profiled`` prompts, the check ``len(per_prompt)`` others: which prompts fall
    in which half moves the two quantiles apart even with no model error. Estimated by drawing both
    samples (with replacement) from the measured per-prompt TPOTs and comparing their q quantiles:
    the resolution of this validation, not a property of the model. NaN with fewer than 2 prompts.
    """
    if len(per_prompt) < 2 or profiled < 1:
        return math.nan
    rng = random.Random(seed)
    errs = []
    for _ in range(draws):
        a = quantile(rng.choices(per_prompt, k=profiled), q)
        b = quantile(rng.choices(per_prompt, k=len(per_prompt)), q)
        errs.append(abs(a - b) / b)
    return statistics.median(errs)


def row(v: Validated, profiled: int) -> dict:
    s = v.measurement.latency_summary or {}
    pred = v.latency
    c = v.config
    out = {"config": "plain" if c.num_speculative_tokens == 0 else f"{v.measurement.draft} N={c.num_speculative_tokens}"
           + (f" θ={c.threshold:g}" if c.threshold else ""), "N": c.num_speculative_tokens,
           "in_sample": v.in_sample, "measured_tokens_per_s": v.measurement.tokens_per_s,
           "predicted_tokens_per_s": v.prediction.tokens_per_s, "source": pred.source if pred else None,
           "mean_burst": s.get("mean_burst")}
    speed = v.prediction.machine_speed  # the rescale applied to ``pred``; undone for the primary prediction
    out["machine_speed"] = speed
    out["machine_speed_source"] = v.speed_source
    for q, name in ((0.5, "p50"), (0.9, "p90")):
        measured = s["tpot_s"][name]["value"]
        predicted = pred.tpot(q) * speed if pred else math.nan
        out[f"tpot_{name}_measured_ms"] = measured * 1000
        out[f"tpot_{name}_ci_ms"] = [x * 1000 for x in s["tpot_s"][name]["ci"]]
        out[f"tpot_{name}_predicted_ms"] = predicted * 1000
        out[f"tpot_{name}_error"] = (predicted - measured) / measured
        out[f"tpot_{name}_error_rescaled"] = (predicted / speed - measured) / measured
    per_prompt = v.measurement.latency.per_prompt("tpot_s") if v.measurement.latency else []
    out["tpot_mean_measured_ms"] = statistics.fmean(per_prompt) * 1000 if per_prompt else math.nan
    out["tpot_mean_predicted_ms"] = statistics.fmean(pred.tpot_s) * speed * 1000 if pred else math.nan
    for q, name in ((0.5, "p50"), (0.9, "p90")):
        out[f"tpot_{name}_floor"] = sampling_floor(per_prompt, q, profiled)
    out["ttft_p50_measured_ms"] = s["ttft_s"]["p50"]["value"] * 1000
    out["ttft_p50_predicted_ms"] = pred.ttft(0.5) * speed * 1000 if pred else None
    out["token_gap_p99_ms"] = s["token_gap_s"]["p99"]["value"] * 1000
    out["chunk_gap_p50_ms"] = (s["chunk_gap_s"]["p50"]["value"] or 0) * 1000
    return out


def table(rows: list[dict]) -> list[str]:
    head = (f"{'configuration':<26} {'TPOT p50 meas (95% CI)':>24} {'pred':>6} {'err':>6}  "
            f"{'TPOT p90 meas (95% CI)':>24} {'pred':>6} {'err':>6}  {'TTFT p50 m/p':>13} {'burst':>5}")
    lines = [head]
    for r in rows:
        def cell(name: str) -> str:
            lo, hi = r[f"tpot_{name}_ci_ms"]
            return (f"{r[f'tpot_{name}_measured_ms']:7.2f} ({lo:6.2f}-{hi:6.2f}) {r[f'tpot_{name}_predicted_ms']:6.2f} "
                    f"{r[f'tpot_{name}_error'] * 100:+5.1f}%")
        lines.append(f"{r['config']:<26} {cell('p50'):>38}  {cell('p90'):>38}  "
                     f"{r['ttft_p50_measured_ms']:6.1f}/{r['ttft_p50_predicted_ms']:<6.1f} {r['mean_burst'] or 1:5.2f}")
    return lines


def at_plain_speed(rows: list[dict]) -> float:
    """Add each row's errors with its prediction moved to the machine speed plain decoding measured in
    the same interleaved passes (its mean TPOT measured / predicted): what is left is the model's
    error about speculation, without the machine's drift between the profile and this measurement.
    Returns the factor (NaN without a plain row)."""
    plain = next((r for r in rows if r["N"] == 0), None)
    factor = plain["tpot_mean_measured_ms"] / plain["tpot_mean_predicted_ms"] if plain else math.nan
    for r in rows:
        for name in ("p50", "p90"):
            measured = r[f"tpot_{name}_measured_ms"]
            r[f"tpot_{name}_error_plain_speed"] = (r[f"tpot_{name}_predicted_ms"] * factor - measured) / measured
    return factor


def summarize(rows: list[dict]) -> dict:
    spec = [r for r in rows if r["N"] > 0]
    out = {"configurations": len(spec)}
    for name in ("p50", "p90"):
        errs = [abs(r[f"tpot_{name}_error"]) for r in spec]
        out[f"median_abs_error_{name}"] = statistics.median(errs) if errs else math.nan
        out[f"worst_abs_error_{name}"] = max(errs) if errs else math.nan
        out[f"goal_met_{name}"] = bool(errs) and statistics.median(errs) <= GOAL
        floors = [r[f"tpot_{name}_floor"] for r in spec if not math.isnan(r[f"tpot_{name}_floor"])]
        out[f"sampling_floor_{name}"] = statistics.median(floors) if floors else math.nan
        plain_speed = [abs(r[f"tpot_{name}_error_plain_speed"]) for r in spec]
        out[f"median_abs_error_{name}_plain_speed"] = statistics.median(plain_speed) if plain_speed else math.nan
        rescaled = [abs(r[f"tpot_{name}_error_rescaled"]) for r in spec]
        out[f"median_abs_error_{name}_rescaled"] = statistics.median(rescaled) if rescaled else math.nan
    return out


def main(
    db: Db = "sqlite:///latency.db",
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    drafts: opts.BundledDraftsOption = "mini-draft-1l,mini-draft-2l,ngram",
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    run: Run = None,
    profile_max_prompts: ProfileMaxPrompts = opts.PROFILE_MAX_PROMPTS,
    grid: Grid = DEFAULT_GRID,
    max_prompts: MaxPrompts = None,
    repeats: opts.RepeatsOption = opts.DEFAULT_REPEATS,
    out: Out = None,
) -> None:
    args = dict(locals())
    database = open_database(db)
    load_before = os.getloadavg()
    started = time.perf_counter()
    run_id = run if run is not None else _profile(database, target, drafts.split(","), workload, profile_max_prompts)
    settings = get_run(database, run_id).settings
    profiled = len(settings.prompt_ids)
    validated = measure_predicted(database, run_id, parse_grid(grid), split="holdout", max_prompts=max_prompts,
                                  repeats=repeats)
    rows = [row(v, profiled) for v in validated]
    plain_factor = at_plain_speed(rows)
    summary = summarize(rows)
    load_after = os.getloadavg()
    lines = [f"latency fidelity: target {target}, drafts {drafts}, workload {workload}, run {run_id} (profiled on "
             f"{profiled} tuning prompts), held-out prompts {rows and validated[0].measurement.prompts}, "
             f"repeats {repeats}, CPU, {settings.threads} thread(s); load average before "
             f"{load_before[0]:.2f}, after {load_after[0]:.2f} (a shared machine)",
             "TPOT: decode window per request, (t_last - t_first) / (n - 1); a prompt's TPOT is the median of its "
             "repeats; p50/p90 over prompts; measured 95% CI: bootstrap over prompts; predicted at the profile's "
             "machine speed", ""]
    lines += table(rows) + [""]
    lines.append(f"speculative configurations: {summary['configurations']}; TPOT p50 median |error| "
                 f"{summary['median_abs_error_p50'] * 100:.1f}% (worst {summary['worst_abs_error_p50'] * 100:.1f}%), "
                 f"p90 median |error| {summary['median_abs_error_p90'] * 100:.1f}% (worst "
                 f"{summary['worst_abs_error_p90'] * 100:.1f}%); goal <= {GOAL * 100:.0f}%: p50 "
                 f"{summary['goal_met_p50']}, p90 {summary['goal_met_p90']}; predictions at the profile's machine "
                 f"speed (rescaled as measure stores them, to the speed measured by "
                 f"{' / '.join(dict.fromkeys(r.get('machine_speed_source', 'the machine probe') for r in rows))}: p50 "
                 f"{summary['median_abs_error_p50_rescaled'] * 100:.1f}%, p90 "
                 f"{summary['median_abs_error_p90_rescaled'] * 100:.1f}%; factors "
                 + ", ".join(f"{r['machine_speed']:.2f}" for r in rows) + ")")
    lines.append(f"at the machine speed plain decoding measured in the same passes (factor {plain_factor:.3f}): TPOT "
                 f"p50 median |error| {summary['median_abs_error_p50_plain_speed'] * 100:.1f}%, p90 "
                 f"{summary['median_abs_error_p90_plain_speed'] * 100:.1f}% (the model's error about speculation alone)")
    lines.append(f"resolution of this check: a model that knew the prompt population exactly would still be off by a "
                 f"median {summary['sampling_floor_p50'] * 100:.1f}% at p50 and {summary['sampling_floor_p90'] * 100:.1f}% "
                 f"at p90 (which prompts fall in the {profiled} profiled and the held-out set; bootstrap of the measured "
                 f"per-prompt TPOTs)")
    lines.append(f"total {time.perf_counter() - started:.0f} s")
    text = "\n".join(lines)
    print(text)
    write_results(out, f"latency_fidelity_cpu_{workload}", text,
                  {"run_id": run_id, "args": args, "rows": rows, "summary": summary,
                   "plain_speed_factor": plain_factor, "load_average": [load_before, load_after],
                   "date": time.strftime("%Y-%m-%d")})


if __name__ == "__main__":
    opts.run_script(main)
