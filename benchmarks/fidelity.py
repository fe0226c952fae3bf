"""Model fidelity, honestly: profile on the tuning half of a workload, then measure a grid of
configurations for real on the profiled prompts (in-sample) and on the held-out half (out-of-sample)
and compare each with the model's prediction from that one profile.

Usage (the full run; about 35-45 minutes alone on one CPU thread, see README "Model fidelity"):

    OMP_NUM_THREADS=1 python benchmarks/fidelity.py --db sqlite:///fidelity.db

A short check of the script: ``--max-prompts 4 --repeats 1 --profile-max-prompts 4``.

Reported separately for in-sample and out-of-sample, over the speculative configurations the profile
did not run itself (it runs θ = 0 at N = N_max and at its overhead N values, marked "profile ran it"):
median and worst |error|, the share of predictions inside the measured 95% CI, Spearman's rank
correlation between predicted and measured tokens/s, and the regret (1 - measured tokens/s of the
predicted best ÷ the measured best). Columns τ (tokens per cycle) separate acceptance error from
timing error: a configuration whose τ is right but whose tokens/s is off has a timing error; the
speedup over plain decoding measured in the same passes cancels a slowdown of the whole machine, so
an error there that tokens/s does not share is drift, not the model. (Since 2026-11-26 the stored
tokens/s predictions of speculative configurations are rescaled to the speed plain decoding measured
in the same passes, ``tuner.search._validate._speeds``, so their errors are the speedups'; runs before
that were rescaled to the machine probe.)
Writes ``benchmarks/results/fidelity_cpu_<workload>_heldout.txt`` and ``.json``.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Annotated

import typer
from scipy.stats import spearmanr

from _bench import write_results  # benchmarks/ is this script's folder
from specdec_tune.cli import _options as opts
from specdec_tune.db import RunSettings, get_run, open_database
from specdec_tune.profiler import ProfileSettings, run_profile
from specdec_tune.tuner.model import SpecConfig
from specdec_tune.tuner.search import Validated, measure_predicted

GOAL = {"median_abs_error": 0.05, "inside_ci": 0.80, "spearman": 0.9, "regret": 0.03}
KIND_GOAL = {**GOAL, "regret": 0.02}  # each threshold kind's own grid (docs/results.md, Threshold kinds)
SPLITS = (("in-sample (the profiled tune prompts)", None), ("out-of-sample (held-out prompts)", "holdout"))

Db = Annotated[str, typer.Option("--db", metavar="URL", help=(
    "Results database URL, as the CLI's --db; here sqlite:///fidelity.db by default, not the CLI's specdec.db, "
    "and $SPECDEC_DB is not read."))]
Run = Annotated[int | None, typer.Option("--run", help="Reuse a stored profile run (profiled on --split tune).")]
ProfileMaxPrompts = Annotated[int, typer.Option("--profile-max-prompts", help=(
    "Tuning prompts the profile runs (profile's --max-prompts)."))]
Ns = Annotated[str, typer.Option("--ns", help="N values of the grid, comma-separated.")]
Thetas = Annotated[str, typer.Option("--thetas", help="θ values of the grid, comma-separated.")]
Schedules = Annotated[str, typer.Option("--schedules", help="Schedules of the grid, comma-separated.")]
MaxPrompts = Annotated[int | None, typer.Option("--max-prompts", help=(
    "Measure only the first prompts of each split (measure's --max-prompts; default: all)."))]
Out = Annotated[str | None, typer.Option("--out", help=(
    "Result file stem (default: fidelity_cpu_WORKLOAD_heldout in benchmarks/results)."))]
Neighbour = Annotated[bool, typer.Option("--neighbour", help=(
    "Run one CPU-bound process (a busy Python loop) beside the whole benchmark, profile included: the "
    "shared machine users tune on."))]
Splits = Annotated[str, typer.Option("--splits", help="Which prompt splits to measure: in, out or in,out.")]
Kinds = Annotated[str, typer.Option("--kinds", help=(
    "Threshold kinds of the grid, comma-separated: per-token, cumulative (θ > 0 of --thetas), adaptive (θ "
    "<= 0.9 of --thetas as the start, each of --steps, constant schedule)."))]
Steps = Annotated[str, typer.Option("--steps", help="The adaptive kind's steps, comma-separated.")]


def profile_ran(settings: RunSettings, draft: str, config: SpecConfig) -> bool:
    """Whether the profile itself decoded this configuration (so its timings came from that run)."""
    if config.spec.num_speculative_tokens == 0:
        return True  # the hooked plain baseline
    if config.spec.threshold != 0 or config.spec.schedule != "constant" or config.mode != "greedy" \
            or config.spec.threshold_kind != "per-token":
        return False
    n_max = settings.n_max
    return config.spec.num_speculative_tokens in {n_max, *(min(n, n_max) for n in settings.overhead_ns)}


def summarize(rows: list[dict]) -> dict:
    """Error, CI coverage, rank correlation and regret over rows (speculative configurations)."""
    if not rows:
        return {}
    errors = [abs(r["error"]) for r in rows]
    inside = [r["inside_ci"] for r in rows if r["inside_ci"] is not None]
    rho = spearmanr([r["predicted"] for r in rows], [r["measured"] for r in rows]).statistic if len(rows) > 2 else math.nan
    best = max(r["measured"] for r in rows)
    chosen = max(rows, key=lambda r: r["predicted"])
    return {"configurations": len(rows), "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
            "inside_ci": sum(inside) / len(inside) if inside else math.nan, "spearman": float(rho),
            "regret": 1 - chosen["measured"] / best, "predicted_best": chosen["config"],
            "median_abs_tau_error": statistics.median(abs(r["tau_error"]) for r in rows if r["tau_error"] is not None)
            if any(r["tau_error"] is not None for r in rows) else math.nan,
            "median_abs_speedup_error": statistics.median(abs(r["speedup_error"]) for r in rows)}


def row(v: Validated, settings: RunSettings) -> dict:
    m, p = v.measurement, v.prediction
    tau_err = None
    if m.mean_tokens_per_cycle and p.expected_tokens_per_cycle:
        tau_err = (p.expected_tokens_per_cycle - m.mean_tokens_per_cycle) / m.mean_tokens_per_cycle
    c = v.config
    return {"draft": m.draft, "config": f"{m.draft} N={c.num_speculative_tokens} θ={c.threshold:g} {c.schedule}"
            + _kind_label(c), "N": c.num_speculative_tokens, "threshold": c.threshold, "schedule": c.schedule,
            "threshold_kind": c.threshold_kind, "threshold_step": c.threshold_step,
            "profile_ran_it": profile_ran(settings, m.draft, c), "in_sample": v.in_sample, "measured": m.tokens_per_s,
            "ci95": list(m.ci95) if m.ci95 else None, "predicted": p.tokens_per_s, "error": v.relative_error,
            "inside_ci": v.inside_ci, "tau_measured": m.mean_tokens_per_cycle,
            "tau_predicted": p.expected_tokens_per_cycle, "tau_error": tau_err, "source": p.source,
            "prompts": m.prompts, "repeats": m.repeats, "measured_id": m.measured_id,
            "machine_speed": p.machine_speed, "threads": (m.threads or {}).get("threads")}


def _kind_label(c: SpecConfig) -> str:
    if c.threshold_kind == "adaptive":
        return f" adaptive/{c.threshold_step:g}"
    return " cumulative" if c.threshold_kind == "cumulative" else ""


def grid(names: list[str], args: dict) -> list[tuple[str | None, SpecConfig]]:
    """Plain decoding, then every (draft, schedule, N, θ, kind[, step]) of the options."""
    out: list[tuple[str | None, SpecConfig]] = [(None, SpecConfig(0))]
    kinds = [k.strip() for k in args["kinds"].split(",") if k.strip()]
    steps = [float(x) for x in args["steps"].split(",") if x.strip()]
    for draft in names:
        for schedule in args["schedules"].split(","):
            for n in (int(x) for x in args["ns"].split(",")):
                for theta in (float(x) for x in args["thetas"].split(",")):
                    for kind in kinds:
                        if kind == "per-token":
                            out.append((draft, SpecConfig(n, theta, schedule)))  # type: ignore[arg-type]
                        elif kind == "cumulative" and theta > 0:
                            out.append((draft, SpecConfig(n, theta, schedule, threshold_kind="cumulative")))  # type: ignore[arg-type]
                        elif kind == "adaptive" and theta <= 0.9 and schedule == "constant":
                            out += [(draft, SpecConfig(n, theta, threshold_kind="adaptive", threshold_step=st))
                                    for st in steps]
    return out


def table(title: str, rows: list[dict]) -> list[str]:
    lines = [title, f"{'configuration':<34} {'measured':>9} {'95% CI':>15} {'predicted':>9} {'error':>7} {'in CI':>5} "
             f"{'τ meas':>6} {'τ pred':>6} {'speedup m/p':>11} {'error':>7}  note"]
    for r in rows:
        ci = f"{r['ci95'][0]:.1f}-{r['ci95'][1]:.1f}" if r["ci95"] else "-"
        tm = f"{r['tau_measured']:.3f}" if r["tau_measured"] else "-"
        lines.append(f"{r['config']:<34} {r['measured']:9.1f} {ci:>15} {r['predicted']:9.1f} {r['error'] * 100:+6.1f}% "
                     f"{'yes' if r['inside_ci'] else 'no':>5} {tm:>6} {r['tau_predicted']:6.3f} "
                     f"{r['speedup_measured']:5.2f}/{r['speedup_predicted']:<5.2f} {r['speedup_error'] * 100:+6.1f}%  "
                     f"{'profile ran it' if r['profile_ran_it'] else ''}")
    return lines


def summary_lines(name: str, s: dict, which: str = "not run by the profile", goal: dict = GOAL) -> list[str]:
    if not s:
        return [f"{name}: no configurations"]
    met = {k: (s[k] <= v if k in ("median_abs_error", "regret") else s[k] >= v) for k, v in goal.items()}
    return [f"{name}: {s['configurations']} configurations {which}: median |error| "
            f"{s['median_abs_error'] * 100:.1f}% (goal ≤ 5%: {met['median_abs_error']}), worst "
            f"{s['worst_abs_error'] * 100:.1f}%, inside the measured 95% CI {s['inside_ci'] * 100:.0f}% (goal ≥ 80%: "
            f"{met['inside_ci']}), Spearman {s['spearman']:.3f} (goal ≥ 0.9: {met['spearman']}), regret "
            f"{s['regret'] * 100:.1f}% (goal ≤ {goal['regret'] * 100:.0f}%: {met['regret']}; predicted best {s['predicted_best']}), "
            f"median |τ error| {s['median_abs_tau_error'] * 100:.1f}%, median |speedup error| "
            f"{s['median_abs_speedup_error'] * 100:.1f}%"]


def kind_lines(results: dict[str, list[dict]]) -> list[str]:
    """Per threshold kind (when the grid has several): error and regret over that kind's configurations."""
    out = []
    for name, rows in results.items():
        kinds = sorted({r["threshold_kind"] for r in rows if r["N"] > 0})
        if len(kinds) < 2:
            continue
        for kind in kinds:
            s = summarize([r for r in rows if r["N"] > 0 and r["threshold_kind"] == kind and not r["profile_ran_it"]])
            out += summary_lines(f"{name}, {kind}", s, goal=KIND_GOAL)
    return out


