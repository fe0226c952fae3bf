"""A lean decoder forward for Llama-family models, on the engine's preallocated KV cache.

Why: at the sizes a draft model has (and on a CPU, at every size of the bundled zoo) a Hugging Face
forward spends more time in Python module machinery (per-layer kwargs, mask creation, attention
dispatch, output dataclasses) than in matrix products. Servers (vLLM, SGLang, TensorRT-LLM) run their
own model code for the same reason, so an engine that measures T_s and T_v for them must not carry
that overhead either.

:class:`LeanCausalLM` wraps a loaded HF model and computes exactly the same function from the same
weights (no copy, no fusion, nothing written into the model): embedding, per layer RMSNorm ->
q/k/v projections -> rotary embedding -> cache write -> scaled-dot-product attention -> o_proj ->
residual -> RMSNorm -> SiLU-gated MLP -> residual, final norm and ``lm_head`` on the last
``logits_to_keep`` positions. It is an ``nn.Module`` called like the HF model, so forward hooks (the
profiler's timers) see it; any call it does not handle (no preallocated cache, an attention mask,
extra arguments) goes to the wrapped HF model unchanged.

Supported: ``llama``, ``mistral`` without a sliding window and ``qwen2`` without a sliding window, with
position-only RoPE (``default``, ``linear``, ``llama3``). :func:`lean_unsupported` names the reason for
any other model, which then runs through HF's forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec_tune.engine.kvcache import PreallocatedCache

FORWARDS = ("auto", "lean", "hf")
_MODEL_TYPES = ("llama", "mistral", "qwen2")
_ROPE_TYPES = ("default", "linear", "llama3")
_GQA_ARG = torch.__version__ >= "2.5"  # scaled_dot_product_attention(enable_gqa=...) appeared in torch 2.5


@dataclass
class LeanOutput:
    """What the engine reads from a forward (HF's output has the same attribute)."""

    logits: torch.Tensor


def _rope_type(config) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")) or "default")


def lean_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot run the lean forward, or None when it can."""
    config = getattr(model, "config", None)
    if config is None:
        return "it has no config"
    kind = getattr(config, "model_type", None)
    if kind not in _MODEL_TYPES:
        return f"model type {kind!r} is not one of {', '.join(_MODEL_TYPES)}"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return "it uses sliding-window attention"
    if _rope_type(config) not in _ROPE_TYPES:
        return f"its RoPE type {_rope_type(config)!r} depends on the sequence length"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its activation {config.hidden_act!r} is not silu"
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None or not hasattr(base, "rotary_emb") or not hasattr(model, "lm_head"):
        return "it does not have the Llama module layout (model.layers, model.rotary_emb, lm_head)"
    attn = layers[0].self_attn
    if any(hasattr(attn, name) for name in ("q_norm", "k_norm")):
        return "its attention normalises queries and keys"
    if any(getattr(layer.mlp, "gate_proj", None) is None for layer in layers):
        return "its MLP is not gated"
    return None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: computed in float32, cast back, then scaled."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LeanCausalLM(torch.nn.Module):
    """The lean forward around one HF Llama-family model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(f"the lean forward cannot run this model: {reason}")
        super().__init__()
        self.hf = model
        config = model.config.get_text_config(decoder=True)
        base = model.model
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.num_heads)
        self.scaling = self.head_dim ** -0.5
        self.eps = float(config.rms_norm_eps)
        # Parameter objects (not their data): they follow the model through .to() and in-place edits.
        self._embed = base.embed_tokens.weight
        self._norm = base.norm.weight
        self._head = model.lm_head.weight
        self._head_bias = model.lm_head.bias
        self._layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            self._layers.append((
                layer.input_layernorm.weight,
                a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias, a.v_proj.weight, a.v_proj.bias,
                a.o_proj.weight, a.o_proj.bias,
                layer.post_attention_layernorm.weight,
                m.gate_proj.weight, m.gate_proj.bias, m.up_proj.weight, m.up_proj.bias, m.down_proj.weight, m.down_proj.bias,
            ))
        self._cos: torch.Tensor | None = None  # [positions, head_dim]
        self._sin: torch.Tensor | None = None

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules") or {}
            if "hf" not in modules:
                raise
            return getattr(modules["hf"], name)  # config, generation_config, device, dtype, ...

    def _rope(self, end: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables covering positions ``[0, end)`` from the model's own rotary module."""
        cos = self._cos
        if cos is None or cos.shape[0] < end or cos.device != like.device or cos.dtype != like.dtype:
            size = max(end, 2 * (cos.shape[0] if cos is not None else 0), 256)
            positions = torch.arange(size, device=like.device)[None]
            with torch.no_grad():
                c, s = self.hf.model.rotary_emb(like, position_ids=positions)
            self._cos, self._sin = c[0].to(like.dtype), s[0].to(like.dtype)
        return self._cos, self._sin

    def forward(self, input_ids=None, past_key_values=None, use_cache=True, logits_to_keep=0, **kwargs):
        cache = past_key_values
        if kwargs or input_ids is None or not use_cache or not isinstance(cache, PreallocatedCache) \
                or not isinstance(logits_to_keep, int):
            return self.hf(input_ids=input_ids, past_key_values=past_key_values, use_cache=use_cache,
                           logits_to_keep=logits_to_keep, **kwargs)
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self._lean(input_ids, cache, logits_to_keep)
        return self._lean(input_ids, cache, logits_to_keep)

    def _lean(self, input_ids: torch.Tensor, cache: PreallocatedCache, logits_to_keep: int) -> LeanOutput:
        batch, k = input_ids.shape
        start = cache.get_seq_length()
        x = F.embedding(input_ids, self._embed)
        cos, sin = self._rope(start + k, x)
        cos, sin = cos[start:start + k], sin[start:start + k]  # [k, D], broadcast over [B, H, k, D]
        mask = None
        if k > 1:  # causal within the new tokens; every cached position is visible
            pos = torch.arange(start + k, device=x.device)
            mask = pos[None, :] <= pos[start:, None]  # [k, start + k]
        hq, hkv, d, eps = self.num_heads, self.num_kv_heads, self.head_dim, self.eps
        gqa = {"enable_gqa": True} if hq != hkv and _GQA_ARG else {}
        for layer, (ln1, wq, bq, wk, bk, wv, bv, wo, bo, ln2, wg, bg, wu, bu, wd, bd) in zip(cache.layers, self._layers):
            h = _rms_norm(x, ln1, eps)
            q = _rotate(F.linear(h, wq, bq).view(batch, k, hq, d).transpose(1, 2), cos, sin)
            key = _rotate(F.linear(h, wk, bk).view(batch, k, hkv, d).transpose(1, 2), cos, sin)
            value = F.linear(h, wv, bv).view(batch, k, hkv, d).transpose(1, 2)
            keys, values = layer.update(key, value)
            if hq != hkv and not gqa:
                keys = keys.repeat_interleave(hq // hkv, dim=1)
                values = values.repeat_interleave(hq // hkv, dim=1)
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, **gqa)
            x = x + F.linear(att.transpose(1, 2).reshape(batch, k, hq * d), wo, bo)
            h = _rms_norm(x, ln2, eps)
            x = x + F.linear(F.silu(F.linear(h, wg, bg)) * F.linear(h, wu, bu), wd, bd)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return LeanOutput(logits=F.linear(_rms_norm(x, self._norm, eps), self._head, self._head_bias))


def wrap_forward(model: torch.nn.Module, forward: str = "auto") -> torch.nn.Module:
    """The module the engine should call: the lean wrapper or the HF model itself.

    Args:
        forward: ``auto`` (lean when supported), ``lean`` (required; refused with the reason
            otherwise) or ``hf`` (HF's own forward).

    Raises:
        ValueError: ``forward`` is unknown, or ``lean`` was asked for a model it cannot run.
    """
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    if isinstance(model, LeanCausalLM):
        model = model.hf
    if forward == "hf" or (forward == "auto" and lean_unsupported(model) is not None):
        return model
    return LeanCausalLM(model)


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model behind ``model`` (itself when it is not wrapped)."""
    return model.hf if isinstance(model, LeanCausalLM) else model
