"""``specdec-tune tune``: the main job. Profile, search a server's space, confirm by measurement,
report the held-out speedup, export.

Parses, calls :func:`specdec_tune.tuner.search.run_tune` and prints; progress goes to stderr, the
report (or with ``--json`` one object) to stdout.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specdec_tune.cli import _operator as ops
from specdec_tune.cli._app import THROUGHPUT_NOTE, app, console, print_json, quiet_loading
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


def _fmt_ci(ci) -> str:
    return "–" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _rate(x) -> str:
    return "–" if x is None else f"{x:.1f}"


def report_json(report) -> dict:
    """The ``--json`` object: the winner's configuration and measured speedup first, then the evidence."""
    r = report.result
    c = r.candidate
    files = file_cells(r, report.not_written)
    return {
        "drafter": c.drafter, "num_speculative_tokens": c.num_speculative_tokens, "threshold": c.threshold,
        "threshold_rule": c.threshold_rule, "threshold_kind": c.threshold_kind,
        "threshold_step": c.threshold_step if c.threshold_kind == "adaptive" else None,
        "acceptance": c.acceptance, "epsilon": c.epsilon, "bias": r.bias, "bias_front": r.pareto,
        "schedule": c.schedule, "server": r.server,
        "measured_tokens_per_s": r.measured_tokens_per_s, "predicted_tokens_per_s": r.predicted_tokens_per_s,
        "predicted_basis": r.predicted_basis, "baseline_tokens_per_s": r.baseline_tokens_per_s, "speedup": r.speedup,
        "speedup_ci": list(r.speedup_ci) if r.speedup_ci else None, "heldout": r.heldout, "study": report.study,
        "exports": report.exports,
        "per_batch_size": {str(b): n for b, n in r.per_batch_size.items()},
        "best_per_server": {srv: {**entry, **({"file_carries": files[srv]} if srv in files else {})}
                            for srv, entry in r.best_per_server.items()},
        "not_written": report.not_written, "storage": report.storage, "run_id": report.run_id,
        "profiled": report.profiled, "completed_trials": report.completed_trials, "new_trials": report.new_trials,
        "trial_counts": report.trial_counts(),
        "sampler": report.sampler, "confirmation": report.confirmation, "pareto": report.pareto,
        "notes": report.notes, "throughput": THROUGHPUT_NOTE,
        "backend": "vllm" if report.server_report else "engine", "server_report": report.server_report,
        "threads": report.threads, "objective": r.objective,
        "per_batch_size_reasons": {str(b): why for b, why in r.per_batch_size_reasons.items()},
    }


