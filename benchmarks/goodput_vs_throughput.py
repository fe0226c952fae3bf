"""How the goodput-optimal configuration under a latency SLO differs from the throughput-optimal one.

1. Profile on the tuning half of a workload (or reuse ``--run``), at batch sizes 1, 4 and 16.
2. Predict every configuration of the server's space: the throughput winner T (``--objective
   throughput``) and the goodput winner G (``--objective goodput --slo-tpot-ms X``).
3. Measure T, G and plain decoding interleaved (A, B, C, A, B, C, ...) on the held-out prompts: each
   one's throughput and goodput with 95% bootstrap CIs, TPOT p50/p90/p99 with CIs, the share of
   requests meeting the SLO, and the paired ratios G ÷ T of goodput and of throughput (same prompts,
   same passes: a slow minute of a shared machine hits both).
4. The per-batch-size schedules each objective chooses (predicted).

Without ``--slo-tpot-ms`` the SLO is relative to the machine: a request's TPOT at most ``--slo-vs-plain``
times plain decoding's median TPOT (0.65: every request must run at least 1.54× faster per token than
plain decoding). The predicted bound uses the profile's plain TPOT, the measured bound plain decoding's
TPOT measured in the same interleaved passes, so a machine that is slower while measuring than while
profiling (a shared one) moves both sides alike. ``--slo-tpot-ms`` sets an absolute bound for both.

Usage (about 10-20 minutes on one CPU thread; a shared machine makes it slower and noisier):

    OMP_NUM_THREADS=1 python benchmarks/goodput_vs_throughput.py --db sqlite:///goodput.db

Writes ``benchmarks/results/goodput_vs_throughput_cpu_<workload>.txt`` and ``.json`` (with the load
average before and after).
"""
from __future__ import annotations

import os
import time
from typing import Annotated

import numpy as np
import typer

from _bench import write_results  # benchmarks/ is this script's folder
from specdec_tune.cli import _options as opts
from specdec_tune.db import get_run, open_database
from specdec_tune.core.latency import Slo, good_samples
from specdec_tune.core.stats import bounds, speedup_ci, tokens_per_s_ci
from specdec_tune.tuner.model import Candidate, Evaluator, Objective, predict_latency, profiled_specs, spec_config
from specdec_tune.tuner.search import brute_force, measure_candidates, per_batch_size, server_search_space
from specdec_tune.tuner.search._objectives import objective_schedule

Db = Annotated[str, typer.Option("--db", metavar="URL", help="Results database (sqlite:///goodput.db by default).")]
Run = Annotated[int | None, typer.Option("--run", help="Reuse a stored profile run (profiled on --split tune).")]
Slo_ = Annotated[float | None, typer.Option("--slo-tpot-ms", help="The TPOT bound (default: see --auto-quantile).")]
Pct = Annotated[float, typer.Option("--slo-percentile", help="The SLO's percentile of requests.")]
VsPlain = Annotated[float, typer.Option("--slo-vs-plain", help=(
    "Without --slo-tpot-ms: the bound is this times plain decoding's median TPOT (predicted / measured)."))]
Server = Annotated[str, typer.Option("--server", help="The server space searched (vllm: drafter × N, θ = 0).")]
NMax = Annotated[int, typer.Option("--n-max", help="Largest N searched.")]
MaxPrompts = Annotated[int | None, typer.Option("--max-prompts", help="Held-out prompts measured (default: all).")]
ProfileMaxPrompts = Annotated[int, typer.Option("--profile-max-prompts", help="Tuning prompts the profile runs.")]
Out = Annotated[str | None, typer.Option("--out", help="Result file stem (default in benchmarks/results).")]


def _measured(m, slo: Slo) -> dict:
    meas = m.validated.measurement
    good = good_samples(meas.samples, meas.latency, slo)
    s = meas.latency_summary
    tpot = {p: {"ms": s["tpot_s"][p]["value"] * 1e3, "ci_ms": [x * 1e3 for x in s["tpot_s"][p]["ci"]]}
            for p in ("p50", "p90", "p99")}
    met = [slo.meets(r.ttft_s, r.tpot_s) for row in meas.latency.requests for r in row]
    return {"label": m.candidate.label(), "tokens_per_s": m.tokens_per_s, "tokens_per_s_ci": list(bounds(m.ci)),
            "goodput": good.tokens_per_s, "goodput_ci": list(bounds(tokens_per_s_ci(good))), "tpot": tpot,
            "requests_meeting_slo": sum(met) / len(met), "samples": meas.samples, "good": good}


