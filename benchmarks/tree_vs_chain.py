"""Token trees and staged drafting against the best chain, measured, and the tree model's fidelity.

One profile with ``--trees`` on the tuning half of a workload; then every configuration of a grid
(chains, trees of every kind, staged drafting; plain decoding as the reference) is predicted from that
profile and measured on the *held-out* half, interleaved pass by pass in one process. Reported:

- the fidelity table of the tree and staged configurations (and the chains beside them): predicted vs
  measured tokens/s with the measured 95% CI, τ, median |error| and regret, the same statistics as
  ``benchmarks/fidelity.py`` (goal: median |error| <= 5 %, regret <= 2 %);
- the best measured tree and the best measured staged configuration against the best measured chain,
  each ratio with its paired bootstrap 95% CI (same prompts, same passes; ``stats.speedup_ci``), and
  the goal (>= 1.10);
- why, from measured terms: per configuration the measured τ and decode seconds per cycle, and the
  profile's terms of a cycle (draft forwards, T_v(nodes + 1), overhead): what the extra accepted tokens
  bought against what the wider verify and the per-depth draft forwards cost.

Batch size 1 only: the engine decodes one sequence at a time (its loops do not batch), so B = 4 is not
measured. Usage (about 3-4 minutes alone on a quiet 2-core machine; the load average is recorded):

    OMP_NUM_THREADS=1 python benchmarks/tree_vs_chain.py --db sqlite:////tmp/trees.db

Writes ``benchmarks/results/tree_vs_chain_cpu_<workload>.txt`` and ``.json``.
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import typer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._bench import result_stem  # noqa: E402
from benchmarks.fidelity import summarize  # noqa: E402  (the same statistics as the chain fidelity table)
from specdec_tune.cli import _options as opts  # noqa: E402
from specdec_tune.db import get_run, open_database  # noqa: E402
from specdec_tune.profiler import ProfileSettings, run_profile  # noqa: E402
from specdec_tune.core.stats import bounds, speedup_ci  # noqa: E402
from specdec_tune.tuner.model import Candidate, Evaluator, spec_config, tree_overhead, verify_time  # noqa: E402
from specdec_tune.tuner.search import DEFAULT_TREES, brute_force, measure_predicted, server_search_space  # noqa: E402
from specdec_tune.tuner.search import shape_candidate, tree_space_args  # noqa: E402

GOAL_SPEEDUP = 1.10

app = typer.Typer(add_completion=False)


def _grid(drafts: list[str], chains: str, trees: str, staged: str) -> list[Candidate]:
    """Plain decoding, then chains ``draft:N``, trees ``draft:N:shape``, staged ``draft:N:inner``."""
    out = [Candidate("none", 0)]
    for item in (x for x in chains.split(",") if x):
        d, n = item.rsplit(":", 1)
        out.append(Candidate(d, int(n)))
    for item in (x for x in trees.split(",") if x):
        d, n, shape = item.split("@")
        out.append(shape_candidate(d, int(n), shape))
    for item in (x for x in staged.split(",") if x):
        d, n, inner = item.split("@")
        out.append(Candidate(d, int(n), staged=inner))
    for c in out:
        if not c.is_plain and c.drafter not in drafts:
            raise typer.BadParameter(f"{c.label()}: draft {c.drafter!r} is not one of --drafts {','.join(drafts)}")
    return out


def _kind(c: Candidate) -> str:
    return "plain" if c.is_plain else "tree" if c.tree else "staged" if c.staged else "chain"


def _row(c: Candidate, v, plain, ev: Evaluator) -> dict:
    m, p = v.measurement, v.prediction
    rel = v.relative_error
    lo, hi = bounds(speedup_ci(m, plain.measurement)) if plain is not None and not c.is_plain else (math.nan, math.nan)
    return {"config": c.label(), "kind": _kind(c), "candidate": c.to_dict(), "measured": m.tokens_per_s,
            "ci95": list(m.ci95) if m.ci95 else None, "predicted": p.tokens_per_s, "error": rel,
            "inside_ci": v.inside_ci, "tau_measured": m.mean_tokens_per_cycle, "tau_predicted": p.expected_tokens_per_cycle,
            "tau_error": None if not m.mean_tokens_per_cycle else
            (p.expected_tokens_per_cycle - m.mean_tokens_per_cycle) / m.mean_tokens_per_cycle,
            "speedup_error": 0.0 if plain is None else (p.speedup - m.tokens_per_s / plain.measurement.tokens_per_s)
            / (m.tokens_per_s / plain.measurement.tokens_per_s),
            "speedup_measured": m.tokens_per_s / plain.measurement.tokens_per_s if plain else 1.0,
            "speedup_predicted": p.speedup,
            "speedup_ci": [lo, hi], "cycle_s_predicted": p.cycle_time_s, "nodes_predicted": p.expected_draft_length,
            "draft_forwards_predicted": p.expected_draft_forwards, "source": p.source, "in_sample": v.in_sample,
            "measured_id": m.measured_id, **_terms(c, p, ev)}


def _terms(c: Candidate, p, ev: Evaluator) -> dict:
    """The predicted cycle's terms at the profile's machine speed (ms): draft forwards, the target's
    verify over nodes + 1 (at the mean node count) and the engine's own time."""
    if c.is_plain:
        return {}
    rp = ev.profile(c.drafter)
    cycle = p.cycle_time_s * p.machine_speed  # undo the rescaling to the measurement's machine speed
    verify = verify_time(rp.model, 1, max(1, round(p.expected_draft_length)) + 1)
    data = ev.tree_data(c.drafter) if c.tree else None
    overhead = tree_overhead(rp, data, round(p.expected_draft_length), c.tree.startswith("eagle")) if data \
        else rp.cycle_overhead_s
    return {"verify_ms": verify * 1e3, "overhead_ms": overhead * 1e3, "cycle_ms": cycle * 1e3,
            "draft_ms": max(cycle - verify - overhead, 0.0) * 1e3}


