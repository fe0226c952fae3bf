"""The GGUF files of the llama.cpp export: which models they come from, and making them.

llama.cpp runs GGUF files, not Hugging Face folders, so ``export --format llamacpp`` writes
``llamacpp/target.gguf`` (and ``llamacpp/draft.gguf`` for a model draft) beside the flags that name
them, converted by llama.cpp's own ``convert_hf_to_gguf.py`` (through the profiler:
``profiler/llamacpp.py``) in float32, the precision the engine decodes in. ``llamacpp/gguf_sources.json``
records which model each file came from, so the files can be made again by hand.

Conversions run before anything is written (a refusal leaves ``--out`` untouched): a format named
explicitly that cannot get its GGUF files (llama.cpp not installed, a model that is not a local
folder or a cached hub id) is an error; under ``all`` it is listed under "Formats not written" with
the reason.
"""
from __future__ import annotations

import json
from pathlib import Path

from specdec_tune.errors import InputError, SpecdecError

SOURCES = "llamacpp/gguf_sources.json"
OUTTYPE = "f32"


def gguf_sources(target: str, draft: str | None) -> tuple[str, str]:
    """``(path, text)`` of the sources file: GGUF name -> the model it is converted from."""
    files = {"target.gguf": target, **({"draft.gguf": draft} if draft else {})}
    doc = {name: {"model": src, "outtype": OUTTYPE} for name, src in files.items()}
    return SOURCES, json.dumps(doc, indent=2) + "\n"


def convert_planned(files: list[tuple[str, str]]) -> dict[str, Path]:
    """Convert (or take from the GGUF cache) every model the llama.cpp files name.

    Returns:
        relative export path (``llamacpp/target.gguf``) -> the cached GGUF file to copy there.

    Raises:
        InputError: llama.cpp is not installed, a model is not local, or the converter failed.
    """
    from specdec_tune.profiler import LlamacppError, gguf_for_model, local_model_dir

    text = dict(files).get(SOURCES)
    if text is None:
        return {}
    out: dict[str, Path] = {}
    for name, entry in json.loads(text).items():
        local = local_model_dir(entry["model"])
        if local is None:
            raise InputError(f"cannot write llamacpp/{name}: {entry['model']!r} is not a local model folder or a "
                             "cached hub id (llama.cpp's converter reads local files)")
        try:
            out[f"llamacpp/{name}"] = gguf_for_model(local, outtype=entry["outtype"])
        except LlamacppError as exc:
            raise InputError(f"cannot write llamacpp/{name}: {exc}") from None
    return out


def prepare_ggufs(built: dict[str, list[tuple[str, str]]], skipped: dict[str, str], every: bool) -> dict[str, Path]:
    """The GGUF files of ``built["llamacpp"]`` (see :func:`convert_planned`). Under ``all`` a failure
    moves llamacpp from ``built`` to ``skipped`` (both changed in place) instead of raising.

    Raises:
        InputError: llamacpp was named explicitly and its GGUF files cannot be made.
    """
    if "llamacpp" not in built:
        return {}
    try:
        return convert_planned(built["llamacpp"])
    except SpecdecError as exc:
        if not every:
            raise
        del built["llamacpp"]
        skipped["llamacpp"] = str(exc)
        return {}
