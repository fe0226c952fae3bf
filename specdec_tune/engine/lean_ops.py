"""The lean forward's small tensor operations (``engine.lean``): HF's RMSNorm and rotary rotation, oneDNN's
packed linear products, and the copy of a residual stream an EAGLE-3 head reads. Pure functions on tensors,
shared by the lean forward, its CUDA graphs and the EAGLE-3 head (``engine.eagle``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: computed in float32, cast back, then scaled."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


def _packing_supported() -> bool:
    mk = getattr(torch.ops, "mkldnn", None)
    return bool(torch.backends.mkldnn.is_available() and hasattr(mk, "_reorder_linear_weight")
                and hasattr(mk, "_linear_pointwise"))


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 8)


def _cat_bias(*biases: torch.Tensor | None, weights: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach() if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)])


def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _keep(aux: dict | None, layer: int, x: torch.Tensor) -> None:
    """Copy the residual stream after ``layer`` layers into ``aux`` when asked for (later layers change x)."""
    if aux is not None and layer in aux:
        aux[layer] = x.clone()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
