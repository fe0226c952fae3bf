"""``specdec-tune profile``: profile a model pair on a workload, store it, print what it predicts.

Throughput everywhere is end to end, as a user sees it: new tokens / wall seconds of whole decode
calls, prefill included, on the run's profiled prompts. Every number printed says whether it was
measured or predicted.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from specdec_tune.cli import _checks as opt
from specdec_tune.cli._app import THROUGHPUT_NOTE, app, console, print_json, quiet_loading
from specdec_tune.cli._options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_CUDA_GRAPHS,
    DEFAULT_FORWARD,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_SEED,
    DEFAULT_THREADS,
    PROFILE_MAX_PROMPTS,
    DbOption,
    DeviceOption,
    DtypeOption,
    CudaGraphsOption,
    ForwardOption,
    MaxNewTokensOption,
    SeedOption,
    SyntheticAcceptanceOption,
    TargetOption,
    ThreadsOption,
    WorkloadOption,
)
from specdec_tune.cli._progress import Bar, progress_bar

if TYPE_CHECKING:
    from specdec_tune.db import RunSettings

SHOWN_K = (1, 2, 3, 5, 9, 17)

_Drafts = Annotated[str, typer.Option("--draft", help=(
    "Drafts to profile, comma-separated: models sharing the target's tokenizer and/or 'ngram'."))]


def profile_summary(db, run_id: int) -> dict:
    """Everything ``profile`` prints, read back from the database (measured and predicted, labelled)."""
    from specdec_tune.db import get_run, list_measured
    from specdec_tune.tuner.model import load_run_profile, predict_baseline, run_identity_check

    run = get_run(db, run_id)
    base_rp = load_run_profile(db, run_id, baseline_only=True)
    isolated = load_run_profile(db, run_id, baseline_only=True, calibrate=False)  # as measured, for display
    verify = {b: dict(curve) for b, curve in isolated.model.verify_s.items()}
    baseline = next((m for m in list_measured(db, run_id) if m.draft is None), None)
    check = run.settings.identity_check or run_identity_check(db, run_id)
    return {
        "run_id": run_id, "status": run.status, "target": run.target.name,
        "workload": run.workload.name if run.workload else None, "throughput": THROUGHPUT_NOTE,
        "prompts": len(run.settings.prompt_ids), "max_new_tokens": run.settings.max_new_tokens,
        "typical_context": run.settings.typical_context or None, "threads": run.settings.thread_choice,
        "machine_probe_ms": None if base_rp.machine_probe_s is None else base_rp.machine_probe_s * 1e3,
        "verify_ms": {str(b): {str(k): s * 1e3 for k, s in c.items()} for b, c in verify.items()},
        "baseline": {
            "measured_tokens_per_s": baseline.measured_tokens_per_s if baseline else None,
            "predicted_tokens_per_s": predict_baseline(base_rp).tokens_per_s,
            "predicted_label": "calibration identity (the model calibrated on this very run; not a validation)",
            "ar_overhead_ms": base_rp.model.ar_overhead_s * 1e3,
        },
        # the calibration identity with the hooks' tax put back (what the hooked pass paid), the in-loop ÷
        # isolated ratios and what the check found (tuner.model.identity_check); None: no hooked plain pass
        "identity_check": check.model_dump(mode="json") if check else None,
        "drafts": [_draft_summary(db, run_id, d.name) for d in run.drafts],
        "acceptance_rates": _acceptance_json(run.settings),
        "timed_regions": run.settings.timed_regions,
        "cuda_graphs": {"target": run.settings.cuda_graphs_used, "drafts": dict(run.settings.draft_cuda_graphs),
                        "counters": dict(run.settings.graph_counters), "read": "after the run"},
    }


def _draft_summary(db, run_id: int, name: str) -> dict:
    """One draft's part of :func:`profile_summary`: its timings, acceptance, lossy front and best configurations."""
    from specdec_tune.db import load_acceptance, load_bias_front
    from specdec_tune.tuner.model import best_configs, best_n_per_batch_size, load_run_profile

    rp = load_run_profile(db, run_id, name)
    greedy = next(iter(load_acceptance(db, run_id, draft=name, mode="greedy")), None)
    best = best_configs(rp, top=3) if rp.model.traces else []
    per_batch = {}
    if rp.model.traces and len(rp.model.verify_s) > 1:
        schedule = best_n_per_batch_size(rp.model, sorted(rp.model.verify_s), range(1, rp.traced_n_max + 1))
        per_batch = {str(b): n for b, n in schedule.items()}
    return {
        "name": name,
        "draft_step_ms": {str(b): s * 1e3 for b, s in rp.draft_step_raw_s.items()},
        "cycle_overhead_ms": rp.engine_overhead_s * 1e3,
        "draft_step_in_loop_ms": {"first": rp.first_draft_step_s.get(1, math.nan) * 1e3,
                                  "later": (rp.model.draft_step_s.get(1, 0.0) - rp.forward_overhead_s) * 1e3}
        if rp.calibrated and rp.draft_step_raw_s else None,
        "per_forward_overhead_ms": rp.forward_overhead_s * 1e3,
        "alpha": list(greedy.alpha) if greedy else [],
        "beta": list(greedy.beta) if greedy else [],
        "cycles": greedy.cycles if greedy else 0,
        "greedy_agreement": greedy.greedy_agreement if greedy else None,
        "one_minus_tv": greedy.one_minus_tv if greedy else None,
        "best_n_per_batch_size": per_batch,
        # the best speculative configuration's predicted speedup below 1: plain decoding is predicted faster
        "plain_predicted_faster": bool(best) and best[0][1].speedup < 1,
        "bias_front": [{"method": r.method, "epsilon": r.epsilon, "source": r.source, "rejection": r.rejection,
                        "bias": r.bias, "pareto_bias": r.pareto_bias, "positions": r.positions,
                        "label": "computed" if r.source == "theory" else "measured"}
                       for r in load_bias_front(db, run_id, name)],
        "best": [
            {"num_speculative_tokens": c.spec.num_speculative_tokens, "threshold": c.spec.threshold,
             "tokens_per_s": p.tokens_per_s, "speedup": p.speedup, "source": p.source,
             "expected_tokens_per_cycle": p.expected_tokens_per_cycle,
             "label": "predicted, synthetic acceptance" if p.source == "synthetic" else "predicted"}
            for c, p in best
        ],
    }