def _print(console: Console, report) -> None:
    r = report.result
    c = r.candidate
    where = "held-out prompts" if r.heldout else "tuning prompts"
    console.print(f"[bold]winner[/bold] ({r.server}): {c.label()}", highlight=False)
    console.print(f"  measured on {where}: {_rate(r.measured_tokens_per_s)} tokens/s vs plain decoding "
                  f"{_rate(r.baseline_tokens_per_s)} tokens/s: speedup {r.speedup:.2f}× (95% CI {_fmt_ci(r.speedup_ci)}); "
                  f"predicted {_rate(r.predicted_tokens_per_s)} tokens/s{_for(r.predicted_basis)}", highlight=False)
    if r.per_batch_size:
        console.print(f"  best N per batch size ({r.per_batch_size_source}; 0 = do not speculate): "
                      + ", ".join(f"B={b}: {n}" for b, n in r.per_batch_size.items()), highlight=False)
        for line in ops.reason_lines(r.per_batch_size_reasons):
            console.print(line, highlight=False)
    for line in ops.objective_lines(r.objective):
        console.print(line, highlight=False)
    if report.threads:
        from specdec_tune.profiler import ThreadChoice

        console.print("  " + ThreadChoice(**report.threads).text(), highlight=False, markup=False)
    if report.server_report:
        _print_server(console, report.server_report)
    table = Table(title="measured on the tuning prompts" + (" (vLLM, one engine start each)" if report.server_report
                                                             else " (interleaved)"), title_justify="left")
    for col in ("configuration", "measured tokens/s", "95% CI", "speedup (measured, median over passes)",
                "predicted tokens/s", "servers"):
        table.add_column(col)
    for row in report.confirmation:
        speedup = row.get("measured_speedup")
        table.add_row(("→ " if row["winner"] else "  ") + row["label"], _rate(row["measured_tokens_per_s"]),
                      _fmt_ci(row["measured_ci"]), "–" if speedup is None else f"{speedup:.2f}×",
                      _rate(row["predicted_tokens_per_s"]), ", ".join(row["servers"]))
    console.print(table)
    console.print(bases_line(report.confirmation), highlight=False)
    if r.best_per_server:
        _print_servers(console, r, report.not_written)
    for fmt, why in report.not_written.items():
        if fmt not in r.best_per_server:
            console.print(f"note: {fmt} files not written: {why}", highlight=False, markup=False)
    if r.bias:
        b = r.bias
        measured = "" if b.get("measured_bias") is None else f", measured {b['measured_bias']:.4f}"
        console.print(f"  bias {b['bias']:.4f} per verified position (predicted: {b['label']}{measured}; budget "
                      f"{b['budget'] if b['budget'] is not None else '–'})", highlight=False)
    if r.pareto:
        console.print("throughput ↔ bias front (predicted; stored with the study's result): " + "; ".join(
            f"{p['label']}: {p['predicted_tokens_per_s']:.1f} tokens/s, bias {p['bias']:.4f}" for p in r.pareto),
            highlight=False)
    elif len(report.pareto) > 1:
        names = report.pareto[0].get("objectives") or ["throughput", "memory"]
        console.print(f"Pareto front (predicted {' vs '.join(names)}): " + "; ".join(
            f"{p['label']}: " + ", ".join(ops._value(n, p.get('values', {}).get(n)) for n in names)
            for p in report.pareto), highlight=False)
    console.print(f"study {report.study!r} in {report.storage} ({report.sampler}): {trials_text(report)}; profile run "
                  f"{report.run_id} ({'new' if report.profiled else 'reused'}; `--run {report.run_id}` names it for "
                  "predict, measure and export)", highlight=False)
    for note in report.notes:
        console.print(f"note: {note}", highlight=False)
    for path in report.exports:
        console.print(f"exported: {path}", highlight=False)
    console.print(f"throughput is {THROUGHPUT_NOTE}", highlight=False)


def file_cells(r, not_written: dict[str, str]) -> dict[str, str]:
    """Each decided server's "file carries" cell: the configuration its file carries, or ``not written:
    <why>`` for a format the export asked for and could not write."""
    from specdec_tune.tuner.model import decisions

    return {srv: f"not written: {not_written[srv]}" if srv in not_written else d.shipped.label()
            for srv, d in decisions(r).items()}


def _for(basis: str | None) -> str:
    """`` (for <basis>)``: what a predicted rate was computed for, where the result says."""
    return f" (for {basis})" if basis else ""


