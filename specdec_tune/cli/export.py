"""``specdec-tune export``: write a tuned configuration in the files each server reads.

Parses, calls :func:`specdec_tune.tuner.servers.write_formats` and prints the paths written (and why
a format asked under ``all`` was not). The configuration comes from a finished ``tune`` study
(``--study``) or from a stored profile run (``--run``, numbers predicted).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from specdec_tune.cli._app import app, print_json
from specdec_tune.cli._options import MODEL_ROOT_HELP, DbOption
from specdec_tune.core.errors import InputError

FORMAT_HELP = "vllm | sglang | trtllm | llamacpp | hf | all (comma-separated for several)."


def check_out_folder(out: Path, flag: str = "--out") -> None:
    """Refuse an output folder that cannot be created or written, before anything is written.

    Raises:
        InputError: one line naming the folder and why (a file in the way, a read-only folder above it).
    """
    path = Path(os.path.abspath(Path(out).expanduser()))
    above = next(p for p in (path, *path.parents) if p.exists())
    if above == path and not path.is_dir():
        raise InputError(f"{flag} {out} exists and is not a folder; give a folder to write the files in")
    if not above.is_dir():
        raise InputError(f"{flag} {out} cannot be created: {above} is a file, not a folder; give another folder")
    from specdec_tune.db import pseudo_filesystem

    kernel = pseudo_filesystem(above)
    if kernel is not None:
        raise InputError(f"{flag} {out} cannot be created: {above} is on the {kernel} file system, which exposes the "
                         "kernel, not files; give a folder on a disk")
    if not os.access(above, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {out} cannot be {'written' if above == path else 'created'}: {above} is read-only; "
                         "give a folder you can write")


def written_or_refused(write, out: Path, flag: str = "--out"):
    """``write()``; an operating-system refusal (say a kernel file system such as /proc, where even root
    cannot create folders) becomes one line naming ``out``."""
    try:
        return write()
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(out) else ""
        raise InputError(f"{flag} {out} cannot be written: {exc.strerror or exc}{where}; give a folder you can write") \
            from None


def _storage_url(storage: str | None, db: str | None) -> str:
    """--storage, else $SPECDEC_STORAGE, else where `tune` puts studies (a SQLite file beside --db)."""
    from specdec_tune.db import default_storage_url, resolve_url

    given = (storage or "").strip() or os.environ.get("SPECDEC_STORAGE", "").strip()
    if given:
        return given
    return default_storage_url(resolve_url(db))


@app.command()
def export(
    study: Optional[str] = typer.Option(None, "--study", metavar="NAME", help="A finished `tune` study."),
    storage: Optional[str] = typer.Option(None, "--storage", metavar="URL",
                                          help="Optuna storage of --study (default: tune's, beside --db)."),
    run_given: Optional[str] = typer.Option(None, "--run", metavar="ID|latest", help=(
        "A stored profile run, or 'latest' (the newest completed one); numbers predicted.")),
    config: Optional[str] = typer.Option(None, "--config", metavar="N,θ[,DRAFTER]",
                                         help="With --run: the configuration (default: the model's best)."),
    fmt: str = typer.Option(..., "--format", metavar="FORMAT", help=FORMAT_HELP),
    out: Path = typer.Option(..., "--out", metavar="DIR", help="Folder to write (created; files replaced)."),
    model_root: Optional[str] = typer.Option(None, "--model-root", metavar="DIR", help=MODEL_ROOT_HELP),
    db: DbOption = None,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (paths per format)."),
) -> None:
    """Export the tuned configuration for vLLM, SGLang, TensorRT-LLM, llama.cpp or HF transformers."""
    from specdec_tune.tuner.servers import check_root, resolve_formats, write_formats

    if (study is None) == (run_given is None):
        raise InputError("give exactly one of --study NAME or --run ID")
    if config is not None and run_given is None:
        raise InputError("--config goes with --run (a study's configuration is its tuned winner)")
    formats = fmt.split(",")
    resolve_formats(formats)  # an unknown format is refused before any database is opened
    model_root = check_root(model_root)
    check_out_folder(out)
    if study is not None:
        from specdec_tune.tuner.servers import result_from_study

        result = result_from_study(study, _storage_url(storage, db))
    else:
        from specdec_tune.cli._checks import run_id
        from specdec_tune.db import open_database
        from specdec_tune.tuner.servers import result_from_run

        with open_database(db) as database:
            run = run_id(database, run_given)
            result = result_from_run(database, run, config)
    written = written_or_refused(lambda: write_formats(result, formats, out, model_root), out)
    carries = written.carries
    if json_out:
        print_json({"config": result.candidate.label(), "carries": carries, "not_written": written.not_written,
                    "exports": {k: [str(p) for p in v] for k, v in written.paths.items()}})
        return
    typer.echo(f"exported {result.candidate.label()} ({'study ' + study if study else f'run {run}'}):")
    for name, paths in written.paths.items():
        for p in paths:
            typer.echo(f"  {name}: {p}" + (f" ({carries[name]})" if carries.get(name, result.candidate.label())
                                           != result.candidate.label() else ""))
    for name, why in written.not_written.items():
        typer.echo(f"  {name}: not written: {why}")
