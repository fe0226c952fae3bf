"""``specdec-tune tune``: the main job. Profile, search a server's space, confirm by measurement,
report the held-out speedup, export.

Parses, calls :func:`specdec_tune.tuner.search.run_tune` and prints (``cli/_tune_report.py``); progress goes
to stderr, the report (or with ``--json`` one object) to stdout.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from specdec_tune.cli import _operator as ops
from specdec_tune.cli._app import app, console, print_json, quiet_loading
from specdec_tune.cli._checks import check_model_names, check_workload, int_list, parse_threads
from specdec_tune.cli._options import (
    DEFAULT_DEVICE,
    DEFAULT_REPEATS,
    DEFAULT_SEED,
    DEFAULT_SERVER,
    DEFAULT_THREADS,
    DEFAULT_TRIALS,
    MODEL_ROOT_HELP,
    TUNE_MAX_NEW_TOKENS,
    TUNE_MAX_PROMPTS,
    DbOption,
    DeviceOption,
    DraftsOption,
    RepeatsOption,
    ServerOption,
    TargetOption,
    ThreadsOption,
    TrialsOption,
    WorkloadOption,
)
from specdec_tune.cli._progress import LazyBar
from specdec_tune.cli._tune_report import print_report, report_json
from specdec_tune.core.errors import InputError
from specdec_tune.core.limits import MAX_SEARCHED_TOKENS

_Storage = Annotated[str | None, typer.Option("--storage", metavar="URL", help=(
    "Optuna storage URL (default: a SQLite file beside --db; PostgreSQL for teams). Never the --db database."))]
_Backend = Annotated[str, typer.Option("--backend", help=(
    "engine (our engine measures; fast) | vllm (vLLM itself calibrates, confirms and holds out, with --server vllm; "
    "one engine start per configuration)."))]
_VllmPython = Annotated[str | None, typer.Option("--vllm-python", metavar="PATH", help=(
    "The vLLM venv's Python (--backend vllm; default $SPECDEC_VLLM_PYTHON; scripts/setup_vllm_env.sh makes it)."))]
_MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", help=(
    "New tokens per prompt (profile and measurements)."))]


_MaxBias = Annotated[Optional[float], typer.Option("--max-bias", help=(
    "--temperature > 0: the fastest configuration whose bias (mean TV between what a verified position emits and "
    "the target, computed at teacher-forced positions) is at most this; Decoding-OPT's over-acceptance ε is searched "
    "next to exact acceptance and the throughput ↔ bias front is printed and stored."))]
_ThresholdKinds = Annotated[str, typer.Option("--threshold-kinds", help=(
    "How θ may apply in the search, comma-separated: per-token, cumulative, adaptive (θ's start and step are "
    "searched; no server runs the last two: exports then hold each server's best per-token configuration)."))]


@app.command()
def tune(
    target: TargetOption,
    drafts: DraftsOption,
    workload: WorkloadOption,
    server: ServerOption = DEFAULT_SERVER,
    trials: TrialsOption = DEFAULT_TRIALS,
    measure_top: int = typer.Option(6, "--measure-top", help="Distinct configurations measured (plus plain decoding)."),
    batch_sizes: str = typer.Option("1,4,16,64", "--batch-sizes", help=(
        "Batch sizes for the per-batch-size N schedule; each band above 1 is measured held out on the batched "
        "engine against plain decoding there (a CI needs 2·B held-out prompts: without one the band speculates 0 "
        "and says why).")),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy; > 0 tunes sampling at this temperature."),
    objectives: str = typer.Option("", "--objectives", help=(
        "Two of throughput, goodput, cost, energy, memory: a Pareto front over them (default: --objective alone).")),
    objective: ops.ObjectiveOption = "throughput",
    slo_tpot_ms: ops.SloTpotOption = None,
    slo_ttft_ms: ops.SloTtftOption = None,
    slo_percentile: ops.SloPercentileOption = 99.0,
    gpu_price: ops.GpuPriceOption = None,
    memory_budget: ops.MemoryBudgetOption = None,
    max_bias: _MaxBias = None,
    threshold_kinds: _ThresholdKinds = "per-token",
    study: Optional[str] = typer.Option(None, "--study", help=(
        "Study name (default: derived from the inputs and the profile run, so the same command resumes the same "
        "study). One process at a time works on a study; a second is refused, naming the first.")),
    storage: _Storage = None,
    n_max: int = typer.Option(MAX_SEARCHED_TOKENS, "--n-max", help=f"Largest N searched (1..{MAX_SEARCHED_TOKENS})."),
    max_prompts: int = typer.Option(TUNE_MAX_PROMPTS, "--max-prompts", help="Tuning prompts profiled."),
    max_new_tokens: _MaxNewTokens = TUNE_MAX_NEW_TOKENS,
    profile_repeats: int = typer.Option(10, "--profile-repeats", help="Timed repeats per micro-benchmark of the profile."),
    measure_prompts: int = typer.Option(8, "--measure-prompts", help="Tuning prompts each confirmation candidate is measured on."),
    heldout_prompts: int = typer.Option(16, "--heldout-prompts", help="Held-out prompts for the final measurement (at least 2: the held-out speedup's CI needs two)."),
    repeats: RepeatsOption = DEFAULT_REPEATS,
    seed: int = typer.Option(DEFAULT_SEED, "--seed", help="Sampler and sampling seed."),
    device: DeviceOption = DEFAULT_DEVICE,
    backend: _Backend = "engine",
    vllm_python: _VllmPython = None,
    export: Optional[str] = typer.Option(None, "--export", metavar="DIR", help="Write the server files for the winner here."),
    formats: str = typer.Option("all", "--formats", help="Export formats: all or a comma list (vllm,sglang,trtllm,llamacpp,hf)."),
    model_root: Optional[str] = typer.Option(None, "--model-root", metavar="DIR", help="With --export: " + MODEL_ROOT_HELP),
    threads: ThreadsOption = DEFAULT_THREADS,
    trees: Optional[str] = typer.Option(None, "--trees", metavar="SHAPES", help="Also search token trees and staged drafting: 'default' or a comma list of chains:M, topk:b1-b2, sequoia:B, eagle:K:B (depth = N)."),
    db: DbOption = None,
    json_out: bool = typer.Option(False, "--json", help="End with one JSON object for the winner."),
) -> None:
    """Find the best speculative configuration for a server (fastest, or best by --objective under a latency
    SLO, a price or a memory budget), confirmed on held-out prompts."""
    objective_list, names = _checked(objectives, temperature, target, drafts)
    objective = _single(objectives) if objective == "throughput" and _single(objectives) else objective
    prompts = check_workload(workload)
    from specdec_tune.tuner.search import TuneRequest, check_prompts

    req = TuneRequest(
        target=target, drafts=names, workload=workload, server=server, trials=trials, measure_top=measure_top,
        batch_sizes=int_list(batch_sizes, "--batch-sizes"), temperature=temperature, objectives=objective_list,
        study=study, n_max=n_max, objective=objective, slo_tpot_ms=slo_tpot_ms, slo_ttft_ms=slo_ttft_ms,
        slo_percentile=slo_percentile, gpu_price=gpu_price, memory_budget_gib=memory_budget, max_prompts=max_prompts,
        max_new_tokens=max_new_tokens, profile_repeats=profile_repeats, measure_prompts=measure_prompts,
        heldout_prompts=heldout_prompts, repeats=repeats, seed=seed, device=device, backend=backend,
        vllm_python=vllm_python, threads=parse_threads(threads), trees=tree_list(trees),
        threshold_kinds=tuple(k.strip() for k in threshold_kinds.split(",") if k.strip()), max_bias=max_bias)
    check_prompts(req, prompts)  # a job its prompt counts cannot finish is refused before the database opens
    _run(req, db, storage, formats, (export, _model_root(model_root, export)), json_out)


def _run(req, db: str | None, storage: str | None, formats: str, to: tuple[str | None, str | None],
         json_out: bool) -> None:
    """Check the storage and export folder, run the job, print the report."""
    from specdec_tune.db import default_storage_url, open_database, resolve_url
    from specdec_tune.tuner.search import check_storage, run_tune

    db_url = resolve_url(db)
    storage_url = storage or default_storage_url(db_url)
    check_storage(storage_url, db_url)
    export, model_root = to  # --export DIR, --model-root DIR
    fmts = _export_formats(formats, export)
    database = open_database(db_url)
    quiet_loading()
    try:
        with LazyBar(console(stderr=True)) as progress:
            report = run_tune(database, req, storage_url, progress, export=(export, fmts, model_root) if export else None)
    except KeyboardInterrupt as exc:  # the study is named once the profile is (TuneInterrupted); before: none
        study = getattr(exc, "study", None)
        raise KeyboardInterrupt(f"{0 if study is None else _kept_trials(storage_url, study)} trials kept; "
                                "re-run the same command to resume") from None
    if json_out:
        print_json(report_json(report))
        return
    print_report(console(), report)


def _single(objectives: str) -> str | None:
    """``--objectives X`` alone names the objective (as ``--objective X``)."""
    names = [o.strip() for o in objectives.split(",") if o.strip()]
    return names[0] if len(names) == 1 else None


def _kept_trials(storage_url: str, study: str) -> int | str:
    """Completed trials of ``study`` after an interrupt (0 before the search began; "the" when unreadable)."""
    from specdec_tune.db import sqlite_file
    from specdec_tune.tuner.search import completed_trials

    path = sqlite_file(storage_url)
    if path is not None and not path.exists():  # interrupted before the storage was made: do not make it now
        return 0
    try:
        return completed_trials(storage_url, study)
    except Exception:  # noqa: BLE001 - the interrupt matters more than the count
        return "the completed"


def _checked(objectives: str, temperature: float, target: str, drafts: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(objectives, draft names), checked before anything heavy is imported: a mistyped model name fails
    before torch and the models load."""
    objective_list = _objectives(objectives)
    _check_temperature(temperature)
    names = tuple(d.strip() for d in drafts.split(",") if d.strip())
    check_model_names(target, *names)
    return objective_list, names


