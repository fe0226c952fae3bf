"""``specdec-tune zoo``: list the bundled mini models, rerun their training recipe."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from specdec_tune.cli._app import app, console, print_json, set_threads
from specdec_tune.cli._checks import parse_threads
from specdec_tune.cli._options import DEFAULT_FORWARD, DEFAULT_THREADS, ForwardOption, ThreadsOption
from specdec_tune.core.errors import InputError, NotFoundError

zoo_app = typer.Typer(help="The bundled mini model family (target + drafts) and its training recipe.",
                      no_args_is_help=True)
app.add_typer(zoo_app, name="zoo")

_CONTEXT_TOKENS = 128


def _measure_ms(models: list, new_tokens: tuple[int, ...], repeats: int, forward: str,
                threads: str) -> tuple[dict[str, dict[str, float]], Any]:
    """Median ms per forward of ``new_tokens`` tokens after a 128-token KV cache for each model, measured
    live the way the model card measures it (:func:`specdec_tune.training.forward_samples`),
    with the thread count ``bench`` and ``profile`` choose for the bundled target and its first draft
    (``--threads auto``: calibrated, never more than the idle CPUs; :mod:`specdec_tune.profiler.threads`).

    Returns:
        (name -> {token count: ms}, the thread choice).
    """
    import statistics

    import torch
    import transformers

    from specdec_tune.engine import load_model
    from specdec_tune.training import forward_samples

    transformers.utils.logging.disable_progress_bar()  # keep stderr for real messages
    loaded = {m.name: load_model(str(m.path), "cpu", "float32", forward) for m in models}
    target = next((m.name for m in models if m.role == "target"), models[0].name)
    draft = next((m.name for m in models if m.role != "target"), None)
    choice = set_threads(threads, loaded[target], loaded[draft] if draft else None)
    out = {}
    with torch.inference_mode():
        for name, model in loaded.items():
            lean = model.forward == "lean"
            out[name] = {str(k): statistics.median(forward_samples(model.hf, k, repeats=repeats, warmup=3,
                                                                   context=_CONTEXT_TOKENS, lean=lean))
                         for k in new_tokens}
    return out, choice


def _workload_rows() -> list[dict[str, Any]]:
    """The bundled workloads: name, prompts, categories and file (the ``--workload`` names)."""
    from specdec_tune.engine import list_workloads, load_workload, resolve_workload

    rows = []
    for name in list_workloads():
        prompts = load_workload(name)
        rows.append({"name": name, "prompts": len(prompts), "path": str(resolve_workload(name)),
                     "categories": sorted({p.category for p in prompts if p.category})})
    return rows


@zoo_app.command("list")
def zoo_list(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of the models instead of the tables."),
    measure: bool = typer.Option(True, "--measure/--no-measure",
                                 help="Time each model live (a few seconds); otherwise show the build-time numbers."),
    repeats: int = typer.Option(10, min=1, help="Timed forwards per model and token count."),
    forward: ForwardOption = DEFAULT_FORWARD,
    threads: ThreadsOption = DEFAULT_THREADS,
) -> None:
    """Show each bundled model (name, role, path, parameters, layers, ms per forward, measured with the
    thread count bench and profile use) and each bundled workload (name, prompts)."""
    from specdec_tune.engine import list_models, read_manifest

    parse_threads(threads)
    models = list_models()
    if not models:
        raise NotFoundError("no bundled models found (the zoo is not built; run `specdec-tune zoo train`)")
    built = {m["name"]: m for m in read_manifest()["models"]}
    measured, choice = _measure_ms(models, (1, 8), repeats, forward, threads) if measure else ({}, None)
    rows = []
    for m in models:
        entry = built[m.name]
        # The build's most telling timing: the engine's forward on 1 thread when the card has it.
        stored = next((entry[key] for key in ("ms_per_forward_engine_1_thread", "ms_per_forward_1_thread",
                                               "ms_per_forward_at_training_time") if key in entry), {})
        row = {"name": m.name, "role": m.role, "path": str(m.path), "parameters": m.parameters,
               "layers": m.layers, "hidden_size": m.hidden_size,
               # measured at build on the held-out windows (training.assess): a draft's or a head's step 1
               "greedy_agreement": entry.get("quality", {}).get("greedy_agreement"),
               "ms_per_forward_at_build": {k: v["median"] for k, v in stored.items()}}
        if measure:
            row.update(ms_per_forward_measured=measured[m.name], forward=forward, threads=choice.to_dict())
        rows.append(row)
    if as_json:
        print_json(rows)
        return
    _print_tables(rows, measure, forward, choice)


def _print_tables(rows: list[dict[str, Any]], measure: bool, forward: str, choice: Any) -> None:
    from rich.table import Table

    label = (f"measured now, {forward} forward, {choice.threads} thread{'s' * (choice.threads != 1)} "
             f"({choice.source}): the count bench and profile choose" if measure else "measured at build time")
    table = Table(title=f"bundled models (ms per forward with a {_CONTEXT_TOKENS}-token KV cache, {label})")
    for col in ("name", "role", "params", "layers", "ms 1 tok", "ms 8 tok", "agreement"):
        table.add_column(col, no_wrap=True)
    table.add_column("path", overflow="fold")
    for r in rows:
        ms = r["ms_per_forward_measured"] if measure else r["ms_per_forward_at_build"]
        agree = "–" if r["greedy_agreement"] is None else f"{r['greedy_agreement']:.3f}"
        table.add_row(r["name"], r["role"], f"{r['parameters'] / 1e6:.2f}M", str(r["layers"]),
                      f"{ms.get('1', float('nan')):.2f}", f"{ms.get('8', float('nan')):.2f}", agree, r["path"])
    console().print(table)
    console().print("  agreement: greedy agreement with the target on held-out text, measured when the zoo was built "
                    "(a head's: its first chain step; MODEL_CARD.md has every step)")
    workloads = Table(title="bundled workloads (--workload NAME; or a JSONL file of your own)")
    for col in ("name", "prompts", "categories"):
        workloads.add_column(col, no_wrap=True)
    workloads.add_column("path", overflow="fold")
    for w in _workload_rows():
        workloads.add_row(w["name"], str(w["prompts"]), ", ".join(w["categories"]) or "–", w["path"])
    console().print(workloads)


@zoo_app.command("shapes")
def zoo_shapes(as_json: bool = typer.Option(False, "--json", help="Print a JSON list of objects instead of a table.")) -> None:
    """Show the model shapes (``--target``/``--draft shape:<name>``): published configs with seeded random weights,
    their parameters and the memory they need here."""
    import torch

    from specdec_tune.engine import available_memory, get_shape, memory_needed, parameter_count, shape_names

    free = available_memory("cpu")
    rows = []
    for name in shape_names():
        shape = get_shape(name)
        need = {dt: memory_needed(shape, getattr(torch, dt), "cpu") for dt in ("float32", "bfloat16")}
        rows.append({"name": name, "family": shape.family, "published": shape.published, "source": shape.source,
                     "parameters": parameter_count(shape), "tokenizer_vocab_size": shape.tokenizer_vocab_size,
                     "cpu_memory_gib": {dt: n / 2**30 for dt, n in need.items()},
                     "fits_cpu_now": {dt: free is None or n <= free for dt, n in need.items()},
                     "weights": "seeded random (acceptance is meaningless: pair with --synthetic-acceptance)"})
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    avail = "unknown" if free is None else f"{free / 2**30:.1f} GiB"
    table = Table(title=f"model shapes (random weights; CPU memory free now: {avail})")
    for col in ("name", "params", "GiB fp32", "GiB bf16", "config"):
        table.add_column(col, overflow="fold")
    for r in rows:
        mem = {dt: f"{g:.1f}" + ("" if r["fits_cpu_now"][dt] else " (no room)") for dt, g in r["cpu_memory_gib"].items()}
        table.add_row(r["name"], f"{r['parameters'] / 1e9:.2f} B", mem["float32"], mem["bfloat16"], r["source"])
    console().print(table)


@zoo_app.command("train")
def zoo_train(
    out: Path = typer.Option(Path("specdec_zoo"), "--out", help="Folder to write models, workloads, card, log."),
    quick: bool = typer.Option(False, "--quick", help="Tiny smoke version (a minute or two), not a usable zoo."),
    seed: int = typer.Option(0, "--seed", help="Seed of data order, initialisation and prompt choice."),
    force: bool = typer.Option(False, "--force", help="Write into a folder that already holds a zoo."),
) -> None:
    """Rerun the zoo recipe (about 70 minutes on 2 CPU cores; --quick for a smoke run)."""
    if (out / "zoo.json").exists() and not force:
        raise InputError(f"--out {str(out)!r} already holds a zoo (zoo.json); pass --force to overwrite it")
    from specdec_tune.training import run_recipe

    manifest = run_recipe(out, quick=quick, seed=seed)
    typer.echo(f"wrote {len(manifest['models'])} models and {len(manifest['workloads'])} workloads to {out}")


@zoo_app.command("refine")
def zoo_refine(
    out: Path = typer.Option(..., "--out", help="A folder written by `zoo train` (holds zoo.json)."),
    quick: bool = typer.Option(False, "--quick", help="The smoke-sized stage (for a --quick zoo)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the prompts and batch order."),
) -> None:
    """Rerun only the recipe's on-policy stage (drafts distilled on the target's own greedy text,
    about 10 minutes), then re-measure the zoo and rewrite its card."""
    if not (out / "zoo.json").is_file():
        raise InputError(f"--out {str(out)!r} holds no zoo.json; build one with `specdec-tune zoo train`")
    from specdec_tune.training import refine

    refine(out, quick=quick, seed=seed)
    typer.echo(f"refined the drafts in {out / 'models'}; rewrote {out / 'zoo.json'} and {out / 'MODEL_CARD.md'}")


@zoo_app.command("evaluate")
def zoo_evaluate(
    out: Path = typer.Option(..., "--out", help="A folder written by `zoo train` (holds zoo.json)."),
    repeats: int = typer.Option(30, min=2, help="Timed forwards per model, token count and thread setting."),
) -> None:
    """Rerun only the recipe's final step (held-out quality, latency, card) on a built zoo."""
    if not (out / "zoo.json").is_file():
        raise InputError(f"--out {str(out)!r} holds no zoo.json; build one with `specdec-tune zoo train`")
    from specdec_tune.training import reassess

    reassess(out, repeats=repeats)
    typer.echo(f"rewrote {out / 'zoo.json'} and {out / 'MODEL_CARD.md'}")