def _profile(db, target: str, drafts: list[str], workload: str, prompts: int, repeats: int, temperature: float) -> int:
    settings = ProfileSettings(split="tune", max_prompts=prompts, n_max=8, k_max=17, repeats=repeats,
                               max_new_tokens=64, trees=True, threads=1, temperature=temperature)
    return run_profile(db, target, drafts, workload, settings).run_id


def _versus(rows: list[dict], validated: dict, kind: str) -> dict | None:
    """The best measured ``kind`` against the best measured chain, with the paired 95% CI."""
    best = max((r for r in rows if r["kind"] == kind), key=lambda r: r["measured"], default=None)
    chain = max((r for r in rows if r["kind"] == "chain"), key=lambda r: r["measured"], default=None)
    if best is None or chain is None:
        return None
    lo, hi = bounds(speedup_ci(validated[best["config"]].measurement, validated[chain["config"]].measurement))
    return {"kind": kind, "best": best["config"], "chain": chain["config"], "ratio": best["measured"] / chain["measured"],
            "ci95": [lo, hi], "goal": GOAL_SPEEDUP, "met": best["measured"] / chain["measured"] >= GOAL_SPEEDUP}


def _lines(rows: list[dict], versus: list[dict], header: list[str], fidelity: dict) -> list[str]:
    lines = header + ["", f"{'configuration':<44} {'measured':>8} {'95% CI':>13} {'predicted':>9} {'error':>7} "
                      f"{'τ meas':>6} {'τ pred':>6} {'× plain (95% CI)':>20} {'× pred':>6} {'cycle ms':>8} {'nodes':>5}"]
    for r in rows:
        ci = f"{r['ci95'][0]:.1f}-{r['ci95'][1]:.1f}" if r["ci95"] else "-"
        sp = f"{r['speedup_measured']:.2f} ({r['speedup_ci'][0]:.2f}-{r['speedup_ci'][1]:.2f})" \
            if r["kind"] != "plain" else "1.00"
        tau = f"{r['tau_measured']:.2f}" if r["tau_measured"] else "-"
        lines.append(f"{r['config']:<44} {r['measured']:8.1f} {ci:>13} {r['predicted']:9.1f} "
                     f"{(r['error'] or 0) * 100:+6.1f}% {tau:>6} {r['tau_predicted']:6.2f} {sp:>20} "
                     f"{r['speedup_predicted']:6.2f} {r['cycle_s_predicted'] * 1e3:8.2f} {r['nodes_predicted']:5.1f}")
    lines += ["", "why (per cycle; measured τ; predicted terms at the profile's machine speed, ms: draft forwards + "
                  "verify T_v(nodes + 1) + engine; staged: its draft forwards, inner drafter and inner bookkeeping in the first term):"]
    for r in rows:
        if r["kind"] != "plain":
            tau = r["tau_measured"] or float("nan")
            lines.append(f"  {r['config']:<44} τ {tau:.2f} measured ({r['tau_predicted']:.2f} predicted); "
                         f"{r['draft_ms']:.2f} + {r['verify_ms']:.2f} + {r['overhead_ms']:.2f} = "
                         f"{r['cycle_ms']:.2f} ms; {r['cycle_ms'] / r['tau_predicted']:.2f} ms per token predicted")
    lines.append("")
    for name, s in fidelity.items():
        if s:
            lines.append(f"fidelity, {name}: {s['configurations']} configurations, median |error| "
                         f"{s['median_abs_error'] * 100:.1f}% (goal <= 5%), worst {s['worst_abs_error'] * 100:.1f}%, "
                         f"regret {s['regret'] * 100:.1f}% (goal <= 2%; predicted best {s['predicted_best']}), "
                         f"median |τ error| {s['median_abs_tau_error'] * 100:.1f}%")
    for v in versus:
        lines.append(f"best {v['kind']} {v['best']} vs best chain {v['chain']}: {v['ratio']:.3f}× (paired 95% CI "
                     f"{v['ci95'][0]:.3f}-{v['ci95'][1]:.3f}); goal >= {v['goal']:.2f}×: {'met' if v['met'] else 'not met'}")
    return lines