def _acceptance_json(settings: RunSettings) -> dict:
    """Where the run's acceptance comes from: measured (the target verified), or synthetic (given rates)."""
    rates = settings.synthetic_acceptance
    if not rates:
        return {"kind": "measured"}
    return {"kind": "synthetic", "rates": list(rates), "label": opt.synthetic_label(rates)}


def _plain_faster(d: dict) -> bool:
    """The draft's best speculative configuration is predicted slower than plain decoding."""
    return bool(d["best"]) and d["best"][0]["speedup"] < 1


def _print_summary(out: Console, s: dict) -> None:
    out.print(f"[bold]run {s['run_id']}[/bold] ({s['status']}): target {s['target']}, workload {s['workload']}, "
                  f"{s['prompts']} prompts × {s['max_new_tokens']} new tokens, typical context {s['typical_context']}",
                  highlight=False)
    if s.get("threads"):
        from specdec_tune.profiler import ThreadChoice

        probe = f"; machine probe {s['machine_probe_ms']:.2f} ms (measured)" if s.get("machine_probe_ms") else ""
        out.print(ThreadChoice(**s["threads"]).text() + probe, highlight=False, markup=False)
    synthetic = s["acceptance_rates"]["kind"] == "synthetic"
    if synthetic:
        out.print(f"acceptance: {s['acceptance_rates']['label']}: the models' weights are random, so acceptance and every "
                  "prediction below rest on these rates (labelled synthetic)", highlight=False)
    curve = s["verify_ms"].get("1") or next(iter(s["verify_ms"].values()), {})
    shown = [k for k in SHOWN_K if str(k) in curve] or list(curve)[:6]
    base = s["baseline"]
    out.print(
        "target (measured): " + ", ".join(f"T_v({k}) {curve[str(k)]:.2f} ms" for k in shown)
        + f"; baseline {opt.format_rate(base['measured_tokens_per_s'])} tokens/s measured, "
        f"{opt.format_rate(base['predicted_tokens_per_s'])} recomputed from the same run (a calibration identity, "
        "not a validation: use measure on held-out prompts for that)", highlight=False)
    _print_check(out, s.get("identity_check"))
    from specdec_tune.profiler import describe_timed_regions

    out.print(describe_timed_regions(s.get("timed_regions")), highlight=False, markup=False)
    graphs = s.get("cuda_graphs") or {}
    if graphs.get("target") is not None:
        drafts = "".join(f", draft {name} {state}" for name, state in graphs["drafts"].items())
        out.print(f"CUDA graphs after the run: target {graphs['target']}{drafts}", highlight=False, markup=False)
    for d in s["drafts"]:
        out.print(_draft_table(d, curve, synthetic))
    if s["drafts"] and all(_plain_faster(d) for d in s["drafts"]):
        out.print("predicted: plain decoding is faster than every draft profiled here (each best speedup is below "
                  "1×); speculative decoding does not pay for this pair on this machine", highlight=False)
    out.print(f"throughput is {THROUGHPUT_NOTE}", highlight=False)


