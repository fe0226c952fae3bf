"""Threshold kinds on this machine: does a cumulative or an adaptive θ beat the best per-token θ and the
best constant N, measured on held-out prompts?

Usage (about 10-15 minutes alone on one CPU thread with the defaults):

    OMP_NUM_THREADS=1 python benchmarks/threshold_kinds.py --db sqlite:////tmp/kinds.db

1. Profile the target and draft on the workload's tuning half (or reuse ``--run``).
2. For each family, the configuration the model predicts fastest *on the held-out prompts*
   (``tuner.model.predict_prompts``; no held-out timing or trace is used): constant N (θ = 0),
   per-token θ, cumulative θ, adaptive θ (start and step), every N in 1..``--n-max``. The choice is the
   model's, as ``tune`` would make it, so a family's number includes the model's regret.
3. Measure the finalists and plain decoding interleaved on the held-out prompts (``--repeats`` passes,
   each prompt's median), greedy, one thread. Report each finalist's tokens/s with its 95% bootstrap CI
   and the paired ratio of cumulative and adaptive over the best per-token θ and over the best constant
   N (paired bootstrap over prompts and passes: what the passes share cancels), with the load average
   before and after.

Writes ``benchmarks/results/threshold_kinds_cpu_<workload>.txt`` and ``.json``.
"""
from __future__ import annotations

import os
import platform
import time
from typing import Annotated

import typer

from _bench import profile_run, write_results
from specdec_tune.cli import _options as opts
from specdec_tune.db import open_database
from specdec_tune.core.errors import InputError
from specdec_tune.core.stats import bounds, speedup_ci
from specdec_tune.tuner.model import SpecConfig, load_run_profile, predict_prompts, split_specs
from specdec_tune.tuner.search import measure_predicted

THETAS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05 .. 0.95
STEPS = (0.02, 0.05, 0.1)
FAMILIES = ("constant N", "per-token θ", "cumulative θ", "adaptive θ")

Db = Annotated[str, typer.Option("--db", metavar="URL", help="Results database URL (required here).")]
Run = Annotated[int | None, typer.Option("--run", help="Reuse a stored profile run (profiled on --split tune).")]
NMax = Annotated[int, typer.Option("--n-max", help="Largest N of every family.")]
MaxPrompts = Annotated[int | None, typer.Option("--max-prompts", help="Held-out prompts measured (default: all).")]
Out = Annotated[str | None, typer.Option("--out", help="Result file stem (default in benchmarks/results).")]


def family_configs(family: str, n_max: int) -> list[SpecConfig]:
    """Every configuration of one family (greedy, constant schedule, batch size 1)."""
    ns = range(1, n_max + 1)
    if family == "constant N":
        return [SpecConfig(n) for n in ns]
    if family == "per-token θ":
        return [SpecConfig(n, t) for n in ns for t in THETAS]
    if family == "cumulative θ":
        return [SpecConfig(n, t, threshold_kind="cumulative") for n in ns for t in THETAS]
    return [SpecConfig(n, t, threshold_kind="adaptive", threshold_step=s) for n in ns for t in THETAS if t <= 0.9
            for s in STEPS]


def predicted_best(rp, specs, family: str, n_max: int) -> tuple[SpecConfig, float]:
    """The family's configuration with the highest predicted held-out tokens/s."""
    scored = []
    for c in family_configs(family, n_max):
        try:
            scored.append((predict_prompts(rp, c, specs).tokens_per_s, c))
        except InputError:
            continue
    tps, best = max(scored, key=lambda x: x[0])
    return best, tps


def label(c: SpecConfig) -> str:
    if c.num_speculative_tokens == 0:
        return "plain decoding"
    theta = {"per-token": f"θ={c.threshold:g}", "cumulative": f"cumulative θ={c.threshold:g}",
             "adaptive": f"adaptive θ from {c.threshold:g} step {c.threshold_step:g}"}[c.threshold_kind]
    return f"N={c.num_speculative_tokens} " + (theta if c.threshold > 0 or c.threshold_kind == "adaptive" else "θ=0")


