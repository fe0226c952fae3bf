"""Real model sizes without weights: ``shape:<name>`` builds a published model's architecture with
seeded random weights (docs/architecture.md, Engine contracts).

No model hub is reachable, so real weights cannot be had, but the shapes that set a forward's cost
can: ``engine/shape_configs/<name>/config.json`` holds the published ``config.json`` of
Llama-3.2-1B, Llama-3.1-8B, Qwen2.5-0.5B and Qwen2.5-7B (sources in ``manifest.json``) and two
draft shapes derived from them with the same vocabulary. The model is created on the ``meta``
device (no memory), materialised on the target device with ``to_empty`` and filled from a seeded
generator: weight matrices N(0, initializer_range²) as transformers initialises them, norms 1,
biases 0, rotary frequencies recomputed. Rows of the embedding and LM head past the family's
tokenizer (Qwen2.5 pads 151,665 tokens to 151,936 or 152,064 rows) are zero, so their logit is
exactly 0 and random weights never pick an id another shape of the family could not embed.

Random weights make acceptance meaningless: pair a shape with synthetic acceptance
(``DecodeConfig.synthetic_acceptance``). Names resolve without torch (:func:`get_shape`), and a
shape that does not fit is refused before anything is allocated, naming the memory it needs.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from specdec_tune.core.errors import ModelLoadError, NotFoundError

SHAPE_PREFIX = "shape:"
CONFIGS = Path(__file__).with_name("shape_configs")
MEMORY_MARGIN = 1.15  # activations, the KV cache and allocator slack on top of the weights


@dataclass(frozen=True)
class Shape:
    """One model shape: its published (or derived) config and its family's tokenizer."""

    name: str
    family: str
    published: bool
    source: str  # where the config comes from (a URL, or how it was derived)
    folder: Path  # holds config.json
    tokenizer_vocab_size: int
    eos_token_id: int

    @property
    def label(self) -> str:
        return f"{SHAPE_PREFIX}{self.name}"


@lru_cache(maxsize=1)
def _manifest() -> dict[str, Any]:
    return json.loads((CONFIGS / "manifest.json").read_text(encoding="utf-8"))


def is_shape(name: str) -> bool:
    """Whether ``name`` asks for a model shape (``shape:...``)."""
    return name.strip().lower().startswith(SHAPE_PREFIX)


def shape_names() -> list[str]:
    """Every shape's full name (``shape:llama-3.1-8b``, ...)."""
    return [SHAPE_PREFIX + n for n in _manifest()["shapes"]]


def get_shape(name: str) -> Shape:
    """The shape ``name`` names (with or without ``shape:``), without importing torch.

    Raises:
        NotFoundError: an unknown shape, naming the known ones.
    """
    key = name.strip().lower().removeprefix(SHAPE_PREFIX)
    entry = _manifest()["shapes"].get(key)
    if entry is None:
        raise NotFoundError(f"unknown model shape {name!r}; shapes: {', '.join(shape_names())}")
    family = _manifest()["families"][entry["family"]]
    return Shape(key, entry["family"], bool(entry["published"]), entry["source"], CONFIGS / key,
                 int(family["tokenizer_vocab_size"]), int(family["eos_token_id"]))


@lru_cache(maxsize=None)
def parameter_count(shape: Shape) -> int:
    """Parameters of the shape, counted on the meta device (nothing allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(shape.folder))
    return sum(p.numel() for p in model.parameters())


def memory_needed(shape: Shape, dtype: Any, device: Any) -> int:
    """Bytes the shape takes loaded: its weights in ``dtype``, once more where the lean forward packs
    them (CPU float32 up to ``PACK_MAX_BYTES``), and :data:`MEMORY_MARGIN` on top."""
    import torch

    from specdec_tune.engine.lean import PACK_MAX_BYTES

    weights = parameter_count(shape) * torch.empty((), dtype=dtype).element_size()
    packed = weights if torch.device(device).type == "cpu" and dtype == torch.float32 and weights <= PACK_MAX_BYTES else 0
    return int((weights + packed) * MEMORY_MARGIN)


def available_memory(device: Any) -> int | None:
    """Bytes free for a new model on ``device`` now (None when unknown): the GPU's free memory, or the
    kernel's ``MemAvailable`` on a CPU."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(shape: Shape, dtype: Any, device: Any) -> None:
    """Refuse a shape that does not fit in the memory free now, before anything is allocated.

    Raises:
        ModelLoadError: naming the memory needed and free (and a smaller dtype when one would fit).
    """
    need, free = memory_needed(shape, dtype, device), available_memory(device)
    if free is None or need <= free:
        return
    gib = 2**30
    dt = str(dtype).replace("torch.", "")
    raise ModelLoadError(f"model shape {shape.label!r} needs about {need / gib:.1f} GiB in {dt} on {device} "
                         f"({parameter_count(shape) / 1e9:.2f} B parameters), but only {free / gib:.1f} GiB is "
                         f"free: use a smaller shape or dtype (`specdec-tune zoo shapes` lists them) or a machine with more memory")


def build_shape(name: str, device: Any, dtype: Any, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) of shape ``name`` with seeded random weights on ``device`` in ``dtype``.

    Raises:
        NotFoundError: an unknown shape.
        ModelLoadError: the shape does not fit in the memory free now.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdec_tune.engine.shape_tokenizer import ShapeTokenizer

    shape = get_shape(name)
    check_fits(shape, dtype, device)
    config = AutoConfig.from_pretrained(shape.folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gives every parameter its own storage; a tied head shares the embedding again
    _materialise(model, shape, seed, torch.device(device))
    model.generation_config.eos_token_id = shape.eos_token_id
    model.generation_config.pad_token_id = shape.eos_token_id
    model.eval().requires_grad_(False)
    return model, ShapeTokenizer(shape.tokenizer_vocab_size, shape.eos_token_id, shape.family)


def _materialise(model: Any, shape: Shape, seed: int, device: Any) -> None:
    """Fill the ``to_empty`` tensors: what transformers' ``_init_weights`` does, from one seeded generator."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    std = float(getattr(model.config, "initializer_range", 0.02) or 0.02)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied weight is listed once
            if p.ndim >= 2:
                p.normal_(0.0, std, generator=gen)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)  # RMSNorm scales
        for module in model.modules():
            if hasattr(module, "original_inv_freq") and hasattr(module, "rope_type"):
                fn = (module.compute_default_rope_parameters if module.rope_type == "default"
                      else ROPE_INIT_FUNCTIONS[module.rope_type])
                inv_freq, _ = fn(module.config)  # as transformers' _init_weights calls it (CPU)
                module.inv_freq.copy_(inv_freq)
                module.original_inv_freq.copy_(inv_freq)
        rows = shape.tokenizer_vocab_size
        model.get_input_embeddings().weight[rows:] = 0  # padding rows: never an input
        model.get_output_embeddings().weight[rows:] = 0  # their logit is exactly 0: never the argmax