def main(
    db: Db = "sqlite:///goodput.db",
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    drafts: opts.BundledDraftsOption = "mini-draft-1l,mini-draft-2l,ngram",
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    run: Run = None,
    profile_max_prompts: ProfileMaxPrompts = opts.PROFILE_MAX_PROMPTS,
    slo_tpot_ms: Slo_ = None,
    slo_percentile: Pct = 90.0,
    slo_vs_plain: VsPlain = 0.65,
    server: Server = "vllm",
    n_max: NMax = 8,
    max_prompts: MaxPrompts = None,
    repeats: opts.RepeatsOption = opts.DEFAULT_REPEATS,
    out: Out = None,
) -> None:
    args = dict(locals())
    database = open_database(db)
    load_before = os.getloadavg()
    started = time.perf_counter()
    names = drafts.split(",")
    run_id = run if run is not None else _profile(database, target, names, workload, profile_max_prompts)
    model_drafts = [d for d in names if d != "ngram"]
    space = server_search_space(server, model_drafts, n_max, "ngram" in names)
    fast = brute_force(Evaluator(database, run_id), space)[0].candidate
    if slo_tpot_ms is None:
        rp = Evaluator(database, run_id).profile(None)
        plain_ms = 1e3 * predict_latency(rp, spec_config(Candidate("none", 0)), profiled_specs(rp)).tpot(0.5)
        slo = Slo(tpot_ms=round(slo_vs_plain * plain_ms, 3), percentile=slo_percentile)
    else:
        slo = Slo(tpot_ms=slo_tpot_ms, percentile=slo_percentile)
    goodput_ev = Evaluator(database, run_id, objective=Objective("goodput", slo))
    ranked = brute_force(goodput_ev, space)
    good = ranked[0].candidate
    schedules = _schedules(database, run_id, fast, good, slo, n_max)
    measured = measure_candidates(database, run_id, [fast, good, Candidate("none", 0)] if good != fast else
                                  [fast, Candidate("none", 0)], split="holdout", max_prompts=max_prompts,
                                  temperature=0.0, repeats=repeats, seed=0, progress=None)
    measured_slo = slo
    if slo_tpot_ms is None:  # the same bound relative to plain decoding as measured in these passes
        plain_m = measured[-1].validated.measurement.latency.per_prompt("tpot_s")
        measured_slo = Slo(tpot_ms=round(slo_vs_plain * 1e3 * float(np.median(plain_m)), 3), percentile=slo_percentile)
    rows = [_measured(m, measured_slo) for m in measured]
    ratios = _ratios(rows) if good != fast else {}
    load_after = os.getloadavg()
    text = _text(args, run_id, (slo, measured_slo), fast, good, ranked, rows, ratios, schedules, load_before,
                 load_after, time.perf_counter() - started, get_run(database, run_id).settings)
    print(text)
    for r in rows:
        r.pop("samples"), r.pop("good")
    write_results(out, f"goodput_vs_throughput_cpu_{workload}", text, {"args": args, "run_id": run_id, "slo_predicted": slo.to_dict(), "slo_measured": measured_slo.to_dict(),
         "throughput_winner": fast.to_dict(),
         "goodput_winner": good.to_dict(), "measured": rows, "ratios": ratios, "schedules": schedules,
         "load_average": [load_before, load_after], "date": time.strftime("%Y-%m-%d")})


def _schedules(db, run_id: int, fast: Candidate, good: Candidate, slo: Slo, n_max: int) -> dict:
    """Each winner's N per batch size as ``tune`` makes it: B = 1 its own N, larger batch sizes the
    objective's best N up to it (throughput from T_v(B, k); goodput at B under the SLO)."""
    out = {}
    for name, c, ev in (("throughput", fast, Evaluator(db, run_id)),
                        ("goodput", good, Evaluator(db, run_id, objective=Objective("goodput", slo)))):
        if c.is_plain:
            continue
        fn = per_batch_size if name == "throughput" else objective_schedule
        out[name] = {"label": c.label(), "per_batch_size": {1: c.num_speculative_tokens,
                                                            **fn(ev, c, [4, 16], min(n_max, c.num_speculative_tokens))}}
    return out