def bases_line(rows: list[dict]) -> str:
    """What the predicted column of a table of measured configurations was computed for, grouped (the
    rows' predictions differ from the search's and from the held-out ones: other prompts, other passes)."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(row.get("predicted_basis") or "–", []).append(row["label"])
    if len(groups) == 1:
        return f"  predicted tokens/s above: for {next(iter(groups))}"
    return "  predicted tokens/s above: " + "; ".join(f"{', '.join(labels)}: for {basis}"
                                                      for basis, labels in groups.items())


def trials_text(report) -> str:
    """The study's trial counts, adding up: completed = run now + earlier (or by another process); the
    trials run now that did not complete are counted apart."""
    c = report.trial_counts()
    text = (f"{c['completed']} completed trials = {c['completed_new']} run now + {c['completed_other']} from earlier "
            "runs or other processes")
    for key, end in (("pruned_new", "pruned (the model cannot predict them from this profile, or they exceed the "
                                    "memory budget)"), ("failed_new", "failed")):
        if c[key]:
            text += f"; {c[key]} more trial{'s' if c[key] > 1 else ''} run now {'were' if c[key] > 1 else 'was'} {end}"
    return text


def _print_servers(console: Console, r, not_written: dict[str, str]) -> None:
    """Each server's measured pick and what its file carries (the decision and why), or why it was not written."""
    from specdec_tune.tuner.model import decisions

    decided = decisions(r)
    files = file_cells(r, not_written)
    table = Table(title="each server: its best measured inside its space, held out against plain decoding "
                        "(interleaved); the file carries it when the CI's lower bound is >= 1",
                  title_justify="left")
    for col in ("server", "configuration", "predicted tokens/s", "measured tokens/s", "speedup (measured, 95% CI)",
                "file carries"):
        table.add_column(col)
    for srv, d in decided.items():
        speedup = "–" if d.speedup is None else f"{d.speedup:.2f}× {_fmt_ci(d.speedup_ci)}"
        table.add_row(srv, d.candidate.label(), _rate(d.predicted_tokens_per_s), _rate(d.measured_tokens_per_s),
                      speedup, Text(files[srv]))
    console.print(table)
    console.print(bases_line([{"label": srv, "predicted_basis": d.predicted_basis} for srv, d in decided.items()]),
                  highlight=False)
    for srv, d in decided.items():
        if not d.speculates and not d.candidate.is_plain:
            console.print(f"note: {srv} carries plain decoding: {d.reason}", highlight=False)


def _print_server(console: Console, sr: dict) -> None:
    """Per batch size on the held-out prompts, measured on vLLM: the schedule as a whole, the winner's
    constant N and plain decoding."""
    table = Table(title="measured on vLLM, held-out prompts, per batch size (tokens/s, all requests)",
                  title_justify="left")
    for col in ("B", "schedule N", "schedule", "constant N (winner)", "plain", "schedule ÷ plain", "constant ÷ plain"):
        table.add_column(col)
    for row in sr["heldout"]:
        sch, const, plain = row.get("schedule"), row.get("constant"), row["plain"]
        cell = lambda x: "–" if not x else f"{x['measured_tokens_per_s']:.1f} {_fmt_ci(x['ci95'])}"  # noqa: E731
        ratio = lambda x: "–" if not x else f"{x['speedup']:.2f}× {_fmt_ci(x['speedup_ci'])}"  # noqa: E731
        table.add_row(str(row["batch_size"]), str(row["schedule_n"]), cell(sch) if sch else "(= constant)",
                      cell(const), cell(plain), ratio(sch), ratio(const))
    console.print(table)
    close = sr.get("close_calls") or []
    if close:
        ci = lambda r: f"95% CI {r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}" if r["ci95"] else "no 95% CI: one prompt"  # noqa: E731
        console.print(f"note: the best measured, {sr.get('best_measured')}, is not measurably faster than " + "; ".join(
            f"{r['config']} (ratio {r['ratio']:.2f}, {ci(r)})" for r in close)
            + " on the tuning prompts; among these the calibrated model chose the winner where it interpolates "
            "(more --measure-prompts would let the measurement decide)", highlight=False)
    for b, by_n in sr.get("schedule_measured", {}).items():
        console.print(f"schedule at B={b} chosen from measured tokens/s (tuning prompts): " + ", ".join(
            f"{'plain' if n == '0' else 'N=' + n} {v:.1f}" for n, v in sorted(by_n.items(), key=lambda x: int(x[0]))),
            highlight=False)
    model = sr["server_model"]["times"]
    console.print("server model (calibrated on vLLM, tuning prompts): " + "; ".join(
        f"B={b}: step {t['step_s'] * 1e3:.2f} ms" + "".join(
            f", {k} +{t['spec_step_s'][k] * 1e3:.2f} ms/step +{t['per_draft_token_s'][k] * 1e3:.2f} ms/draft token"
            for k in t["spec_step_s"]) for b, t in model.items()), highlight=False)


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
    batch_sizes: str = typer.Option("1,4,16,64", "--batch-sizes", help="Batch sizes for the per-batch-size N schedule."),
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
    _print(console(), report)


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