def _objectives(objectives: str) -> tuple[str, ...]:
    """``--objectives``: empty (the objective alone), one, or two distinct names for a Pareto front."""
    from specdec_tune.tuner.model import OBJECTIVES

    objective_list = tuple(o.strip() for o in objectives.split(",") if o.strip())
    if len(objective_list) > 2 or len(set(objective_list)) != len(objective_list) \
            or any(o not in OBJECTIVES for o in objective_list) or objective_list == ("memory",):
        raise InputError(f"--objectives must be one objective or two distinct of {', '.join(OBJECTIVES)} (a Pareto "
                         f"front; memory only in a pair), got {objectives!r}")
    return () if len(objective_list) == 1 else objective_list


def _check_temperature(temperature: float) -> None:
    if not 0.0 <= temperature:  # NaN is refused too
        raise InputError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")


def _export_formats(formats: str, export: str | None) -> list[str]:
    """The --formats list; with --export, an unknown format or a folder that cannot be written fails
    before anything is measured.

    "all" is passed through: the exporters then skip a server that cannot express the winner and say
    why in the README, while a format named explicitly must express it.
    """
    fmts = [f.strip() for f in formats.split(",") if f.strip()]
    if export:
        from specdec_tune.cli.export import check_out_folder
        from specdec_tune.tuner.servers import resolve_formats

        resolve_formats(fmts)
        check_out_folder(Path(export), "--export")
    return fmts


def _model_root(model_root: str | None, export: str | None) -> str | None:
    """--model-root, which only --export uses."""
    from specdec_tune.tuner.servers import check_root

    if model_root is not None and not export:
        raise InputError("--model-root goes with --export DIR (it rewrites the model paths of the files written)")
    return check_root(model_root)


def tree_list(text: str | None) -> tuple[str, ...]:
    """``--trees``: ``default`` (the default grid), a comma list of tree specs, or nothing."""
    if not text:
        return ()
    if text.strip() == "default":
        from specdec_tune.tuner.search import DEFAULT_TREES

        return DEFAULT_TREES
    return tuple(t.strip() for t in text.split(",") if t.strip())