@zoo_app.command("train-eagle")
def zoo_train_eagle(
    out: Path = typer.Option(..., "--out", help="A folder written by `zoo train` (holds zoo.json)."),
    quick: bool = typer.Option(False, "--quick", help="The smoke-sized stage (for a --quick zoo)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data, the initialisation and the batch order."),
    repeats: int = typer.Option(30, min=2, help="Timed forwards per model in the re-measurement."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1,
                                            help="Training steps (default: the recipe's, 1000; --quick: 4)."),
    sequences: Optional[int] = typer.Option(None, "--sequences", min=1,
                                            help="Target continuations generated as training data (default 768)."),
    threads: int = typer.Option(0, "--threads", min=0, max=64,
                                help="Intra-op threads: 0 picks 1 or 2 by measured step time; on a loaded machine "
                                     "1 avoids two threads waiting at barriers for a busy core."),
) -> None:
    """Rerun only the recipe's EAGLE-3 stage: a feature head for the target, trained by the training-time
    test for a fixed number of steps (about 30 minutes on 2 quiet cores), saved where vLLM and SGLang load
    it, then re-measure the zoo and rewrite its card."""
    if not (out / "zoo.json").is_file():
        raise InputError(f"--out {str(out)!r} holds no zoo.json; build one with `specdec-tune zoo train`")
    from specdec_tune.training import train_eagle

    manifest = train_eagle(out, quick=quick, seed=seed, repeats=repeats, max_steps=max_steps, sequences=sequences,
                           threads=threads or None)
    head = next(m for m in manifest["models"] if m["role"] == "eagle3")
    typer.echo(f"trained {head['name']} into {out / head['path']}; rewrote {out / 'zoo.json'} and {out / 'MODEL_CARD.md'}")
