"""The bundled mini model family ("zoo"): the registry of the bundled models and workloads.

The models live in ``models/<name>/`` next to this file (Hugging Face folders with config, float16
safetensors weights and the shared tokenizer); ``zoo.json`` is their manifest, ``MODEL_CARD.md``
describes them, ``train_log.txt`` is the log of the run that made them (``specdec_tune.training``).
Bundled names are accepted wherever a model path or hub id is.
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from specdec_tune.engine.workloads import bundled_workloads

ZOO_DIR = Path(__file__).resolve().parent
MANIFEST_PATH = ZOO_DIR / "zoo.json"

__all__ = ["ZOO_DIR", "MANIFEST_PATH", "ZooModel", "list_models", "get_model", "resolve_model",
           "nearest_model", "list_workloads", "read_manifest"]


@dataclass(frozen=True)
class ZooModel:
    """One bundled model, as listed in the manifest."""

    name: str
    role: str  # "target" or "draft"
    path: Path
    layers: int
    hidden_size: int
    parameters: int


def read_manifest(path: Path | None = None) -> dict:
    """The manifest written by the recipe (empty model list if the zoo is not built)."""
    path = MANIFEST_PATH if path is None else Path(path)
    if not path.is_file():
        return {"models": [], "workloads": []}
    return json.loads(path.read_text(encoding="utf-8"))


def list_models() -> list[ZooModel]:
    """The bundled models, target first, then drafts in manifest order."""
    manifest = read_manifest()
    models = [
        ZooModel(name=m["name"], role=m["role"], path=ZOO_DIR / m["path"], layers=int(m["layers"]),
                 hidden_size=int(m["hidden_size"]), parameters=int(m["parameters"]))
        for m in manifest.get("models", [])
    ]
    return sorted(models, key=lambda m: m.role != "target")


def get_model(name: str) -> ZooModel | None:
    """The bundled model called ``name``, or None."""
    return next((m for m in list_models() if m.name == name), None)


def resolve_model(name_or_path: str) -> str:
    """Folder path of a bundled model by name; any other string is returned unchanged.

    Anything that is not a bundled name (a local folder or a hub id) is left to the loader.
    """
    model = get_model(str(name_or_path))
    return str(model.path) if model is not None else str(name_or_path)


def nearest_model(name: str) -> str | None:
    """The bundled model name closest to ``name`` (what a typo probably meant), or None without a zoo."""
    names = [m.name for m in list_models()]
    if not names:
        return None
    return max(names, key=lambda n: difflib.SequenceMatcher(None, name.lower(), n).ratio())


def list_workloads() -> list[str]:
    """Names of the bundled workloads (e.g. ``functions``, ``docstrings``, ``tables``)."""
    return bundled_workloads()
