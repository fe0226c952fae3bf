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

A few tokens at once (a verify step, a short prefill: 2 to 128 tokens) on a CPU in float32 run their
matrix products on weights repacked once into oneDNN's blocked layout (``torch.ops.mkldnn``, what
vLLM's CPU backend and inductor's CPU freezing use), q/k/v and gate/up each concatenated into one
product: the weights stream from memory either way, and the blocked kernels stream them better. One
token (a plain decode step, a draft step) and long prefills keep the model's own
weights, and the residual adds and SiLU stay separate operators: packed kernels at one token, MKL's
GEMM at ~200 tokens and oneDNN's fused post-ops all measured slower. The packed copy costs the
model's weight memory once more (models over ``PACK_MAX_BYTES`` are not packed); it is rebuilt when
a weight changes in place or moves (``_version``/``data_ptr``) and never written back. Results agree
with the unpacked products to float32 rounding (the greedy outputs the tests compare are unchanged).

On a CPU in float32 the small operators between the matrix products (RMSNorm with the residual add,
rotary embedding with the cache write, one-query attention, the SiLU gate) run as fused C++ kernels
(:mod:`lean_kernels`, built once per machine), where eager PyTorch spends most of a layer's time in
operator dispatch (measured against the eager operators, with identical greedy outputs: docs/results.md,
Engine: the lean forward and its kernels). Without a compiler
(or with ``SPECDEC_LEAN_KERNELS=0``) the eager operators run the same function.

Supported: ``llama``, ``mistral`` without a sliding window and ``qwen2`` without a sliding window, with
position-only RoPE (``default``, ``linear``, ``llama3``). :func:`lean_unsupported` names the reason for
any other model, which then runs through HF's forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec_tune.engine import lean_kernels
from specdec_tune.engine.kvcache import PreallocatedCache, forward_with_cache
from specdec_tune.engine.lean_ops import (  # noqa: F401 - _cat_bias, _rms_norm: cuda_graphs reads them here
    _cat_bias, _keep, _pack, _packed_linear, _packing_supported, _rms_norm, _rotate)

FORWARDS = ("auto", "lean", "hf")
_MODEL_TYPES = ("llama", "mistral", "qwen2")
_ROPE_TYPES = ("default", "linear", "llama3")
_GQA_ARG = torch.__version__ >= "2.5"  # scaled_dot_product_attention(enable_gqa=...) appeared in torch 2.5
PACKED_MIN_TOKENS = 2  # forwards of 2..128 tokens use the packed weights (CPU, float32); measured here:
PACKED_MAX_TOKENS = 128  # slower than the model's own weights at 1 token and from about 200 tokens (MKL's GEMM)
PACK_MAX_BYTES = 1 << 30  # a larger model is not packed: its second copy would cost too much memory