def main(
    db: Db = "sqlite:///fidelity.db",
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    drafts: opts.BundledDraftsOption = opts.BUNDLED_DRAFTS,
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    run: Run = None,
    profile_max_prompts: ProfileMaxPrompts = opts.PROFILE_MAX_PROMPTS,
    ns: Ns = "1,2,3,5,8,12",
    thetas: Thetas = "0,0.4",
    schedules: Schedules = "constant",
    max_prompts: MaxPrompts = None,
    repeats: opts.RepeatsOption = opts.DEFAULT_REPEATS,
    out: Out = None,
    neighbour: Neighbour = False,
    splits: Splits = "in,out",
    kinds: Kinds = "per-token",
    steps: Steps = "0.05",
) -> None:
    args = dict(locals())  # every option, as the results JSON records them
    with neighbour_process(neighbour):
        _main(args)


@contextlib.contextmanager
def neighbour_process(on: bool) -> Iterator[None]:
    """One CPU-bound process beside the block (a busy loop), stopped after it."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(2.0)  # let it take its CPU before anything is measured
        yield
    finally:
        proc.kill()
        proc.wait()


def _where(settings) -> str:
    """The device the run measured on: a GPU's dtype and graph state, a CPU's threads (the H200 run was
    labelled "CPU, 16 thread(s)")."""
    if settings.device == "cuda":
        return f"GPU ({settings.dtype}, CUDA graphs {settings.cuda_graphs_used})"
    return f"CPU, {settings.threads} thread(s) ({(settings.thread_choice or {}).get('source', 'as set')})"


def _main(args: dict) -> None:
    db, target, drafts, workload, run = args["db"], args["target"], args["drafts"], args["workload"], args["run"]
    max_prompts, repeats, out = args["max_prompts"], args["repeats"], args["out"]
    wanted = {"in": SPLITS[0], "out": SPLITS[1]}
    chosen = [wanted[k.strip()] for k in args["splits"].split(",") if k.strip() in wanted]
    if not chosen:
        raise typer.BadParameter(f"--splits must be in, out or in,out, got {args['splits']!r}")
    names = drafts.split(",")
    database = open_database(db)
    started = time.perf_counter()
    run_id = run if run is not None else _profile(database, target, names, workload, args["profile_max_prompts"])
    settings = get_run(database, run_id).settings
    configs = grid(names, args)
    results = {name: _measure(database, run_id, configs, settings, name, split, max_prompts, repeats)
               for name, split in chosen}
    lines = [f"model fidelity: target {target}, drafts {drafts}, workload {workload}, run {run_id} "
             f"(profiled on split {settings.split}: {len(settings.prompt_ids)} prompts), {_where(settings)}, "
             f"repeats {repeats}, max prompts {max_prompts or 'all'}"
             + (", one CPU-bound neighbour throughout" if args["neighbour"] else ", no neighbour started"),
             "throughput: end to end, new tokens / wall seconds of whole decode calls, prefill included; "
             "measured 95% CI: bootstrap over prompts, then repeats", ""]
    summaries = {}
    for name, rows in results.items():
        lines += table(name, rows) + [""]
        summaries[name] = summarize([r for r in rows if r["N"] > 0 and not r["profile_ran_it"]])
        summaries[name + ", every speculative configuration"] = summarize([r for r in rows if r["N"] > 0])
    for name, s in summaries.items():
        lines += summary_lines(name, s, "(all)" if name.endswith("configuration") else "not run by the profile")
    lines += kind_lines(results)
    lines.append(f"total {time.perf_counter() - started:.0f} s")
    text = "\n".join(lines)
    print(text)
    write_results(out, f"fidelity_cpu_{workload}_heldout", text,
                  {"run_id": run_id, "args": args, "rows": results, "summary": summaries, "goal": GOAL})


def _profile(db, target: str, drafts: list[str], workload: str, max_prompts: int) -> int:
    """A fresh profile on the tune split (the CLI's profile settings otherwise); its run id."""
    t0 = time.perf_counter()
    settings = ProfileSettings(device="cpu", split="tune", max_prompts=max_prompts)
    run_id = run_profile(db, target, drafts, workload, settings).run_id
    print(f"profile run {run_id} on the tune split: {time.perf_counter() - t0:.0f} s", flush=True)
    return run_id


def _measure(db, run_id: int, grid: list, settings: RunSettings, name: str, split: str | None, max_prompts: int | None,
             repeats: int) -> list[dict]:
    """The grid measured on one split, interleaved, each configuration next to its prediction."""
    t0 = time.perf_counter()
    validated = measure_predicted(db, run_id, grid, split=split, max_prompts=max_prompts, repeats=repeats)
    print(f"{name}: {len(grid)} configurations x {repeats} interleaved repeats: "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    rows = [row(v, settings) for v in validated]
    plain = rows[0]["measured"]  # plain decoding, measured in the same interleaved passes
    for r, v in zip(rows, validated):
        # Speedup over plain decoding measured in the same passes: a slowdown of the whole machine
        # cancels, so this error is the model's (acceptance, relative costs), not the machine's drift.
        r["speedup_measured"] = r["measured"] / plain
        r["speedup_predicted"] = v.prediction.speedup
        r["speedup_error"] = r["speedup_predicted"] / r["speedup_measured"] - 1
    return rows


if __name__ == "__main__":
    opts.run_script(main)
