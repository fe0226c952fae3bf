"""The batch model validated at B > 1 against the batched engine, held out (issue 38, part 4).

Profile the bundled pair on the tuning half of a workload with T_v(B, k) and T_s(B) at every batch size,
then measure plain decoding and N = 1..n on the held-out half at each batch size (B = 1: the one-sequence
engine; B > 1: the batched engine, batches of B consecutive held-out prompts), every N of one batch size
interleaved batch by batch, and compare each with two predictions from that one profile:

- **batch model** (``tuner.model.predict_batches``, what the engine does: ragged rows, widest verify, most
  draft forwards, a shrinking batch, batched prefill), as stored beside the measurement: speculative rates
  rescaled to the speed plain decoding measured at the same B in the same passes (their error is the
  speedup's), plain decoding's to the machine probe;
- **lock-step** (docs/model.md item 7 as before this issue: every row runs the pooled cycle, B·τ tokens per
  F·T_s(B) + T_v(B, L + 1), ``tuner.model.predict_prompts`` at batch size B), rescaled the same way.

Per batch size: median and worst |error| of each, the best N predicted vs measured and the regret (1 -
measured tokens/s of the predicted best ÷ the measured best). Goal: median |error| ≤ 5 %, regret ≤ 3 %.
Writes ``benchmarks/results/batch_fidelity_cpu_<workload>.txt`` and ``.json``; the numbers of a shared
VM are noisy: the text says so.

    OMP_NUM_THREADS=1 python benchmarks/batch_fidelity.py --db sqlite:///batch_fidelity.db \\
        --workload benchmarks/workloads/functions-240.jsonl --max-prompts 48
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Annotated

import typer

from _bench import write_results  # benchmarks/ is this script's folder
from specdec_tune.cli import _options as opts
from specdec_tune.core.stats import speedup_estimate
from specdec_tune.db import get_run, open_database
from specdec_tune.profiler import ProfileSettings, run_profile
from specdec_tune.tuner.model import SpecConfig, at_machine_speed, load_run_profile, predict_prompts
from specdec_tune.tuner.search import batch_specs, measure_predicted_at

GOAL = {"median_abs_error": 0.05, "regret": 0.03}

Db = Annotated[str, typer.Option("--db", metavar="URL", help="Results database URL (default sqlite:///batch_fidelity.db).")]
Run = Annotated[int | None, typer.Option("--run", help="Reuse a stored profile run (profiled on --split tune at every B).")]


def main(db: Db = "sqlite:///batch_fidelity.db", run: Run = None, target: str = "mini-target",
         draft: str = "mini-draft-1l", workload: str = "benchmarks/workloads/functions-240.jsonl",
         batch_sizes: str = "1,2,4,8,16", ns: str = "1,2,3,4,5,6", n_max: int = 6, profile_max_prompts: int = 24,
         max_prompts: int = 48, repeats: int = 2, threads: int = 1, out: str | None = None) -> None:
    """Profile (or reuse --run), measure every N at every batch size held out, write the validation table."""
    args = dict(locals())  # the command's arguments, for the JSON (before any other local exists)
    started = time.perf_counter()
    database = open_database(db)
    sizes = [int(b) for b in batch_sizes.split(",")]
    grid = [int(n) for n in ns.split(",")]
    if run is None:
        settings = ProfileSettings(device="cpu", split="tune", max_prompts=profile_max_prompts, n_max=n_max,
                                   k_max=n_max + 1, batch_sizes=tuple(sizes), threads=threads)
        run = run_profile(database, target, [draft], workload, settings).run_id
        print(f"profile run {run}: {time.perf_counter() - started:.0f} s", flush=True)
    items = [(None, SpecConfig(n)) for n in grid] + [("none", SpecConfig(0))]
    rows = []
    for b in sizes:
        t0 = time.perf_counter()
        got = measure_predicted_at(database, run, items, [b], split="holdout", max_prompts=max_prompts,
                                   repeats=repeats, threads=threads)
        rows += _rows(database, run, got, b)
        print(f"B={b}: {len(items)} configurations x {repeats} repeats: {time.perf_counter() - t0:.0f} s", flush=True)
    summary = {b: summarize([r for r in rows if r["B"] == b]) for b in sizes}
    text = "\n".join(_header(database, run, draft, workload, max_prompts, repeats, threads) + table(rows)
                     + [""] + summary_lines(summary) + [f"total {time.perf_counter() - started:.0f} s"])
    print(text)
    name = workload.rsplit("/", 1)[-1].removesuffix(".jsonl")
    write_results(out, f"batch_fidelity_cpu_{name}", text, {"run_id": run, "rows": rows, "summary": summary,
                                                            "goal": GOAL, "args": args})


def _rows(database, run: int, got: list, b: int) -> list[dict]:
    """One row per N: measured, the batch model's and lock-step's predictions, the measured speedup."""
    plain = next(v for v in got if v.config.spec.num_speculative_tokens == 0)
    gauge = plain.measurement.tokens_per_s
    rp = load_run_profile(database, run)
    stored = get_run(database, run)
    out = []
    for v in got:
        m, n = v.measurement, v.config.spec.num_speculative_tokens
        specs = [s for g in batch_specs(stored, m) for s in g] if b > 1 else None
        lock = _lockstep(rp, v, b, specs, gauge, plain)
        out.append({"B": b, "N": n, "measured": m.tokens_per_s, "ci95": m.ci95,
                    "speedup_measured": 1.0 if n == 0 else speedup_estimate(m, plain.measurement).value,
                    "batch_model": None if v.prediction is None else v.prediction.tokens_per_s,
                    "batch_error": v.relative_error, "lockstep": lock,
                    "lockstep_error": None if lock is None else lock / m.tokens_per_s - 1,
                    "tau": m.mean_tokens_per_cycle, "batches": len(m.groups) or m.prompts})
    return out


def _lockstep(rp, v, b: int, specs, gauge: float, plain) -> float | None:
    """Item 7's lock-step prediction end to end at batch size ``b`` on the measured prompts, rescaled as stored."""
    from specdec_tune.tuner.model import PromptSpec

    if b == 1:
        return None if v.prediction is None else v.prediction.tokens_per_s  # one sequence: the same model
    config = replace(v.config, batch_size=b)
    prompts = [PromptSpec(s.prompt_tokens, None, s.profiled_index) for s in specs]
    raw = predict_prompts(rp, config, prompts)
    base = predict_prompts(rp, replace(config, spec=SpecConfig(0).spec), prompts)
    if v.config.spec.num_speculative_tokens == 0:
        return at_machine_speed(raw, plain.prediction.machine_speed if plain.prediction else 1.0).tokens_per_s
    return raw.tokens_per_s / base.tokens_per_s * gauge  # its speedup, at the speed plain decoding measured


