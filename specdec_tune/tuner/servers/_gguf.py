"""The GGUF files of the llama.cpp export: which models they come from, and making them.

llama.cpp runs GGUF files, not Hugging Face folders, so ``export --format llamacpp`` writes
``llamacpp/target.gguf`` (and ``llamacpp/draft.gguf`` for a model draft) beside the flags that name
them, converted by llama.cpp's own ``convert_hf_to_gguf.py`` (through the profiler:
``profiler/backends/_llamacpp.py``) in float32, the precision the engine decodes in. ``llamacpp/gguf_sources.json``
records which model each file came from, so the files can be made again by hand.

Conversions run before anything is written (a refusal leaves ``--out`` untouched); the converter
alone is needed, fetched where missing (``profiler/backends/_llamacpp_fetch.py``). A format named explicitly
that cannot get its GGUF files (the converter missing and not fetched, a model that is not a local
folder or a cached hub id) is an error; under ``all`` it is listed under "Formats not written" with
the reason. A download (the dashboard's zip) carries the GGUF files only when they are already
converted (:func:`bundled_ggufs`), never the flags without them.
"""
from __future__ import annotations

import json
from pathlib import Path

from specdec_tune.core.errors import InputError, SpecdecError

SOURCES = "llamacpp/gguf_sources.json"
OUTTYPE = "f32"


def gguf_sources(target: str, draft: str | None, head: bool = False) -> tuple[str, str]:
    """``(path, text)`` of the sources file: GGUF name -> the model it is converted from (an EAGLE-3 head also
    names its target: llama.cpp's converter reads the target's config and tokenizer, ``--target-model-dir``)."""
    files = {"target.gguf": target, **({"draft.gguf": draft} if draft else {})}
    doc = {name: {"model": src, "outtype": OUTTYPE} for name, src in files.items()}
    if draft and head:
        doc["draft.gguf"]["target_model_dir"] = target
    return SOURCES, json.dumps(doc, indent=2) + "\n"


def convert_planned(files: list[tuple[str, str]], convert: bool = True) -> dict[str, Path]:
    """Convert (or take from the GGUF cache) every model the llama.cpp files name; with ``convert``
    false, take them from the GGUF cache only.

    Returns:
        relative export path (``llamacpp/target.gguf``) -> the cached GGUF file to copy there.

    Raises:
        InputError: a model is not local, the converter is missing and cannot be fetched or failed,
            or (``convert`` false) a model was not converted on this machine.
    """
    from specdec_tune.profiler import LlamacppError, cached_gguf, gguf_for_model, local_model_dir

    text = dict(files).get(SOURCES)
    if text is None:
        return {}
    out: dict[str, Path] = {}
    for name, entry in json.loads(text).items():
        local = local_model_dir(entry["model"])
        if local is None:
            raise InputError(f"cannot write llamacpp/{name}: {entry['model']!r} is not a local model folder or a "
                             "cached hub id (llama.cpp's converter reads local files)")
        target_dir = local_model_dir(entry["target_model_dir"]) if entry.get("target_model_dir") else None
        try:
            found = gguf_for_model(local, outtype=entry["outtype"], target_model_dir=target_dir) if convert else \
                cached_gguf(local, outtype=entry["outtype"], target_model_dir=target_dir)
        except LlamacppError as exc:
            raise InputError(f"cannot write llamacpp/{name}: {exc}") from None
        if found is None:
            raise InputError(f"llamacpp/{name} ({entry['model']}) is not converted to GGUF on this machine yet")
        out[f"llamacpp/{name}"] = found
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


def bundled_ggufs(built: dict[str, list[tuple[str, str]]], skipped: dict[str, str], limit: int,
                  study: str | None) -> dict[str, Path]:
    """The GGUF files a download of ``built["llamacpp"]`` carries: those already converted (nothing is
    converted here), when they weigh at most ``limit`` bytes together. Otherwise llamacpp moves from
    ``built`` to ``skipped`` (both changed in place) with the reason and the command that writes it."""
    if "llamacpp" not in built:
        return {}
    try:
        found = convert_planned(built["llamacpp"], convert=False)
    except SpecdecError as exc:
        reason = str(exc)
    else:
        size = sum(p.stat().st_size for p in found.values())
        if size <= limit:
            return found
        reason = f"its GGUF files weigh {size / 2**20:.0f} MiB, more than a download carries ({limit / 2**20:.0f} MiB)"
    del built["llamacpp"]
    skipped["llamacpp"] = (f"not in this download, as launch.sh and flags.txt need target.gguf beside them: {reason}; "
                           f"`specdec-tune export --study {study or 'NAME'} --format llamacpp --out DIR` writes it all")
    return {}
