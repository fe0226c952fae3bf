"""The Typer application object shared by the CLI command modules.

Command modules (``specdec_tune/cli/*.py``) import :data:`app` and register commands on it; ``cli.main`` imports
them all and runs the app with the project's error policy: a :class:`SpecdecError` becomes one line
on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import typer

from specdec_tune.jsonsafe import finite

THROUGHPUT_NOTE = "end to end: new tokens / wall seconds of whole decode calls, prefill included"

app = typer.Typer(
    name="specdec-tune",
    help=(
        "Measure, model, tune and export speculative decoding for your own target/draft models, "
        "workload and hardware. Every number printed is labelled measured or predicted."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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