def main(
    db: Db,
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    draft: opts.BundledDraftOption = opts.BUNDLED_DRAFT,
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    run: Run = None,
    n_max: NMax = 12,
    max_prompts: MaxPrompts = None,
    repeats: opts.RepeatsOption = 4,
    out: Out = None,
) -> None:
    args = dict(locals())
    load_before = os.getloadavg()
    database = open_database(db)
    started = time.perf_counter()
    run = profile_run(database, run, target, draft, workload, n_max=max(16, n_max))
    rp = load_run_profile(database, run, draft)
    specs = split_specs(rp, "holdout", max_prompts)
    chosen = {f: predicted_best(rp, specs, f, n_max) for f in FAMILIES}
    items = [(None, SpecConfig(0))] + [(draft, c) for c, _ in chosen.values()]
    got = measure_predicted(database, run, items, split="holdout", max_prompts=max_prompts, repeats=repeats)
    load_after = os.getloadavg()
    text, obj = report(args, run, chosen, got, load_before, load_after, time.perf_counter() - started)
    print(text)
    write_results(out, f"threshold_kinds_cpu_{workload}", text, obj)


def ratio_row(ratio: float, ci) -> dict:
    """A finalist over a baseline: the ratio of their tokens/s (the statistic its CI bootstraps, so the CI
    contains it), the CI, and a verdict from the CI."""
    verdict = "faster" if ci[0] > 1 else "slower" if ci[1] < 1 else "no difference resolved"
    return {"ratio": ratio, "ci95": list(ci), "verdict": verdict}


def ratio_line(new: str, base: str, r: dict) -> str:
    return f"{new} over {base}: {r['ratio']:.3f}x (95% CI {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}): {r['verdict']}"


def report(args: dict, run: int, chosen: dict, got: list, load_before, load_after, seconds: float) -> tuple[str, dict]:
    """The text and JSON of one comparison (finalists measured, ratios with paired CIs)."""
    plain, finals = got[0], dict(zip(FAMILIES, got[1:]))
    m0 = plain.measurement
    lines = [f"threshold kinds: target {args['target']}, draft {args['draft']}, workload {args['workload']}, run {run}; "
             f"{m0.prompts} held-out prompts x {m0.repeats} interleaved passes, greedy, "
             f"{(m0.threads or {}).get('threads')} thread(s); {platform.node()} {time.strftime('%Y-%m-%d')}; "
             f"load average before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, after "
             f"{load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}",
             "each family's configuration is the model's predicted best on the held-out prompts (the tuner's choice)",
             "", f"{'family':<14} {'configuration':<38} {'predicted':>9} {'measured':>9} {'95% CI':>13} "
             f"{'x plain':>7} {'95% CI':>11}"]
    rows = {}
    for fam, v in [("plain", plain), *finals.items()]:
        m = v.measurement
        sp, ci = (1.0, (1.0, 1.0)) if fam == "plain" else (m.tokens_per_s / m0.tokens_per_s, bounds(speedup_ci(m, m0)))
        rows[fam] = {"config": label(v.config), "predicted": v.prediction.tokens_per_s, "measured": m.tokens_per_s,
                     "ci95": list(m.ci95 or ()), "speedup": sp, "speedup_ci95": list(ci),
                     "tau_measured": m.mean_tokens_per_cycle, "tau_predicted": v.prediction.expected_tokens_per_cycle}
        r = rows[fam]
        lines.append(f"{fam:<14} {r['config']:<38} {r['predicted']:9.1f} {r['measured']:9.1f} "
                     f"{r['ci95'][0]:6.1f}-{r['ci95'][1]:<6.1f} {sp:7.3f} {ci[0]:5.3f}-{ci[1]:.3f}")
    lines.append("")
    ratios = {}
    for new in ("cumulative θ", "adaptive θ"):
        for base in ("per-token θ", "constant N"):
            a, b = finals[new].measurement, finals[base].measurement
            ratios[f"{new} / {base}"] = ratio_row(a.tokens_per_s / b.tokens_per_s, bounds(speedup_ci(a, b)))
            lines.append(ratio_line(new, base, ratios[f"{new} / {base}"]))
    lines.append(f"total {seconds:.0f} s; measured tokens/s are end to end (prefill included), CIs bootstrap over "
                 "prompts then passes; ratios and their CIs paired by prompt and pass")
    obj = {"args": args, "run_id": run, "rows": rows, "ratios": ratios, "host": platform.node(),
           "date": time.strftime("%Y-%m-%d"), "load_before": load_before, "load_after": load_after}
    return "\n".join(lines), obj


if __name__ == "__main__":
    opts.run_script(main)
