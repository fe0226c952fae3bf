"""Loading target and draft models (local folder, bundled zoo name or hub id) and pairing them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec_tune.engine import lean_kernels, shapes
from specdec_tune.engine.lean import FORWARDS, LeanCausalLM, hf_model, lean_unsupported, wrap_forward
from specdec_tune.engine.names import hub_unreachable, nearest_hint, one_line, resolve_source
from specdec_tune.core.errors import InputError, ModelLoadError
from specdec_tune.core.limits import GRAPH_MODES

DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # the short names are aliases


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
    def cuda_graphs(self) -> str | None:
        """On CUDA: ``on`` (the lean forward replays CUDA graphs, :mod:`engine.cuda_graphs`), ``off``, or
        ``failed (reason)`` when a capture failed and the forwards went back to eager; None off CUDA (unless a
        test attached the runner's static-cache stand-in there). Read it after a run: a capture can fail late."""
        runner = getattr(self.model, "cuda_graph_runner", None) if self.forward == "lean" else None
        if runner is None:
            return None if self.device.type != "cuda" else "off"
        return "on" if runner.failed is None else f"failed ({runner.failed})"

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


def load_model(
    name: str, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto", forward: str = "auto",
    cuda_graphs: str = "auto",
) -> LoadedModel:
    """Load a Hugging Face causal LM and its tokenizer in eval mode.

    Args:
        name: bundled zoo name (e.g. ``mini-target``), model shape (``shape:llama-3.1-8b``: random
            weights, :mod:`engine.shapes`), local folder, or hub id.
        device: ``auto`` | ``cpu`` | ``cuda`` or a torch.device.
        dtype: ``auto`` | ``float32`` | ``bfloat16`` | ``float16`` or a torch.dtype.
        forward: ``auto`` (the lean Llama-family forward when the model supports it, else HF's),
            ``lean`` (refused for a model it cannot run) or ``hf``. See :mod:`engine.lean`.
        cuda_graphs: ``auto`` (the lean forward on CUDA replays CUDA graphs), ``on`` (refused where it
            cannot) or ``off``. See :mod:`engine.cuda_graphs`.

    Raises:
        ModelLoadError: the folder or hub id cannot be loaded, or a shape does not fit in memory.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if forward not in FORWARDS:
        raise InputError(f"--forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    if cuda_graphs not in GRAPH_MODES:
        raise InputError(f"--cuda-graphs must be one of {', '.join(GRAPH_MODES)}, got {cuda_graphs!r}")
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    dt = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype, dev)
    if cuda_graphs == "on" and (dev.type != "cuda" or forward == "hf"):
        raise InputError("--cuda-graphs on needs --device cuda and the lean forward (--forward auto or lean)")
    source = resolve_source(name)
    if shapes.is_shape(source):  # a published shape with seeded random weights (engine.shapes)
        model, tokenizer = shapes.build_shape(source, dev, dt)
        return _loaded(name, source, model, tokenizer, dev, dt, forward, cuda_graphs)
    hub = not Path(source).is_dir()
    # A hub id resolved while the hub cannot be reached is in the local cache: load it from there,
    # without transformers' retries.
    cached_only = hub and hub_unreachable() is not None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=cached_only)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dt, local_files_only=cached_only)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load model {name!r}: {one_line(exc)}{nearest_hint(name) if hub else ''}") from exc
    model.to(dev).eval()
    model.requires_grad_(False)
    return _loaded(name, source, model, tokenizer, dev, dt, forward, cuda_graphs)


def _loaded(name: str, source: str, model: torch.nn.Module, tokenizer: Any, dev: torch.device, dt: torch.dtype,
            forward: str, cuda_graphs: str = "auto") -> LoadedModel:
    if forward == "lean" and lean_unsupported(model) is not None:
        raise InputError(f"--forward lean cannot run {name!r}: {lean_unsupported(model)} (use --forward auto or hf)")
    if cuda_graphs == "on" and lean_unsupported(model) is not None:
        raise InputError(f"--cuda-graphs on cannot run {name!r}: {lean_unsupported(model)} (use --cuda-graphs auto)")
    return LoadedModel(name=name, source=source, model=wrap_forward(model, forward, cuda_graphs), tokenizer=tokenizer,
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
