"""Typer options shared by several commands (kept free of heavy imports such as SQLAlchemy)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

DbOption = Annotated[
    Optional[str],  # noqa: UP045 - typer reads the annotation at run time on Python 3.10 too
    typer.Option(
        "--db",
        envvar="SPECDEC_DB",
        show_envvar=True,
        metavar="URL",
        help=(
            "Results database URL: sqlite:///specdec.db (default, in the current directory), "
            "sqlite:////abs/path.db or postgresql+psycopg://user:password@host/dbname."
        ),
    ),
]

ForwardOption = Annotated[
    str,
    typer.Option(
        "--forward",
        help=(
            "Model forward the engine runs: auto (the lean Llama-family forward when the model supports it, "
            "else Hugging Face's), lean, or hf (Hugging Face's module forward)."
        ),
    ),
]

VllmPythonOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--vllm-python",
        envvar="SPECDEC_VLLM_PYTHON",
        show_envvar=True,
        metavar="PATH",
        help="Python of the vLLM environment (created by scripts/setup_vllm_env.sh, e.g. .venv-vllm/bin/python).",
    ),
]