def _ratios(rows: list[dict]) -> dict:
    g, t = rows[1], rows[0]
    return {"goodput_G_over_T": g["goodput"] / t["goodput"] if t["goodput"] else None,
            "goodput_G_over_T_ci": list(bounds(speedup_ci(g["good"], t["good"]))) if t["goodput"] else None,
            "throughput_G_over_T": g["tokens_per_s"] / t["tokens_per_s"],
            "throughput_G_over_T_ci": list(bounds(speedup_ci(g["samples"], t["samples"])))}


def _text(args, run_id, slos, fast, good, ranked, rows, ratios, schedules, before, after, seconds, settings) -> str:
    slo, measured_slo = slos
    lines = [f"goodput vs throughput: target {args['target']}, drafts {args['drafts']}, workload {args['workload']}, "
             f"{args['server']} space, run {run_id} ({len(settings.prompt_ids)} tuning prompts), "
             f"{time.strftime('%Y-%m-%d')}, CPU, load average before {before[0]:.2f}, after {after[0]:.2f} "
             "(a shared machine: re-run quietly)",
             f"SLO: {slo.describe()} predicted, {measured_slo.describe()} measured" + (
                 f" ({args['slo_vs_plain']:g} × plain decoding's median TPOT, predicted from the profile and measured "
                 "in the same passes)" if args["slo_tpot_ms"] is None else ""),
             f"predicted throughput winner T: {fast.label()}",
             f"predicted goodput winner G: {good.label()}" + ("  (the same: the SLO does not change the choice)"
                                                              if good == fast else ""),
             "predicted goodput ranking (top 5): " + "; ".join(
                 f"{s.candidate.label()}: {s.value('goodput'):.1f} tokens/s meeting the SLO ({s.attainment:.0%} of "
                 f"requests), {s.predicted_tokens_per_s:.1f} tokens/s" for s in ranked[:5]), "",
             f"measured on held-out prompts, interleaved, {args['repeats']} repeats (95% CIs):"]
    for r in rows:
        t = r["tpot"]
        lines.append(f"  {r['label']:<24} throughput {r['tokens_per_s']:6.1f} [{r['tokens_per_s_ci'][0]:.1f}, "
                     f"{r['tokens_per_s_ci'][1]:.1f}]  goodput {r['goodput']:6.1f} [{r['goodput_ci'][0]:.1f}, "
                     f"{r['goodput_ci'][1]:.1f}]  TPOT p50/p90/p99 {t['p50']['ms']:.1f}/{t['p90']['ms']:.1f}/"
                     f"{t['p99']['ms']:.1f} ms  meeting SLO {r['requests_meeting_slo']:.0%}")
    if ratios:
        g, tp = ratios["goodput_G_over_T_ci"], ratios["throughput_G_over_T_ci"]
        lines.append(f"  G ÷ T, paired: goodput {ratios['goodput_G_over_T'] or float('nan'):.2f}x "
                     f"{'[%.2f, %.2f]' % tuple(g) if g else ''}; throughput {ratios['throughput_G_over_T']:.2f}x "
                     f"[{tp[0]:.2f}, {tp[1]:.2f}]")
    for name, sch in schedules.items():
        lines.append(f"predicted schedule by {name} ({sch['label']}): " + ", ".join(
            f"B={b}: N={n}" for b, n in sch["per_batch_size"].items()))
    lines.append(f"total {seconds:.0f} s")
    return "\n".join(lines)


def _profile(db, target: str, drafts: list[str], workload: str, max_prompts: int) -> int:
    from specdec_tune.profiler import ProfileSettings, run_profile

    t0 = time.perf_counter()
    run_id = run_profile(db, target, drafts, workload, ProfileSettings(
        device="cpu", split="tune", max_prompts=max_prompts, batch_sizes=(1, 4, 16))).run_id
    print(f"profile run {run_id} on the tune split: {time.perf_counter() - t0:.0f} s", flush=True)
    return run_id


if __name__ == "__main__":
    opts.run_script(main)
