"""What an EAGLE-3 head's folder says, read without torch (``engine.eagle`` has the layout and the head).

Kept apart so that naming a head (``engine.names``) and telling a head from a draft model cost a JSON read.
"""
from __future__ import annotations

import json
from pathlib import Path

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
WEIGHTS = "model.safetensors"


def is_eagle3_config(config: dict) -> bool:
    """Whether a ``config.json`` (as a dict) describes an EAGLE-3 head."""
    return any(a in ARCHITECTURES for a in config.get("architectures") or ())


def is_eagle3_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding an EAGLE-3 head (its ``config.json`` says so; nothing is loaded)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return is_eagle3_config(json.loads(config.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return False


def default_aux_layers(target_layers: int) -> tuple[int, int, int]:
    """The low, middle and high layer both servers capture by default: the residual after 2, L // 2 and
    L - 3 layers (vLLM ``SupportsEagle3.get_eagle3_default_aux_hidden_state_layers``, SGLang
    ``set_eagle3_layers_to_capture(None)``)."""
    return (2, target_layers // 2, target_layers - 3)


def aux_layers_of(config: dict, target_layers: int) -> tuple[int, ...]:
    """The target layers a head reads, in vLLM's sense (the residual after i layers; 0 is the embedding):
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` or a top-level ``eagle_aux_hidden_state_layer_ids``,
    else the defaults. Sorted and unique, as vLLM's ``_set_aux_hidden_state_layers`` keeps them."""
    eagle = config.get("eagle_config") or {}
    ids = config.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    layers = tuple(sorted(set(int(i) for i in ids))) if ids else default_aux_layers(target_layers)
    if any(not 0 <= i <= target_layers for i in layers):
        raise ValueError(f"EAGLE-3 layer ids {list(layers)} do not fit a target of {target_layers} layers")
    return layers
