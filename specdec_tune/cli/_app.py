"""The Typer application object shared by the CLI command modules.

Command modules (``specdec_tune/cli/*.py``) import :data:`app` and register commands on it; ``cli.main`` imports
them all and runs the app with the project's error policy: a :class:`SpecdecError` becomes one line
on stderr and exit code 2, never a traceback. Every command prints through :func:`console` (tables in
full when piped, labels never cut with an ellipsis); the rooms' logged notices reach stderr as one line
each (:func:`show_notices`, installed before every command).
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import typer
from rich.console import Console, ConsoleRenderable, RenderHook
from rich.measure import Measurement
from rich.table import Table
from typer.core import TyperGroup

from specdec_tune.core.jsonsafe import finite

THROUGHPUT_NOTE = "end to end: new tokens / wall seconds of whole decode calls, prefill included"


class Interrupted(BaseException):
    """Ctrl-C on its way to ``cli.main``, which prints ``interrupted: <what the command kept>`` and exits 130.

    Typer turns a ``KeyboardInterrupt`` into a silent exit code, losing the line a command raised it
    with (``raise KeyboardInterrupt("12 trials kept; ...")``); this carries the line past Typer.
    """


class InterruptibleGroup(TyperGroup):
    """The app's command group: a ``KeyboardInterrupt`` leaving a command becomes :class:`Interrupted`."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise Interrupted(str(exc)) from None


app = typer.Typer(
    name="specdec-tune",
    help=(
        "Measure, model, tune and export speculative decoding for your own target/draft models, "
        "workload and hardware. Every number printed is labelled measured or predicted."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=InterruptibleGroup,
)


# Rich falls back to 80 columns on a stream that is not a terminal and squeezes tables into them
# ("mini-draft… N=7"); piped output is as wide as its longest line instead.
PIPED_WIDTH = 10_000


def console(*, stderr: bool = False) -> Console:
    """The console a command prints through (stdout, or stderr for progress and notices).

    Its width is ``$COLUMNS`` where set, the terminal's on a terminal, and unlimited when piped (no
    table squeezed, no line wrapped). A table that still does not fit (a narrow terminal) wraps its
    cells onto more lines: no label is ever cut short with an ellipsis.
    """
    stream = sys.stderr if stderr else sys.stdout
    piped = "COLUMNS" not in os.environ and not _isatty(stream)
    out = Console(stderr=stderr, width=PIPED_WIDTH, soft_wrap=True) if piped else Console(stderr=stderr)
    out.push_render_hook(_FoldCells(out))
    return out


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _FoldCells(RenderHook):
    """Every printed table's cells wrap (folding a word longer than the column) instead of ending in "…"."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        for renderable in renderables:
            if isinstance(renderable, Table):
                _fold(renderable, self.console)
        return renderables


def _fold(table: Table, out: Console) -> None:
    """Cells fold rather than end in "…"; ``no_wrap`` columns keep one line while the table can fit them
    (Rich would cut them, not wrap them, in a terminal too narrow for them)."""
    for column in table.columns:
        column.overflow = "fold"
    fixed = [c for c in table.columns if c.no_wrap]
    cell_gap = 3  # one space each side and a border
    needed = 1 + cell_gap * len(table.columns) + len(table.columns) - len(fixed) + sum(
        max(Measurement.get(out, out.options, cell).maximum for cell in (c.header, *c.cells)) for c in fixed)
    if needed > out.width:
        for column in fixed:
            column.no_wrap = False


class _Notice(logging.Handler):
    """A notice the rooms log (a kernel build, say) as one line on stderr, read at emit time (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"specdec-tune: {record.getMessage()}", file=sys.stderr)


def show_notices() -> None:
    """Show the rooms' notices (``logging`` at INFO and above under ``specdec_tune``) on stderr: the
    rooms never print (``docs/architecture.md``, Rooms). Idempotent."""
    log = logging.getLogger("specdec_tune")
    if not any(isinstance(h, _Notice) for h in log.handlers):
        log.addHandler(_Notice(logging.INFO))
        log.setLevel(min(log.getEffectiveLevel(), logging.INFO))


@app.callback()
def _every_command() -> None:
    show_notices()


def print_json(obj: Any) -> None:
    """Write one JSON object per line on stdout (the ``--json`` output contract).

    JSON has no NaN or infinity: an undefined rate (say α_i at a position no cycle reached) is
    written as null, so every line parses with any JSON reader.
    """
    sys.stdout.write(json.dumps(finite(obj), default=_json_default, allow_nan=False) + "\n")
    sys.stdout.flush()


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def quiet_loading() -> None:
    """Our progress bars replace transformers' per-model "Loading weights" bars (and keep errors one line)."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def show_threads(choice: Any) -> None:
    """The thread count a command measures with, and a warning where it is known to be pathological (stderr)."""
    err = console(stderr=True)
    err.print(choice.text(), highlight=False, markup=False)
    if choice.warning:
        err.print(f"warning: {choice.warning}", highlight=False, markup=False)


def set_threads(value: str, target: Any, draft: Any = None) -> Any:
    """Choose the thread count for ``target`` (and ``draft``) from ``--threads``, set it, show it; return it."""
    from specdec_tune.cli._checks import parse_threads
    from specdec_tune.profiler import apply_threads, choose_threads

    choice = apply_threads(choose_threads(parse_threads(value), target, draft))
    show_threads(choice)
    return choice
