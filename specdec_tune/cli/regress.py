"""``specdec-tune regress``: nightly regression benchmarks.

Exit codes: 0 nothing regressed (suspicious cells included: one flagged run is not a regression),
1 a regression (flagged in two consecutive runs) or a correctness failure, 2 an error (bad suite
file, model, database: one line on stderr), 3 no verdict possible (no comparable baseline, which
makes this run the baseline; too few samples). ``--retune`` (tuning drift) is informational: it
never changes the exit code.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specdec_tune.cli._app import app, console, print_json, quiet_loading
from specdec_tune.cli._options import DbOption, SuiteOption, VllmPythonOption
from specdec_tune.core.errors import InputError

_Baseline = Annotated[str, typer.Option("--baseline", help=(
    "auto (newest passing run with a comparable environment), latest (the previous run) or a run id."))]
_Calibrate = Annotated[bool, typer.Option("--calibrate", help=(
    "Run the suite against itself (A/A) several times and store each metric's spread (the noise floor behind "
    "the minimum detectable change)."))]
_Retune = Annotated[bool, typer.Option("--retune", help=(
    "Tuning drift: re-tune each benchmark's study on this machine now (fresh profile, warm-started from the study) "
    "and report whether the best configuration moved and what the old one loses now. Informational: the exit "
    "code is unchanged."))]
_RetuneTrials = Annotated[int, typer.Option("--retune-trials", help=(
    "Trials of each re-tune, the old study's best ones (enqueued first) included."))]


class _Bar:
    """The profiler's progress sink on a rich bar (stderr)."""

    def __init__(self, bar: Progress) -> None:
        self.bar, self.task = bar, None

    def stage(self, name: str, total: int) -> None:
        self.task = self.bar.add_task(name, total=max(total, 1))

    def advance(self, steps: int = 1) -> None:
        if self.task is not None:
            self.bar.advance(self.task, steps)


def _write(path: Optional[Path], text: str) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


@app.command()
def regress(
    suite: SuiteOption = None,
    baseline: _Baseline = "auto",
    db: DbOption = None,
    report_md: Optional[Path] = typer.Option(None, "--report-md", help="Write the markdown summary here."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write JUnit XML here (one test case per benchmark and metric)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of the summary."),
    calibrate: _Calibrate = False,
    rounds: Optional[int] = typer.Option(None, "--rounds", help="A/A rounds of --calibrate (default: the suite's rules.calibrate_runs)."),
    retune: _Retune = False,
    retune_trials: _RetuneTrials = 60,
    vllm_python: VllmPythonOption = None,
) -> int:
    """Run a regression suite, compare with a baseline, say what regressed and why.

    Exit codes: 0 nothing regressed, 1 regression, 2 error, 3 no verdict possible (no comparable
    baseline: this run becomes the baseline; too few samples).
    """
    from specdec_tune.db import open_database
    from specdec_tune.tuner.regress import default_suite_path, load_suite, to_json, to_junit, to_markdown

    if baseline not in ("auto", "latest") and not baseline.isdigit():
        raise InputError(f"--baseline must be auto, latest or a run id, got {baseline!r}")
    if retune_trials < 1:
        raise InputError(f"--retune-trials must be >= 1, got {retune_trials}")
    if rounds is not None and not 2 <= rounds <= 50:
        raise InputError(f"--rounds must be in 2..50, got {rounds}")
    spec = load_suite(suite or default_suite_path())  # a broken suite fails before anything runs
    database = open_database(db)
    quiet_loading()
    import torch

    if spec.threads:
        torch.set_num_threads(spec.threads)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console(stderr=True), transient=True, disable=json_out) as bar:
        report = _run(spec, database, baseline, calibrate, rounds, vllm_python, _Bar(bar))
        if retune:
            from specdec_tune.tuner.regress import run_drift

            report.drift, notes = run_drift(spec, database, retune_trials, run_id=report.run_id, progress=_Bar(bar))
            report.notes += notes
    markdown = to_markdown(report)
    _write(report_md, markdown)
    _write(junit, to_junit(report))
    if json_out:
        print_json(to_json(report))
    else:
        typer.echo(markdown)
    return report.exit_code


def _run(spec, database, baseline: str, calibrate: bool, rounds: int | None, vllm_python: str | None, progress):
    """The suite measured once and compared with its baseline, or with ``--calibrate`` its A/A rounds."""
    if calibrate:
        from specdec_tune.tuner.regress import run_calibration

        return run_calibration(spec, database, rounds=rounds, progress=progress, vllm_python=vllm_python)
    from specdec_tune.tuner.regress import run_regress

    return run_regress(spec, database, baseline=baseline, progress=progress, vllm_python=vllm_python)
