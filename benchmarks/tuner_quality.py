"""Tuner quality: the tuned configuration vs the best of an exhaustive measured grid.

1. ``tune`` (profile on the tuning half, Optuna search, measured confirmation, held-out measurement)
   over a discrete space S, timed end to end: that wall time is what the tuner spends measuring
   (profile + confirmation + held-out; the search itself is a few seconds of predictions).
2. Every point of S (plain decoding included) measured, interleaved, on the *same* held-out prompts
   with the same repeats: the exhaustive grid, timed.
3. Quality = measured tokens/s of the tuned configuration ÷ the grid's best, both taken from the grid's
   own interleaved passes (same prompts, same minutes of the machine), with a paired 95% bootstrap CI
   over prompts; cost = tune wall time ÷ grid wall time. Goal: quality ≥ 97% (aim 98%), cost ≤ 15%.
4. The grid's best is the maximum of hundreds of noisy measurements, so its own number is biased up
   (winner's curse) and the tuned configuration's single grid number can be a low draw. ``--reconfirm``
   (after a run; reads the JSON) measures the tuned configuration and the grid's top 5 again,
   interleaved, on the same held-out prompts with more passes: an independent measurement of the
   configurations the grid selected, reported as ``reconfirmed_quality`` beside the grid's own.

Default S (the full run, ~60-75 min on a quiet 2-core CPU with OMP_NUM_THREADS=1): drafts
mini-draft-1l, mini-draft-2l and n-gram, N 1..12, θ in {0, 0.2, 0.4, 0.6} for the model drafts,
schedules constant and heuristic: 217 configurations measured on 16 held-out prompts × 48 tokens,
3 passes. ``--quick`` checks the script in a few minutes (N 1..3, θ {0, 0.4}, 4 held-out prompts).

    OMP_NUM_THREADS=1 python benchmarks/tuner_quality.py --db sqlite:////tmp/tq.db
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from specdec_tune.cli import _options as opts
from specdec_tune.profiler import StageLog

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# The tune request's sizes: the full run, and --quick (a small space and few prompts).
FULL = {"n_max": 12, "thresholds": (0.0, 0.2, 0.4, 0.6), "max_prompts": 12, "max_new_tokens": 48, "profile_repeats": 10,
        "measure_prompts": 8, "heldout_prompts": 16, "repeats": 3, "measure_top": 6, "batch_sizes": (1, 4, 16, 64)}
QUICK = {"n_max": 3, "thresholds": (0.0, 0.4), "max_prompts": 4, "max_new_tokens": 16, "profile_repeats": 3,
         "measure_prompts": 2, "heldout_prompts": 4, "repeats": 2, "measure_top": 3, "batch_sizes": (1, 4)}

Quick = Annotated[bool, typer.Option("--quick", help="A small space and few prompts, to check the script.")]
Out = Annotated[str | None, typer.Option("--out", help=(
    "JSON result file (default: tuner_quality_cpu_WORKLOAD.json in benchmarks/results, _quick with --quick)."))]
Reconfirm = Annotated[bool, typer.Option("--reconfirm", help=(
    "Re-measure the tuned configuration and the grid's top 5 of an earlier run (its --db and --out) "
    "independently, with --passes passes."))]
Passes = Annotated[int, typer.Option("--passes", help="Interleaved passes of --reconfirm.")]


def main(
    db: opts.RequiredDbOption,
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    drafts: opts.BundledDraftsOption = opts.BUNDLED_DRAFTS + ",ngram",
    server: opts.ServerOption = opts.DEFAULT_SERVER,
    trials: opts.TrialsOption = opts.DEFAULT_TRIALS,
    quick: Quick = False,
    out: Out = None,
    reconfirm: Reconfirm = False,
    passes: Passes = 5,
) -> None:
    if reconfirm:
        _reconfirm(db, Path(out) if out else RESULTS / f"tuner_quality_cpu_{workload}.json", passes)
        return
    from specdec_tune.db import default_storage_url, open_database
    from specdec_tune.tuner.search import TuneRequest, measure_candidates, run_tune

    req = TuneRequest(target=target, drafts=tuple(drafts.split(",")), workload=workload, server=server, trials=trials,
                      **(QUICK if quick else FULL))
    database = open_database(db)
    t0 = time.perf_counter()
    report = run_tune(database, req, default_storage_url(database.url), StageLog())
    tune_s = time.perf_counter() - t0
    grid = list(report.space.candidates())
    print(f"tuned in {tune_s:.0f} s: {report.result.candidate.label()}; grid of {len(grid)} configurations next",
          file=sys.stderr, flush=True)
    t1 = time.perf_counter()
    timed = measure_candidates(database, report.run_id, grid, split="holdout", max_prompts=req.heldout_prompts,
                               temperature=0.0, repeats=req.repeats, seed=0, progress=StageLog())
    result = _result(report, req, dict(zip(grid, timed)), tune_s, time.perf_counter() - t1)
    path = Path(out) if out else RESULTS / f"tuner_quality_cpu_{workload}{'_quick' if quick else ''}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    ci = result["quality_ci"]
    print(f"tuned {result['tuned_label']}: {result['tuned_tokens_per_s_in_grid']:.1f} tokens/s held-out (in the grid's "
          f"passes); grid best {result['grid_best_label']}: {result['grid_best_tokens_per_s']:.1f}; quality "
          f"{result['quality']:.1%} (95% CI {ci[0]:.1%}..{ci[1]:.1%})" if ci else "")
    print(f"measuring time: tune {tune_s:.0f} s vs grid {result['grid_wall_s']:.0f} s = {result['cost']:.1%}; speedup "
          f"over plain decoding (held-out, measured): tuned {result['tuned_speedup_in_grid']:.2f}x, grid best "
          f"{result['grid_best_speedup']:.2f}x")
    print(f"written {path}")


def _result(report, req, by: dict, tune_s: float, grid_s: float) -> dict:
    """The tuned configuration against the grid's best, both from the grid's own interleaved passes."""
    from specdec_tune.core.stats import bounds, speedup_ci

    def ratio_ci(a, b):
        return list(bounds(speedup_ci(by[a].validated.measurement, by[b].validated.measurement)))

    grid = list(by)
    best_c = max(grid, key=lambda c: by[c].tokens_per_s)
    plain = next(c for c in grid if c.is_plain)
    tuned = report.result.candidate
    return {
        "hardware": report.result.hardware, "workload": req.workload, "target": req.target,
        "drafts": ",".join(req.drafts), "threads": os.environ.get("OMP_NUM_THREADS"), "space": report.space.to_dict(),
        "grid_size": len(grid), "tuned": tuned.to_dict(), "tuned_label": tuned.label(), "grid_best": best_c.to_dict(),
        "grid_best_label": best_c.label(),
        "quality": by[tuned].tokens_per_s / by[best_c].tokens_per_s,
        "quality_ci": ratio_ci(tuned, best_c) if tuned != best_c else [1.0, 1.0],
        "tuned_tokens_per_s_in_grid": by[tuned].tokens_per_s, "grid_best_tokens_per_s": by[best_c].tokens_per_s,
        "plain_tokens_per_s_in_grid": by[plain].tokens_per_s,
        "tuned_speedup_in_grid": by[tuned].tokens_per_s / by[plain].tokens_per_s,
        "tuned_speedup_in_grid_ci": ratio_ci(tuned, plain),
        "grid_best_speedup": by[best_c].tokens_per_s / by[plain].tokens_per_s,
        "grid_best_speedup_ci": ratio_ci(best_c, plain),
        "grid_best_predicted_tokens_per_s": by[best_c].predicted_tokens_per_s,
        "tune_heldout_speedup": report.result.speedup, "tune_heldout_speedup_ci": report.result.speedup_ci,
        "tune_wall_s": tune_s, "grid_wall_s": grid_s, "cost": tune_s / grid_s,
        "heldout_prompts": req.heldout_prompts, "max_new_tokens": req.max_new_tokens, "repeats": req.repeats,
        "trials": report.completed_trials, "sampler": report.sampler, "run_id": report.run_id,
        "ranking": sorted(([c.label(), by[c].tokens_per_s] for c in grid), key=lambda x: -x[1])[:15],
        "goal": "quality >= 0.97 (aim 0.98), cost <= 0.15 (aim 0.10)",
    }


def _reconfirm(db_url: str, path: Path, passes: int) -> None:
    """Step 4 of the module docstring: an independent measurement of what the grid selected."""
    from specdec_tune.db import open_database
    from specdec_tune.core.stats import bounds, speedup_ci
    from specdec_tune.tuner.model import Candidate
    from specdec_tune.tuner.search import measure_candidates

    out = json.loads(path.read_text())
    tuned = Candidate.from_dict(out["tuned"])
    top = [label for label, _ in out["ranking"][:5]]
    db = open_database(db_url)
    # the grid's candidates, rebuilt from the space (labels identify them)
    from specdec_tune.tuner.search import SearchSpace

    sp = out["space"]
    space = SearchSpace(tuple(sp["drafters"]), int(sp["n_max"]), tuple(sp["thresholds"]), sp["threshold_rule"],
                        tuple(sp["schedules"]), tuple(sp["ngram_schedules"]), sp["server"])
    grid = {c.label(): c for c in space.candidates()}
    cands = [tuned] + [grid[lbl] for lbl in top if lbl in grid and grid[lbl] != tuned] + [Candidate("none", 0)]
    t0 = time.perf_counter()
    got = measure_candidates(db, out["run_id"], cands, split="holdout", max_prompts=out["heldout_prompts"],
                           temperature=0.0, repeats=passes, seed=1, progress=StageLog())
    by = dict(zip(cands, got))
    best_grid = grid.get(top[0], tuned)
    q = by[tuned].tokens_per_s / by[best_grid].tokens_per_s
    ci = [1.0, 1.0] if best_grid == tuned else list(bounds(speedup_ci(by[tuned].validated.measurement,
                                                                by[best_grid].validated.measurement)))
    best_now = max(cands[:-1], key=lambda c: by[c].tokens_per_s)
    out["reconfirm"] = {
        "passes": passes, "seconds": time.perf_counter() - t0,
        "measured": {c.label(): by[c].tokens_per_s for c in cands},
        "reconfirmed_quality": q, "reconfirmed_quality_ci": ci,
        "grid_best_label": best_grid.label(), "best_of_reconfirmed": best_now.label(),
        "tuned_speedup": by[tuned].tokens_per_s / by[cands[-1]].tokens_per_s,
        "tuned_speedup_ci": list(bounds(speedup_ci(by[tuned].validated.measurement, by[cands[-1]].validated.measurement))),
    }
    path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"reconfirmed ({passes} passes, same held-out prompts): tuned {tuned.label()} "
          f"{by[tuned].tokens_per_s:.1f} vs grid best {best_grid.label()} {by[best_grid].tokens_per_s:.1f} tokens/s: "
          f"quality {q:.1%} (95% CI {ci[0]:.1%}..{ci[1]:.1%}); "
          + ", ".join(f"{c.label()} {by[c].tokens_per_s:.1f}" for c in cands))


if __name__ == "__main__":
    opts.run_script(main)