def _print_check(out: Console, check: dict | None) -> None:
    """The check at the profile's end: the calibration identity with the hooks' tax put back, the in-loop ÷
    isolated ratios, and one ``warning:`` line per problem found."""
    if not check:
        return
    ratios = "; ".join(f"{d}: " + ", ".join(f"{k.replace('_', ' ')} {r:.2f}×" for k, r in sorted(rs.items()))
                       for d, rs in check["in_loop_ratios"].items() if rs)
    out.print(f"check: plain decoding {check['plain_predicted_tokens_per_s']:.1f} tokens/s predicted by the model "
              f"calibrated on this run (hooks included) against {check['plain_measured_tokens_per_s']:.1f} measured "
              f"in the hooked pass ({check['plain_error']:+.1%}, bound ±3 %)"
              + (f"; in-loop ÷ isolated: {ratios} (bound 1.5×)" if ratios else ""), highlight=False, markup=False)
    for w in check["warnings"]:
        out.print(f"warning: {w}", highlight=False, markup=False)


def _draft_table(d: dict, curve: dict, synthetic: bool) -> Table:
    """One draft's table of :func:`_print_summary` (``curve``: the target's T_v(k) in ms at B = 1)."""
    table = Table(title=f"draft {d['name']}", show_header=True, title_justify="left")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("label")
    ts = d["draft_step_ms"].get("1")
    table.add_row("T_s, one draft forward", "–" if ts is None else f"{ts:.2f} ms", "measured")
    table.add_row("c = T_s / T_v(1)", "–" if ts is None else f"{ts / curve['1']:.3f}", "measured")
    if d["draft_step_in_loop_ms"]:
        loop = d["draft_step_in_loop_ms"]
        table.add_row("T_s in the loop: first / later forward of a cycle",
                      f"{loop['first']:.2f} / {loop['later']:.2f} ms", "measured")
    table.add_row("engine overhead per cycle / per draft forward",
                  f"{d['cycle_overhead_ms']:.2f} / {d['per_forward_overhead_ms']:.3f} ms", "measured")
    alphas = " ".join(opt.format_rate(a) for a in d["alpha"][:8])
    predicted = "predicted, synthetic acceptance" if synthetic else "predicted"
    table.add_row("α_1..α_8 (conditional, greedy)", alphas or "–",
                  "counted under synthetic acceptance" if synthetic else "measured")
    table.add_row("greedy agreement / 1 - TV (teacher-forced)",
                  f"{opt.format_rate(d['greedy_agreement'])} / {opt.format_rate(d['one_minus_tv'])}",
                  "measured (random weights: meaningless)" if synthetic else "measured")
    for i, b in enumerate(d["best"]):
        table.add_row(
            f"{'best' if i == 0 else f'#{i + 1}'}: N = {b['num_speculative_tokens']}, θ = {b['threshold']:.1f}",
            f"{b['tokens_per_s']:.1f} tokens/s, {b['speedup']:.2f}×, τ {b['expected_tokens_per_cycle']:.2f}",
            predicted)
    if _plain_faster(d):
        table.add_row("verdict", f"plain decoding is predicted faster (the best above: "
                      f"{d['best'][0]['speedup']:.2f}× plain decoding)", predicted)
    for method in ("opt", "uno"):
        pts = {(r["epsilon"], r["source"]): r for r in d["bias_front"] if r["method"] == method}
        if pts:
            table.add_row(f"Decoding-{method.upper()}: ε → rejection / bias per verified position",
                          "; ".join(f"{e:g}: {t['rejection']:.3f}/{t['bias']:.3f}"
                                    + (f" ({pts[e, 'measured']['rejection']:.3f}/{pts[e, 'measured']['bias']:.3f})"
                                       if (e, "measured") in pts else "")
                                    for (e, src), t in sorted(pts.items()) if src == "theory"),
                          "computed (measured)")
    if d["best_n_per_batch_size"]:
        table.add_row("best N per batch size (θ = 0; 0 = do not speculate)",
                      ", ".join(f"B={b}: {n}" for b, n in d["best_n_per_batch_size"].items()), predicted)
    return table