@dataclass
class LeanOutput:
    """What the engine reads from a forward (HF's output has the same attribute); ``aux`` ``[B, k, n·H]``:
    the residual stream after each of the asked layers, concatenated in layer order (``engine.features``)."""

    logits: torch.Tensor
    aux: torch.Tensor | None = None


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
        self._packed: tuple | None = None  # (key, per-layer packed weights, packed head) or None
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        # False: every forward uses the model's own weights
        self.packing = _packing_supported() and weight_bytes <= PACK_MAX_BYTES
        # False: the small per-layer operators run eagerly (the fused kernels are an optimisation only)
        self.use_kernels = True
        self.cuda_graph_runner = None  # engine.cuda_graphs.GraphRunner when its forwards replay CUDA graphs
        first = next(model.parameters(), None)
        if first is not None and first.device.type == "cpu" and first.dtype == torch.float32:
            lean_kernels.kernels()  # build or load now, not inside the first timed forward

    def _weights_key(self) -> tuple:
        params = [self._embed, self._norm, self._head] + [w for layer in self._layers for w in layer if w is not None]
        # Inference tensors (weights made under torch.inference_mode) have no version counter: they cannot
        # change in place outside inference mode anyway.
        return tuple((p.data_ptr(), 0 if p.is_inference() else p._version, p.device, p.dtype) for p in params)

    def _packed_weights(self, like: torch.Tensor) -> tuple | None:
        """oneDNN-packed weights for multi-token forwards, or None where they do not apply."""
        if not self.packing or like.device.type != "cpu" or like.dtype != torch.float32:
            return None
        key = self._weights_key()
        if self._packed is None or self._packed[0] != key:
            layers = []
            for (_, wq, bq, wk, bk, wv, bv, wo, bo, _, wg, bg, wu, bu, wd, bd) in self._layers:
                qkv, gu = (wq, wk, wv), (wg, wu)
                layers.append((_pack(torch.cat([w.detach() for w in qkv])), _cat_bias(bq, bk, bv, weights=qkv),
                               _pack(wo), None if bo is None else bo.detach(),
                               _pack(torch.cat([w.detach() for w in gu])), _cat_bias(bg, bu, weights=gu),
                               _pack(wd), None if bd is None else bd.detach()))
            bias = None if self._head_bias is None else self._head_bias.detach()
            self._packed = (key, layers, _pack(self._head), bias)
        return self._packed

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

    def forward(self, input_ids=None, cache=None, use_cache=True, logits_to_keep=0, past_key_values=None, tree=None,
                aux_layers=None, **kwargs):
        """HF-style call; ``tree`` = (positions ``[k]``, mask ``[k, cached + k]``) runs a token tree
        (``engine.tree.tree_forward``): new row i sits at position positions[i] and attends to the
        cached and new rows its mask allows. ``aux_layers``: also return the residual stream after
        those layers (0: the embedding), ``LeanOutput.aux``, what an EAGLE-3 head reads."""
        cache = cache if cache is not None else past_key_values  # either keyword, as transformers 5.x takes them
        if kwargs or input_ids is None or not use_cache or not isinstance(cache, PreallocatedCache) \
                or not isinstance(logits_to_keep, int):
            if tree is not None or aux_layers:
                raise ValueError("a tree forward or hidden states need the engine's preallocated cache and no other "
                                 "arguments (engine.features runs Hugging Face's forward for the others)")
            return forward_with_cache(self.hf, input_ids, cache, use_cache=use_cache, logits_to_keep=logits_to_keep,
                                      **kwargs)
        aux = dict.fromkeys(aux_layers) if aux_layers else None  # layer -> its residual, filled by the layers
        if torch.is_grad_enabled():
            with torch.no_grad():
                out = self._lean(input_ids, cache, logits_to_keep, tree, aux)
        else:
            out = self._lean(input_ids, cache, logits_to_keep, tree, aux)
        if aux:
            out.aux = torch.cat([aux[i] for i in sorted(aux)], dim=-1)
        return out

    def _positions(self, start: int, k: int, x: torch.Tensor, tree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """cos, sin ``[k, D]`` and the attention mask ``[k, start + k]`` (None for one token) of the new rows."""
        cos, sin = self._rope(start + k, x)
        if tree is not None:  # token tree: row i at its own position, attending where its mask allows
            at, mask = tree
            return cos[at].contiguous(), sin[at].contiguous(), mask
        mask = None
        if k > 1:  # causal within the new tokens; every cached position is visible
            pos = torch.arange(start + k, device=x.device)
            mask = pos[None, :] <= pos[start:, None]  # [k, start + k]
        return cos[start:start + k], sin[start:start + k], mask  # [k, D], broadcast over [B, H, k, D]

    def _lean(self, input_ids: torch.Tensor, cache: PreallocatedCache, logits_to_keep: int, tree=None,
              aux: dict | None = None) -> LeanOutput:
        runner = self.cuda_graph_runner
        if runner is not None and getattr(cache, "runner", None) is runner and aux is None:
            logits = runner.forward(input_ids, cache, logits_to_keep, tree)  # None: eager, on the graphs' cache
            if logits is not None:
                return LeanOutput(logits=logits)
        batch, k = input_ids.shape
        start = cache.get_seq_length()
        x = F.embedding(input_ids, self._embed)
        cos, sin, mask = self._positions(start, k, x, tree)
        causal = start == 0 and k > 1 and tree is None  # a prefill: SDPA's own causal kernel
        hq, hkv, d, eps = self.num_heads, self.num_kv_heads, self.head_dim, self.eps
        gqa = {"enable_gqa": True} if hq != hkv and _GQA_ARG else {}
        packed = self._packed_weights(x) if PACKED_MIN_TOKENS <= k <= PACKED_MAX_TOKENS else None
        fused = lean_kernels.kernels() if self.use_kernels and x.device.type == "cpu" and x.dtype == torch.float32 \
            else None
        if fused is not None:
            h = self._fused_layers(fused, x, cache, packed, cos, sin, mask, causal, gqa, aux)
            if logits_to_keep:
                h = h[:, -logits_to_keep:]
            if packed is not None:
                return LeanOutput(logits=_packed_linear(h, packed[2], packed[3]))
            return LeanOutput(logits=F.linear(h, self._head, self._head_bias))
        if packed is not None:
            x = self._packed_layers(x, cache, packed[1], cos, sin, mask, causal, gqa, aux)
            if logits_to_keep:
                x = x[:, -logits_to_keep:]
            return LeanOutput(logits=_packed_linear(_rms_norm(x, self._norm, eps), packed[2], packed[3]))
        for i, (layer, (ln1, wq, bq, wk, bk, wv, bv, wo, bo, ln2, wg, bg, wu, bu, wd, bd)) in \
                enumerate(zip(cache.layers, self._layers)):
            _keep(aux, i, x)
            h = _rms_norm(x, ln1, eps)
            q = _rotate(F.linear(h, wq, bq).view(batch, k, hq, d).transpose(1, 2), cos, sin)
            key = _rotate(F.linear(h, wk, bk).view(batch, k, hkv, d).transpose(1, 2), cos, sin)
            value = F.linear(h, wv, bv).view(batch, k, hkv, d).transpose(1, 2)
            keys, values = layer.update(key, value)
            x = x + F.linear(self._attend(q, keys, values, mask, causal, gqa), wo, bo)
            h = _rms_norm(x, ln2, eps)
            x = x + F.linear(F.silu(F.linear(h, wg, bg)) * F.linear(h, wu, bu), wd, bd)
        _keep(aux, len(self._layers), x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return LeanOutput(logits=F.linear(_rms_norm(x, self._norm, eps), self._head, self._head_bias))

    def _attend(self, q, keys, values, mask, causal: bool, gqa: dict) -> torch.Tensor:
        """Attention of the new positions over the cache, as ``[B, k, heads × head_dim]``. ``causal``
        (a prefill: nothing cached before the new tokens) lets SDPA use its own causal kernel."""
        hq, hkv = self.num_heads, self.num_kv_heads
        if hq != hkv and not gqa:
            keys = keys.repeat_interleave(hq // hkv, dim=1)
            values = values.repeat_interleave(hq // hkv, dim=1)
        if causal:
            att = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=self.scaling, **gqa)
        else:
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, **gqa)
        b, _, k, _ = q.shape
        return att.transpose(1, 2).reshape(b, k, hq * self.head_dim)

    def _fused_layers(self, kern, x, cache, packed, cos, sin, mask, causal: bool, gqa: dict, aux=None) -> torch.Tensor:
        """The decoder layers with the fused CPU kernels (:mod:`lean_kernels`), on the packed weights
        when given, else the model's own; returns the final-normed hidden states (same function)."""
        batch, k, _ = x.shape
        hq, hkv, d, eps = self.num_heads, self.num_kv_heads, self.head_dim, self.eps
        nq, nkv = hq * d, hkv * d
        delta = None
        for i, (layer, w) in enumerate(zip(cache.layers, self._layers)):
            h = kern.rms_norm(x, w[0], eps) if delta is None else kern.add_rms_norm(x, delta, w[0], eps)
            _keep(aux, i, x)  # x is the residual after i layers once the previous layer's delta is added
            if packed is not None:
                wqkv, bqkv, wo, bo, wgu, bgu, wd, bd = packed[1][i]
                qkv = _packed_linear(h, wqkv, bqkv)
                q, key, value = qkv[..., :nq], qkv[..., nq:nq + nkv], qkv[..., nq + nkv:]
            else:
                _, wq, bq, wk, bk, wv, bv, wo, bo, _, wg, bg, wu, bu, wd, bd = w
                q, key, value = F.linear(h, wq, bq), F.linear(h, wk, bk), F.linear(h, wv, bv)
            kbuf, vbuf, pos = layer.reserve(k, batch, hkv, d, x)
            q = kern.rope_cache(q, key, value, cos, sin, kbuf, vbuf, pos)
            end = pos + k
            if k == 1:  # one query: the kernel's loop beats SDPA's setup (measured; SDPA wins from 2 on)
                att = kern.attention(q, kbuf, vbuf, pos, self.scaling)
            else:
                att = self._attend(q, kbuf[:, :, :end], vbuf[:, :, :end], mask, causal, gqa)
            delta = _packed_linear(att, wo, bo) if packed is not None else F.linear(att, wo, bo)
            h = kern.add_rms_norm(x, delta, w[9], eps)
            if packed is not None:
                gu = _packed_linear(h, wgu, bgu)
                half = gu.shape[-1] // 2
                act = kern.silu_mul(gu[..., :half], gu[..., half:])
                delta = _packed_linear(act, wd, bd)
            else:
                delta = F.linear(kern.silu_mul(F.linear(h, wg, bg), F.linear(h, wu, bu)), wd, bd)
        out = kern.rms_norm(x, self._norm, eps) if delta is None else kern.add_rms_norm(x, delta, self._norm, eps)
        _keep(aux, len(self._layers), x)
        return out

    def _packed_layers(self, x, cache, packed, cos, sin, mask, causal: bool, gqa: dict, aux=None) -> torch.Tensor:
        """The decoder layers of a multi-token forward on the packed weights (same function)."""
        batch, k, _ = x.shape
        hq, hkv, d, eps = self.num_heads, self.num_kv_heads, self.head_dim, self.eps
        for i, (layer, weights, (wqkv, bqkv, wo, bo, wgu, bgu, wd, bd)) in enumerate(zip(cache.layers, self._layers, packed)):
            _keep(aux, i, x)
            h = _rms_norm(x, weights[0], eps)
            qkv = _packed_linear(h, wqkv, bqkv).view(batch, k, hq + 2 * hkv, d).transpose(1, 2)
            qk = _rotate(qkv[:, :hq + hkv], cos, sin)  # q and k rotate by the same positions: one call
            keys, values = layer.update(qk[:, hq:], qkv[:, hq + hkv:])
            x = x + _packed_linear(self._attend(qk[:, :hq], keys, values, mask, causal, gqa), wo, bo)
            h = _rms_norm(x, weights[9], eps)
            gate, up = _packed_linear(h, wgu, bgu).chunk(2, dim=-1)
            x = x + _packed_linear(F.silu(gate) * up, wd, bd)
        _keep(aux, len(self._layers), x)
        return x


def wrap_forward(model: torch.nn.Module, forward: str = "auto", cuda_graphs: str = "auto") -> torch.nn.Module:
    """The module the engine should call: the lean wrapper or the HF model itself.

    Args:
        forward: ``auto`` (lean when supported), ``lean`` (required; refused with the reason
            otherwise) or ``hf`` (HF's own forward).
        cuda_graphs: ``auto`` (the lean forward on CUDA replays CUDA graphs), ``on`` (required: refused
            off CUDA or without the lean forward) or ``off`` (:mod:`engine.cuda_graphs`).

    Raises:
        ValueError: ``forward`` is unknown, or ``lean`` was asked for a model it cannot run.
    """
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    if isinstance(model, LeanCausalLM):
        model = model.hf
    from specdec_tune.engine import cuda_graphs as graphs  # the parameter has the module's name

    graphs.check_mode(cuda_graphs)
    if forward == "hf" or (forward == "auto" and lean_unsupported(model) is not None):
        if cuda_graphs == "on":
            raise ValueError("--cuda-graphs on needs the lean forward (this model runs Hugging Face's)")
        return model
    lean = LeanCausalLM(model)
    graphs.attach(lean, cuda_graphs)
    return lean


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model behind ``model`` (itself when it is not wrapped)."""
    return model.hf if isinstance(model, LeanCausalLM) else model
