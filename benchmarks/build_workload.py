"""A larger prompt set of one bundled kind, for validations that need more prompts than the bundled 40.

The bundled workloads hold 40 prompts each, cut from the zoo's held-out standard-library files by
``training.build_workloads`` (seed 0). A held-out validation of a *distribution* (TPOT p50 and p90)
on 20 held-out prompts, predicted from 16 profiled ones, cannot resolve a 5 % error: which prompts fall
in which half moves the two halves' medians apart by about 7 % for a model that knew the population
exactly (``latency_fidelity.py`` prints this floor). This script runs the same builder with a larger
``size``: the builder is prefix-stable, so the first 40 prompts are the bundled set itself and the rest
come from the same files and the same cut rules: the same population, more of it.

Usage (a few seconds):

    python benchmarks/build_workload.py --kind functions --size 240

writes ``benchmarks/workloads/functions-240.jsonl`` (committed, so a run on another Python, whose
standard library differs, uses the same prompts).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specdec_tune.cli import _options as opts
from specdec_tune.engine.zoo import resolve_model
from specdec_tune.core.errors import InputError
from specdec_tune.training.build_workloads import WORKLOAD_KINDS, build_workload, write_jsonl
from specdec_tune.training.corpus import load_corpus

HERE = Path(__file__).resolve().parent

Kind = Annotated[str, typer.Option("--kind", help=f"Workload kind: {', '.join(WORKLOAD_KINDS)}.")]
Size = Annotated[int, typer.Option("--size", min=40, help="Prompts wanted (fewer if the files hold fewer cut points).")]
Out = Annotated[Path | None, typer.Option("--out", help="Output JSONL (default benchmarks/workloads/KIND-SIZE.jsonl).")]


def main(kind: Kind = "functions", size: Size = 240, out: Out = None) -> None:
    if kind not in WORKLOAD_KINDS:
        raise InputError(f"--kind must be one of {', '.join(WORKLOAD_KINDS)}, got {kind!r}")
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(resolve_model("mini-target")).backend_tokenizer
    records = build_workload(kind, list(load_corpus().held_out),
                             lambda text: len(backend.encode(text, add_special_tokens=False).ids), size=size, seed=0)
    path = out or HERE / "workloads" / f"{kind}-{size}.jsonl"
    write_jsonl(records, path)
    print(f"{len(records)} {kind} prompts -> {path}")


if __name__ == "__main__":
    opts.run_script(main)