def _fidelity(rows: list[dict]) -> dict:
    """``fidelity.py``'s statistics on speedups over plain decoding measured in the same passes (free of
    the machine's speed, which on a shared machine moves between passes, and with it the rescaling of
    each configuration's prediction) and on tokens/s."""
    spec = [r for r in rows if r["kind"] != "plain"]
    by_speedup = [{**r, "predicted": r["speedup_predicted"], "measured": r["speedup_measured"],
                   "error": r["speedup_error"]} for r in spec]
    return {"trees and staged, speedup": summarize([r for r in by_speedup if r["kind"] != "chain"]),
            "chains, speedup": summarize([r for r in by_speedup if r["kind"] == "chain"]),
            "all, speedup": summarize(by_speedup),
            "trees and staged, tokens/s": summarize([r for r in spec if r["kind"] != "chain"]),
            "all, tokens/s": summarize(spec)}


def _tune_pick(db, run_id: int, ev: Evaluator, drafts: list[str]) -> dict:
    """What ``tune --trees default`` would search first: the model's best over the whole space (chains
    with θ and schedules, the default trees, the staged pairs profiled), predicted from this profile."""
    run = get_run(db, run_id)
    req = SimpleNamespace(trees=DEFAULT_TREES, drafts=tuple(drafts))
    space = server_search_space("any", [d for d in drafts if d != "ngram"], run.settings.n_max,
                                "ngram" in drafts, **tree_space_args(req, run, ev))
    ranked = brute_force(ev, space)
    best = ranked[0].candidate
    chain = next(s for s in ranked if not (s.candidate.tree or s.candidate.staged))
    kind = "a tree" if best.tree else "staged drafting" if best.staged else "a chain"
    line = (f"tune's search over {space.size} points (chains, default trees, staged pairs) predicts {kind} best: "
            f"{best.label()} ({ranked[0].predicted_tokens_per_s:.1f} tokens/s predicted; best chain "
            f"{chain.candidate.label()} {chain.predicted_tokens_per_s:.1f})")
    return {"best": best.to_dict(), "kind": kind, "predicted": ranked[0].predicted_tokens_per_s,
            "best_chain": chain.candidate.to_dict(), "best_chain_predicted": chain.predicted_tokens_per_s, "line": line}