def kept_by_interrupt(db, newest: int, target: str) -> str:
    """What a profile interrupted by Ctrl-C kept: its run (stored as ``interrupted``, newer than run
    ``newest``) and the stages whose samples it stored, as the one line after ``interrupted:``."""
    from specdec_tune.db import list_runs, load_timings, load_traces
    from specdec_tune.core.errors import SpecdecError

    try:
        run = next((r for r in list_runs(db, status="interrupted", limit=10)
                    if r.id > newest and r.settings.target == target), None)
        if run is None:
            return "nothing stored (no measurement had started); re-run the same command to profile"
        kinds = {row.kind for row in load_timings(db, run.id)}
        decoded = {t.prompt_index for t in load_traces(db, run.id, run.drafts[0].name, "greedy")} if run.drafts else set()
    except SpecdecError as exc:  # the database itself failed: what was kept cannot be read back now
        return f"what was kept cannot be read back ({exc})"
    stages = ["forward timings T_v(k), T_s"] * ("verify" in kinds) + ["prefill timings"] * ("prefill" in kinds)
    if decoded:
        stages.append(f"{len(decoded)} of {len(run.settings.prompt_ids)} prompts decoded")
    return (f"profile run {run.id} kept as interrupted with {', '.join(stages) or 'no stage finished'}; "
            "re-run the same command to profile again")


