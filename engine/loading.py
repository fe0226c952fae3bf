"""Loading target and draft models (local folder, bundled zoo name or hub id) and pairing them."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec_tune.engine import lean_kernels
from specdec_tune.engine.lean import FORWARDS, LeanCausalLM, hf_model, lean_unsupported, wrap_forward
from specdec_tune.errors import InputError, ModelLoadError

DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HUB_PROBE_TIMEOUT_S = 1.0  # one HEAD request to the hub; an answer of any status means reachable
_HUB_STATE: dict[str, str | None] = {}  # endpoint -> None (reachable) or why not: one probe per process
# What a model folder holds besides config.json (sharded weights have an index and several files).
_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
_TOKENIZER = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "*.tiktoken")


@dataclass
class LoadedModel:
    """A model ready for decoding, with the tokenizer and where it came from."""

    name: str  # what the user typed (zoo name, path or hub id)
    source: str  # the resolved folder path or hub id
    model: torch.nn.Module  # what the engine calls: the lean wrapper or the HF model itself
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype

    @property
    def hf(self) -> torch.nn.Module:
        """The Hugging Face model (for ``generate`` and anything else outside the engine)."""
        return hf_model(self.model)

    @property
    def forward(self) -> str:
        """Which forward the engine runs: ``lean`` or ``hf``."""
        return "lean" if isinstance(self.model, LeanCausalLM) else "hf"

    @property
    def kernels(self) -> str | None:
        """``fused`` or ``eager (reason)`` for the lean forward on a CPU in float32 (its small operators,
        :mod:`engine.lean_kernels`); None where they do not apply (HF's forward, a GPU, another dtype)."""
        if self.forward != "lean" or self.device.type != "cpu" or self.dtype != torch.float32:
            return None
        return lean_kernels.status() if self.model.use_kernels else "eager (use_kernels off)"

    @property
    def num_layers(self) -> int:
        return int(self.model.config.get_text_config(decoder=True).num_hidden_layers)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return eos


def resolve_device(device: str) -> torch.device:
    """``auto`` picks cuda when available; ``cuda`` without a GPU is refused."""
    if device not in DEVICES:
        raise InputError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for but no CUDA GPU is available (use --device cpu)")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` is bf16 on cuda and fp32 on cpu (bf16 matmuls on a CPU are slow)."""
    if dtype not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    chosen = DTYPES[dtype]
    if chosen is None:
        chosen = torch.bfloat16 if device.type == "cuda" else torch.float32
    return chosen


def resolve_source(name: str) -> str:
    """Where model ``name`` loads from, decided in about a second without loading anything.

    The one resolver of model names: ``load_model`` calls it, and ``profile`` and ``tune`` call it
    (``specdec_tune.engine.resolve_source``, re-exported by the profiler) for every name before any
    model loads, so a typo fails in seconds, offline, instead of after transformers' network retries.

    Returns:
        A bundled name's folder, an existing local model folder (as given, ``~`` expanded), or ``name``
        itself as a hub id: one that is in the local Hugging Face cache, or any valid one while the hub
        answers (:func:`hub_unreachable`; ``gpt2`` without an org is a valid hub id too).

    Raises:
        InputError: an empty name.
        ModelLoadError: one line naming ``name`` and what would be valid: a folder that is not a model
            (naming what it lacks: config.json, weights, tokenizer), a path that does not exist, a name
            that is no valid hub id, or a name that is neither bundled nor local while the hub cannot
            be reached; the last two suggest the nearest bundled name.
    """
    from specdec_tune.engine import zoo

    if not name or not name.strip():
        raise InputError("model name is empty (give a bundled name, a folder or a hub id)")
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
    missing = [what for what, present in (("config.json", (path / "config.json").is_file()),
                                          ("weights", has(_WEIGHTS)), ("a tokenizer", has(_TOKENIZER))) if not present]
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
            outcome.append(f"no answer from {endpoint}: {_one_line(exc, 120)}")

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
                             f"(org/name){_nearest(name)}") from None
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return name  # downloaded before: loads from the cache without the network
    why = hub_unreachable()
    if why is None:
        return name
    raise ModelLoadError(f"model {name!r} is neither a bundled model nor a local folder, and the Hugging Face hub "
                         f"cannot be reached to look it up as a hub id ({why}){_nearest(name)}")


def _nearest(name: str) -> str:
    from specdec_tune.engine import zoo

    nearest = zoo.nearest_model(name)
    if nearest is None:
        return ""
    return f"; did you mean {nearest!r}? (bundled: {', '.join(m.name for m in zoo.list_models())})"


def _one_line(exc: BaseException, limit: int = 400) -> str:
    """The whole message on one line (transformers' messages span lines; the first alone is cut off)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def load_model(
    name: str, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto", forward: str = "auto"
) -> LoadedModel:
    """Load a Hugging Face causal LM and its tokenizer in eval mode.

    Args:
        name: bundled zoo name (e.g. ``mini-target``), local folder, or hub id.
        device: ``auto`` | ``cpu`` | ``cuda`` or a torch.device.
        dtype: ``auto`` | ``float32`` | ``bfloat16`` | ``float16`` or a torch.dtype.
        forward: ``auto`` (the lean Llama-family forward when the model supports it, else HF's),
            ``lean`` (refused for a model it cannot run) or ``hf``. See :mod:`engine.lean`.

    Raises:
        ModelLoadError: the folder or hub id cannot be loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if forward not in FORWARDS:
        raise InputError(f"--forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    dt = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype, dev)
    source = resolve_source(name)
    hub = not Path(source).is_dir()
    # A hub id resolved while the hub cannot be reached is in the local cache: load it from there,
    # without transformers' retries.
    cached_only = hub and hub_unreachable() is not None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=cached_only)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dt, local_files_only=cached_only)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load model {name!r}: {_one_line(exc)}{_nearest(name) if hub else ''}") from exc
    model.to(dev).eval()
    model.requires_grad_(False)
    if forward == "lean" and lean_unsupported(model) is not None:
        raise InputError(f"--forward lean cannot run {name!r}: {lean_unsupported(model)} (use --forward auto or hf)")
    return LoadedModel(name=name, source=source, model=wrap_forward(model, forward), tokenizer=tokenizer,
                       device=dev, dtype=dt)


def check_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft whose tokenizer maps tokens to different ids than the target's.

    Raises:
        ModelLoadError: naming both models and the first token whose id differs.
    """
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if tv == dv:
        return
    for token in sorted(set(tv) | set(dv), key=lambda t: (tv.get(t, dv.get(t, 0)), t)):
        if tv.get(token) != dv.get(token):
            raise ModelLoadError(
                f"draft {draft.name!r} and target {target.name!r} do not share a vocabulary: token {token!r} has id "
                f"{tv.get(token)} in the target and {dv.get(token)} in the draft"
            )