@app.command()
def main(
    db: Annotated[str, typer.Option("--db", metavar="URL", help="Results database (a fresh one profiles).")]
        = "sqlite:///trees.db",
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    drafts: Annotated[str, typer.Option("--drafts", help="Drafts to profile.")] = "mini-draft-1l,mini-draft-2l,ngram",
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    run: Annotated[int | None, typer.Option("--run", help="Reuse a profile run made with --trees.")] = None,
    profile_prompts: Annotated[int, typer.Option("--profile-prompts")] = 8,
    profile_repeats: Annotated[int, typer.Option("--profile-repeats")] = 10,
    chains: Annotated[str, typer.Option("--chains", help="draft:N, comma-separated.")]
        = "mini-draft-1l:4,mini-draft-1l:6,mini-draft-2l:3,mini-draft-2l:4,mini-draft-2l:5,mini-draft-2l:6",
    trees: Annotated[str, typer.Option("--trees", help="draft@N@shape, comma-separated.")]
        = ("mini-draft-2l@4@chains:2,mini-draft-2l@5@topk:2,mini-draft-2l@5@sequoia:8,mini-draft-2l@6@sequoia:12,"
           "mini-draft-2l@5@eagle:2:8,mini-draft-1l@6@sequoia:10,mini-draft-1l@4@eagle:3:10"),
    staged: Annotated[str, typer.Option("--staged", help="draft@N@inner, comma-separated.")]
        = "mini-draft-2l@6@ngram,mini-draft-2l@6@mini-draft-1l,mini-draft-1l@6@ngram",
    max_prompts: Annotated[int, typer.Option("--max-prompts", help="Held-out prompts measured.")] = 8,
    repeats: opts.RepeatsOption = opts.DEFAULT_REPEATS,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy; > 0 samples (profile and measure).")]
        = 0.0,
    out: Annotated[str | None, typer.Option("--out", help=(
        "Result file stem, a path (default benchmarks/results/tree_vs_chain_cpu_WORKLOAD)."))] = None,
) -> None:
    """Measure trees and staged drafting against the best chain on held-out prompts (module docstring)."""
    names = drafts.split(",")
    grid = _grid(names, chains, trees, staged)
    stem = result_stem(out, f"tree_vs_chain_cpu_{Path(workload).stem}" + (f"_t{temperature:g}" if temperature else ""))
    database = open_database(db)
    started, load_before = time.perf_counter(), os.getloadavg()
    run_id = run if run is not None else _profile(database, target, names, workload, profile_prompts, profile_repeats,
                                                  temperature)
    mode = "sampling" if temperature > 0 else "greedy"
    ev = Evaluator(database, run_id, mode)
    items = [(None if c.is_plain else c.drafter, spec_config(c, mode)) for c in grid]
    shapes = [("", "") if c.is_plain else (c.tree, c.staged) for c in grid]
    validated = measure_predicted(database, run_id, items, split="holdout", max_prompts=max_prompts,
                                  repeats=repeats, shapes=shapes, temperature=temperature)
    plain = validated[0]
    rows = [_row(c, v, plain, ev) for c, v in zip(grid, validated)]
    by_config = {r["config"]: v for r, v in zip(rows, validated)}
    fidelity = _fidelity(rows)
    versus = [v for v in (_versus(rows, by_config, "tree"), _versus(rows, by_config, "staged")) if v]
    pick = _tune_pick(database, run_id, ev, names)
    settings = get_run(database, run_id).settings
    header = [f"# trees and staged drafting vs chains, held out ({time.strftime('%Y-%m-%d')}, {platform.node()}, "
              f"{platform.processor() or platform.machine()}, torch threads {settings.threads})",
              f"# target {target}, drafts {drafts}, workload {workload}, profile run {run_id} "
              f"({len(settings.prompt_ids)} tuning prompts, --trees), {max_prompts} held-out prompts, "
              f"{repeats} interleaved passes, batch size 1 (the engine does not batch), "
              f"{'greedy' if temperature == 0 else f'sampling at temperature {temperature}'}",
              f"# load average before / after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"]
    lines = _lines(rows, versus, header, fidelity) + [pick["line"]]
    stem.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"run_id": run_id, "rows": rows, "fidelity": fidelity,
                                                      "versus": versus, "tune_pick": pick,
                                                      "seconds": time.perf_counter() - started,
                                                      "load_average": [load_before, os.getloadavg()]},
                                                     indent=1, default=str) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    app()