@app.command()
def profile(
    target: TargetOption,
    draft: _Drafts,
    workload: WorkloadOption,
    temperature: float = typer.Option(0.0, "--temperature", help="Also profile sampling acceptance at this temperature (0 = greedy only); with a model draft also the teacher-forced 1 - TV per position and the lossy acceptance front."),
    front_prompts: int = typer.Option(4, "--front-prompts", help="--temperature > 0: prompts each lossy rule (Decoding-OPT, Decoding-UNO) and ε decodes for the measured rejection–bias front (0: theory only)."),
    batch_sizes: str = typer.Option("1", "--batch-sizes", help="Batch sizes for T_v(B, k) and T_s(B), e.g. 1,4,16."),
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    forward: ForwardOption = DEFAULT_FORWARD,
    cuda_graphs: CudaGraphsOption = DEFAULT_CUDA_GRAPHS,
    n_max: int = typer.Option(16, "--n-max", help="N_max: tokens drafted per cycle while recording acceptance traces."),
    k_max: int = typer.Option(17, "--k-max", help="Largest k for T_v(k)."),
    repeats: int = typer.Option(20, "--repeats", help="Timed repeats per micro-benchmark."),
    max_prompts: int = typer.Option(PROFILE_MAX_PROMPTS, "--max-prompts", help="Profile the first prompts of the split only."),
    split: str = typer.Option("tune", "--split", help="Prompts to profile: tune (even positions of the workload), holdout (odd), all, or a range A:B; `measure` defaults to the other half."),
    max_new_tokens: MaxNewTokensOption = DEFAULT_MAX_NEW_TOKENS,
    context_lens: str = typer.Option("128,256,512", "--context-lens", help="Context lengths for T_s (the workload's typical one is added)."),
    seed: SeedOption = DEFAULT_SEED,
    label: Optional[str] = typer.Option(None, "--label", help="Free-text label stored with the run."),
    threads: ThreadsOption = DEFAULT_THREADS,
    synthetic_acceptance: SyntheticAcceptanceOption = None,
    trees: bool = typer.Option(False, "--trees", help="Also record token-tree and staged-drafting data (ranks, sibling acceptance, draft widths, staged passes), so tune can search trees."),
    db: DbOption = None,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (run id, timings, acceptance, best configs)."),
) -> None:
    """Measure T_s, T_v(k), prefill, overhead and acceptance; store them; print the predicted best N and θ."""
    opt.check_temperature(temperature)
    rates = opt.parse_rates(synthetic_acceptance)
    drafts = [d.strip() for d in draft.split(",") if d.strip()]
    opt.check_model_names(target, *drafts)  # a mistyped name or a bad workload fails before torch and the models load
    opt.check_workload(workload, split)  # and so does a split without prompts (--split holdout of one prompt)
    from specdec_tune.db import list_runs, open_database
    from specdec_tune.profiler import ProfileSettings, run_profile

    settings = ProfileSettings(
        split=split, device=device, dtype=dtype, forward=forward, cuda_graphs=cuda_graphs, temperature=temperature,
        batch_sizes=opt.int_list(batch_sizes, "--batch-sizes"), k_max=k_max, n_max=n_max, repeats=repeats,
        max_prompts=max_prompts, max_new_tokens=max_new_tokens,
        context_lens=opt.int_list(context_lens, "--context-lens"), seed=seed, label=label,
        threads=opt.parse_threads(threads), synthetic_acceptance=rates, front_prompts=front_prompts, trees=trees,
    )
    database = open_database(db)  # a bad --db fails here, before any model is loaded
    newest = max((r.id for r in list_runs(database, limit=1)), default=0)
    quiet_loading()
    try:
        with progress_bar(console(stderr=True)) as bar:
            result = run_profile(database, target, drafts, workload, settings, Bar(bar))
    except KeyboardInterrupt:
        raise KeyboardInterrupt(kept_by_interrupt(database, newest, target)) from None
    from specdec_tune.tuner.search import check_profile

    check_profile(database, result.run_id)  # the calibration identity and the in-loop bounds, stored with the run
    summary = profile_summary(database, result.run_id)
    summary["telemetry"] = result.telemetry
    if json_out:
        print_json(summary)
        return
    _print_summary(console(), summary)
    console().print(stored_line(summary, db), highlight=False, markup=False)


def stored_line(s: dict, db: str | None = None) -> str:
    """The run's id as the commands that reuse it take it, with the best predicted configuration filled in
    (the first draft's; N = 4 where nothing was predicted)."""
    best = next((d["best"][0] for d in s["drafts"] if d["best"]), None)
    n = best["num_speculative_tokens"] if best else 4
    theta = f" --threshold {best['threshold']:g}" if best and best["threshold"] else ""
    first = next((d["name"] for d in s["drafts"] if d["best"]), None)
    draft = f" --draft {first}" if first and s["drafts"][0]["name"] != first else ""
    from specdec_tune.db import mask_url

    where = f" --db {mask_url(db)}" if db else ""  # a password is never printed
    run = s["run_id"]
    return (f"stored as run {run}: specdec-tune predict --run {run} -N {n}{theta}{draft}{where}; "
            f"specdec-tune measure --run {run} -N {n}{theta}{draft}{where} "
            f"(--run latest names it until a newer run is stored)")