def summarize(rows: list[dict]) -> dict:
    def med(key):
        errs = [abs(r[key]) for r in rows if r[key] is not None]
        return (statistics.median(errs), max(errs)) if errs else (None, None)

    best = max(rows, key=lambda r: r["measured"])
    picked = {key: max((r for r in rows if r[key] is not None), key=lambda r: r[key], default=None)
              for key in ("batch_model", "lockstep")}
    return {"batch_model_error": med("batch_error"), "lockstep_error": med("lockstep_error"),
            "best_n_measured": best["N"],
            **{f"best_n_{k}": None if p is None else p["N"] for k, p in picked.items()},
            **{f"regret_{k}": None if p is None else 1 - p["measured"] / best["measured"] for k, p in picked.items()}}


def _header(database, run: int, draft: str, workload: str, max_prompts: int, repeats: int, threads: int) -> list[str]:
    s = get_run(database, run).settings
    return [f"batch model fidelity: mini-target + {draft}, workload {workload}, run {run} (profiled on split "
            f"{s.split}: {len(s.prompt_ids)} prompts, T_v(B, k) at B = {list(s.batch_sizes)}), CPU, {threads} thread(s), "
            f"held-out prompts: the first {max_prompts}, repeats {repeats}",
            "NOISY: a shared 2-core VM (other processes running); rates are end to end (prefill included), per batch "
            "at B > 1; predictions rescaled as stored (speculative: to plain decoding's measured speed at that B)", ""]


def _pct(x) -> str:
    return "–" if x is None else f"{x * 100:+.1f}%"


def table(rows: list[dict]) -> list[str]:
    lines = [f"{'B':>3} {'N':>3} {'measured':>9} {'95% CI':>15} {'speedup':>8} {'τ':>5} {'batch model':>12} "
             f"{'error':>7} {'lock-step':>10} {'error':>7}"]
    for r in rows:
        ci = f"{r['ci95'][0]:.1f}-{r['ci95'][1]:.1f}" if r["ci95"] else "(1 batch)"
        lines.append(f"{r['B']:>3} {r['N']:>3} {r['measured']:>9.1f} {ci:>15} {r['speedup_measured']:>7.2f}× "
                     f"{(r['tau'] or 1.0):>5.2f} {(r['batch_model'] or 0):>12.1f} {_pct(r['batch_error']):>7} "
                     f"{(r['lockstep'] or 0):>10.1f} {_pct(r['lockstep_error']):>7}")
    return lines


def summary_lines(summary: dict) -> list[str]:
    lines = [f"{'B':>3} {'median |err| batch':>19} {'worst':>7} {'median |err| lock-step':>23} {'best N meas.':>13} "
             f"{'pred. (batch)':>14} {'regret':>7} {'pred. (lock-step)':>18} {'regret':>7}"]
    for b, s in summary.items():
        (mb, wb), (ml, _) = s["batch_model_error"], s["lockstep_error"]
        lines.append(f"{b:>3} {_pct(mb):>19} {_pct(wb):>7} {_pct(ml):>23} {s['best_n_measured']:>13} "
                     f"{s['best_n_batch_model']!s:>14} {_pct(s['regret_batch_model']):>7} "
                     f"{s['best_n_lockstep']!s:>18} {_pct(s['regret_lockstep']):>7}")
    return lines + [f"goal: median |error| <= {GOAL['median_abs_error']:.0%} per batch size, regret <= {GOAL['regret']:.0%}"]


if __name__ == "__main__":
    opts.run_script(main)
