"""Model names to where they load from, decided in about a second without loading anything (no torch).

A bundled name (``engine/zoo``), a local model folder, or a Hugging Face hub id that is cached or can
be looked up now. Kept apart from :mod:`.loading` so that a command can refuse a mistyped name
before it pays for importing torch and transformers.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from specdec_tune.core.errors import InputError, ModelLoadError

HUB_PROBE_TIMEOUT_S = 1.0  # one HEAD request to the hub; an answer of any status means reachable
_HUB_STATE: dict[str, str | None] = {}  # endpoint -> None (reachable) or why not: one probe per process
# What a model folder holds besides config.json (sharded weights have an index and several files).
_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
_TOKENIZER = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "*.tiktoken")


def resolve_source(name: str) -> str:
    """Where model ``name`` loads from, decided in about a second without loading anything.

    The one resolver of model names: ``load_model`` calls it, and ``profile`` and ``tune`` call it
    (``specdec_tune.engine.resolve_source``, re-exported by the profiler) for every name before any
    model loads, so a typo fails in seconds, offline, instead of after transformers' network retries.

    Returns:
        ``shape:<name>`` for a model shape (:mod:`engine.shapes`), a bundled name's folder, an existing
        local model folder (as given, ``~`` expanded), or ``name``
        itself as a hub id: one that is in the local Hugging Face cache, or any valid one while the hub
        answers (:func:`hub_unreachable`; ``gpt2`` without an org is a valid hub id too).

    Raises:
        InputError: an empty name.
        NotFoundError: an unknown ``shape:`` name (naming the shapes).
        ModelLoadError: one line naming ``name`` and what would be valid: a folder that is not a model
            (naming what it lacks: config.json, weights, tokenizer), a path that does not exist, a name
            that is no valid hub id, or a name that is neither bundled nor local while the hub cannot
            be reached; the last two suggest the nearest bundled name.
    """
    from specdec_tune.engine import shapes, zoo

    if not name or not name.strip():
        raise InputError("model name is empty (give a bundled name, a folder or a hub id)")
    if shapes.is_shape(name):
        return shapes.get_shape(name).label  # a published shape with random weights (engine.shapes)
    bundled = zoo.get_model(name)
    if bundled is not None:
        return check_model_folder(bundled.path)
    path = Path(name).expanduser()
    if path.exists():
        return check_model_folder(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith("/"):
        raise ModelLoadError(
            f"model path {name!r} does not exist (give a folder with config.json, a bundled model name, or a hub id)"
        )
    return _hub_id(name)


def check_model_folder(path: Path) -> str:
    """``path`` as a string if it holds a model (config.json, weights, tokenizer files), else one line
    naming the folder and what it lacks (instead of transformers' cut-off tokenizer message).

    Raises:
        ModelLoadError: ``path`` is missing, a file, or a folder without config.json, weights or a tokenizer.
    """
    valid = f"a model folder holds config.json, weights ({', '.join(_WEIGHTS)}) and a tokenizer ({', '.join(_TOKENIZER)})"
    if not path.is_dir():
        what = "is a file, not a model folder" if path.exists() else "does not exist"
        raise ModelLoadError(f"model path {str(path)!r} {what} ({valid})")
    has = lambda patterns: any(next(path.glob(p), None) is not None for p in patterns)  # noqa: E731
    from specdec_tune.engine.eagle_layout import is_eagle3_folder

    head = is_eagle3_folder(path)  # an EAGLE-3 head reads the target's tokenizer (the servers pass it)
    missing = [what for what, present in (("config.json", (path / "config.json").is_file()),
                                          ("weights", has(_WEIGHTS)), ("a tokenizer", head or has(_TOKENIZER)))
               if not present]
    if missing:
        raise ModelLoadError(f"model folder {str(path)!r} is not a model: it lacks {' and '.join(missing)} ({valid})")
    return str(path)


def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached (None: it answered), decided once per process.

    ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set means offline. Otherwise one HEAD request to the
    endpoint with a short timeout, in a daemon thread so that a slow name lookup cannot hold it longer
    either: transformers' own retries take minutes on a machine without the hub.
    """
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var} is set"
    from huggingface_hub import constants

    endpoint = constants.ENDPOINT
    if endpoint not in _HUB_STATE:
        _HUB_STATE[endpoint] = _probe_hub(endpoint)
    return _HUB_STATE[endpoint]


def _probe_hub(endpoint: str) -> str | None:
    outcome: list[str | None] = []

    def head() -> None:
        try:
            from huggingface_hub.utils import get_session

            get_session().head(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - any failure to get an answer means unreachable
            outcome.append(f"no answer from {endpoint}: {one_line(exc, 120)}")

    probe = threading.Thread(target=head, daemon=True, name="specdec-hub-probe")
    probe.start()
    probe.join(HUB_PROBE_TIMEOUT_S + 0.5)
    return outcome[0] if outcome else f"no answer from {endpoint} within {HUB_PROBE_TIMEOUT_S:g} s"


def _hub_id(name: str) -> str:
    """``name`` as a hub id if it is a valid one that is cached or can be looked up now."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ModelLoadError(f"model {name!r} is not a bundled model, a local folder or a valid hub id "
                             f"(org/name){nearest_hint(name)}") from None
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return name  # downloaded before: loads from the cache without the network
    why = hub_unreachable()
    if why is None:
        return name
    raise ModelLoadError(f"model {name!r} is neither a bundled model nor a local folder, and the Hugging Face hub "
                         f"cannot be reached to look it up as a hub id ({why}){nearest_hint(name)}")


def nearest_hint(name: str) -> str:
    from specdec_tune.engine import zoo

    nearest = zoo.nearest_model(name)
    if nearest is None:
        return ""
    return f"; did you mean {nearest!r}? (bundled: {', '.join(m.name for m in zoo.list_models())})"


def one_line(exc: BaseException, limit: int = 400) -> str:
    """The whole message on one line (transformers' messages span lines; the first alone is cut off)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
