"""Reading and writing EAGLE-3 heads in the layout vLLM's and SGLang's loaders read (``engine.eagle``).

:func:`head_config` makes a head's ``config.json`` for a target, :func:`save_head` writes the folder
(float16 weights by default, as the zoo ships its models; ``d2t`` int64, ``t2d`` bool) and
:func:`load_head` reads one back, checking every weight's name and shape against the config so that a
folder the servers would refuse is refused here too, in one line.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from specdec_tune.core.errors import ModelLoadError
from specdec_tune.engine.eagle import EagleHead
from specdec_tune.engine.eagle_layout import ARCHITECTURES, WEIGHTS, is_eagle3_config

# The target's fields a head copies (its layer has the target's width, heads and RoPE).
_COPIED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
           "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_parameters", "rope_scaling",
           "rope_theta", "vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "attention_bias",
           "mlp_bias", "initializer_range")


def head_config(target_config: dict, draft_vocab_size: int, layer_ids: tuple[int, ...] | None = None) -> dict:
    """The ``config.json`` of a head for a target with ``target_config`` (a dict).

    ``layer_ids`` ``None`` names no layers: both servers then read their common defaults, which the
    engine reads too (``engine.eagle`` module docstring, on the servers' two meanings of explicit ids).
    """
    out = {k: target_config[k] for k in _COPIED if k in target_config}
    eagle: dict = {"use_aux_hidden_state": True}
    if layer_ids is not None:
        eagle["eagle_aux_hidden_state_layer_ids"] = list(layer_ids)
    out.update(architectures=[ARCHITECTURES[0]], model_type="llama", num_hidden_layers=1,
               draft_vocab_size=int(draft_vocab_size), target_hidden_size=int(target_config["hidden_size"]),
               tie_word_embeddings=False, eagle_config=eagle, dtype="float16")
    return out


def save_head(head: EagleHead, folder: Path, dtype: torch.dtype = torch.float16) -> None:
    """Write ``config.json`` and ``model.safetensors`` into ``folder`` (created)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {}
    for name, t in head.state_dict().items():
        t = t.detach().to("cpu")
        weights[name] = t.to(dtype).contiguous() if t.is_floating_point() else t.contiguous()
    save_file(weights, str(folder / WEIGHTS), metadata={"format": "pt"})
    config = {**head.raw_config, "dtype": str(dtype).replace("torch.", "")}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def load_head(folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> EagleHead:
    """An :class:`EagleHead` from ``folder`` in eval mode, its weights checked against its config.

    Raises:
        ModelLoadError: no EAGLE-3 config, no weights, or a missing, extra or misshapen weight.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read the EAGLE-3 head's config in {str(folder)!r}: {exc}") from exc
    if not is_eagle3_config(config):
        raise ModelLoadError(f"{str(folder)!r} is not an EAGLE-3 head (architectures {config.get('architectures')}, "
                             f"expected one of {', '.join(ARCHITECTURES)})")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"EAGLE-3 head {str(folder)!r} has no .safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    head = EagleHead(config)
    _check_weights(head, weights, folder)
    own = "embed_tokens.weight" in weights
    if "d2t" not in weights:  # a head over the whole vocabulary may leave the mapping out (vLLM does then)
        weights["d2t"] = head.d2t
    state = {k: v for k, v in weights.items() if k in head.state_dict() and k != "t2d"}
    head.load_state_dict(state, strict=False)
    head.t2d.zero_().index_fill_(0, head.target_ids(), True)  # what the loaders skip, derived from d2t
    head.own_embedding = own
    head.to(device=device, dtype=dtype).eval()
    head.requires_grad_(False)
    return head


def _check_weights(head: EagleHead, weights: dict[str, torch.Tensor], folder: Path) -> None:
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    optional = {"embed_tokens.weight", "d2t", "t2d"}
    missing = sorted(set(expected) - set(weights) - optional)
    extra = sorted(set(weights) - set(expected))
    bad = sorted(k for k in set(expected) & set(weights) if tuple(weights[k].shape) != expected[k])
    if "d2t" not in weights and head.draft_vocab != head.config.vocab_size:
        missing.append("d2t (a draft vocabulary smaller than the target's needs its mapping)")
    if missing or extra or bad:
        what = "; ".join(part for part in (
            f"missing {', '.join(missing)}" if missing else "", f"unexpected {', '.join(extra)}" if extra else "",
            ", ".join(f"{k} has shape {tuple(weights[k].shape)}, the config says {expected[k]}" for k in bad)) if part)
        raise ModelLoadError(f"EAGLE-3 head {str(folder)!r} does not match its config: {what}")
