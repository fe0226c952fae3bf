"""CUDA graphs for the lean forward: one-token draft steps and k-token verify forwards replayed, not launched.

Why: the bundled models (and any draft model) are far too small to keep a GPU busy. An eager forward of
the 16-layer, 192-wide target launches some 500 kernels, each costing the host several microseconds of
PyTorch dispatch while the GPU waits, so a forward costs its launches, not its arithmetic. vLLM, SGLang and
gpt-fast capture the decode forward once per shape into a CUDA graph and replay it; so does this engine.

How (gpt-fast's static-cache recipe, applied to :class:`~specdec_tune.engine.lean.LeanCausalLM`):

- A graph replays fixed kernels on fixed addresses, so the KV cache of a graphed forward must not move.
  :class:`GraphRunner` owns *slots*: per-layer key/value buffers ``[B, heads, L, head_dim]`` (L: the
  cache's length rounded up to a power of two, at least 256), zero-filled once. A cache made for a
  graphed model (:func:`~specdec_tune.engine.kvcache.make_cache`) is a :class:`GraphCache`; at its first
  forward it takes a free slot of its batch size and length, and gives it back when it is garbage
  collected. A decode allocates a cache per sequence, so consecutive sequences reuse one slot and its
  graphs; idle slots are kept (:meth:`GraphRunner._evict`: those without graphs go first), so prompts of
  several length buckets do not re-capture per sequence.
- A cache takes a slot of exactly its own length class, never a longer one: attention runs over the whole
  slot, so the slot's length sets a graphed forward's cost, and it must be a function of the decode's own
  length (prompt + room), the same in ``profile`` and ``measure``, not of whichever slots earlier work left
  idle (docs/architecture.md, Measurement rules).
- The graph's inputs are device tensors: the token ids ``[B, k]`` and the cache length. Positions are
  ``length + arange(k)``; the rotary tables are indexed by them, the new keys and values are written
  with ``index_copy_`` at them, and attention runs over all L positions of the slot under an additive
  mask that hides every position after each row's own (written or stale, always finite). That is the
  same function as the eager forward, which attends over the first ``length + k`` positions only.
- One graph per (slot, k, logits kept), captured on first use after two warm-up forwards on a side
  stream (PyTorch's rule for capture); the warm-ups run with the real inputs, so the keys and values
  they write are the ones the replay writes. The first verify of width k also captures every narrower
  verify (1..k - 1, on a prefix of its tokens: the keys they write are a prefix of its own).
  :func:`prepare_graphs` makes, outside any timed region, every graph a decode at N can replay
  (:func:`decode_keys`; the draft's catch-up (2, 1) included) on every idle slot, and the runner counts
  what it makes (:class:`GraphCounters`, on the CPU too), so a measurement can prove that nothing was
  captured or allocated while it timed.
- All graphs of a runner share one memory pool (as vLLM's do), kept alive by a trivial anchor graph
  (:meth:`GraphRunner._make_pool`). A replay's logits are copied out of the graph's static output (the
  drafter keeps one row per drafted token, and the next replay overwrites the static output).
- Graphed and eager forwards give identical outputs; what graphs gain on a GPU is measured in
  docs/results.md, GPU (H200).
- Graphed forwards: 1..``MAX_GRAPH_TOKENS`` new tokens on a cache that already holds some (a draft step,
  a verify, a plain decoding step). A prefill into an empty cache, a token tree and anything longer run
  the eager lean forward on the same slot buffers.
- No host synchronisation inside: replaying costs two small copies (ids, length) and the graph launch,
  so a speculative cycle keeps its one host read (the verdict).

On a CPU (``capture=False``) the runner runs the same static-cache function eagerly: tests check there
that it decodes exactly what the eager lean forward decodes. ``--cuda-graphs auto`` (the default) turns
graphs on for the lean forward on CUDA; ``on`` requires them; ``off`` runs eagerly.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from specdec_tune.engine.kvcache import PreallocatedCache
from specdec_tune.engine.lean import _GQA_ARG, PACK_MAX_BYTES, _cat_bias, _rms_norm
from specdec_tune.core.limits import GRAPH_MODES, MAX_GRAPH_TOKENS, slot_length
from specdec_tune.engine.graph_state import GraphCounters
# Idle slots kept for reuse: a profile's graphs live on the slots of its warm-ups and micro-benchmarks (up to
# one per length class and context timed), which must outlive the prefill stage's many graph-less caches ...
MAX_IDLE_SLOTS = 8
MAX_IDLE_BYTES = 2 << 30  # ... and at most this much idle key/value memory


def check_mode(mode: str) -> str:
    if mode not in GRAPH_MODES:
        raise ValueError(f"--cuda-graphs must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    return mode


def attention_mask(pos: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``[k, L]``: row i (at position ``pos[i]``) sees the slot positions up to its own."""
    visible = slots[None, :] <= pos[:, None]
    return torch.zeros(visible.shape, dtype=dtype, device=pos.device).masked_fill_(~visible, float("-inf"))


class GraphCache(PreallocatedCache):
    """A preallocated cache whose buffers are a :class:`GraphRunner` slot (bound at its first forward)."""

    def __init__(self, runner: GraphRunner, num_layers: int, max_len: int) -> None:
        super().__init__(num_layers, max_len)
        self.runner = runner
        self.slot: _Slot | None = None
        self.unbound = False  # True: its buffers were allocated elsewhere (HF's forward ran first): eager only


class _Slot:
    """Static key/value buffers for one live cache, and the graphs captured over them."""

    def __init__(self, layers: int, batch: int, heads: int, head_dim: int, length: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        with torch.inference_mode(False):  # normal tensors: copied into inside and outside inference mode
            self.keys = [torch.zeros(batch, heads, length, head_dim, dtype=dtype, device=device) for _ in range(layers)]
            self.values = [torch.zeros_like(k) for k in self.keys]
        self.batch, self.length, self.dtype, self.device = batch, length, dtype, device
        self.busy = False
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.nbytes = 2 * sum(t.numel() * t.element_size() for t in self.keys)

    def release(self) -> None:
        self.busy = False


class _Graph:
    """One captured forward: its static inputs, the tables it reads (``cos``, ``sin``: views that keep the
    rotary tables it was captured on alive; ``arange``) and its static output."""

    def __init__(self, ids: torch.Tensor, start: torch.Tensor, tables: dict[str, torch.Tensor]) -> None:
        self.ids, self.start, self.tables = ids, start, tables
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None


class GraphRunner:
    """Graphed (or, with ``capture=False``, static-cache eager) forwards of one :class:`LeanCausalLM`."""

    def __init__(self, lean, capture: bool = True) -> None:
        self.lean = lean
        self.capture = capture
        self.slots: list[_Slot] = []
        self.pool = None  # one CUDA memory pool for every graph of this model
        self._anchor: tuple | None = None  # a trivial graph that keeps the pool alive (see _make_pool)
        self.captured = 0  # graphs captured so far
        self.made = 0  # graphs made or attempted (on the CPU too: their static inputs)
        self.slots_made = 0  # slots allocated so far
        self.evicted = 0  # idle slots dropped so far
        self.failed: str | None = None  # why capture failed (then every forward runs eagerly)
        self._fused: tuple | None = None  # (weights key, per-layer concatenated q/k/v and gate/up weights)

    def cache(self, max_len: int) -> GraphCache:
        config = self.lean.config.get_text_config(decoder=True)
        return GraphCache(self, int(config.num_hidden_layers), max_len)

    def counters(self) -> GraphCounters:
        return GraphCounters(self.made, self.captured, len(self.slots), self.slots_made, self.evicted, self.failed)

    # -- slots ---------------------------------------------------------------------------------------------
    def _bind(self, cache: GraphCache, batch: int) -> _Slot | None:
        """The cache's slot (taken at its first forward), or None when it cannot have one."""
        if cache.slot is not None:
            return cache.slot if cache.slot.batch == batch else None
        if cache.unbound or any(layer.is_initialized for layer in cache.layers):
            cache.unbound = True
            return None
        lean = self.lean
        weight = lean._embed
        length = slot_length(cache.max_len)
        fits = [s for s in self.slots if not s.busy and s.batch == batch and s.length == length
                and s.dtype == weight.dtype and s.device == weight.device]  # its own class only (module docstring)
        slot = max(fits, key=lambda s: len(s.graphs)) if fits else None  # the one holding the most graphs
        if slot is None:
            self._evict()
            slot = _Slot(len(cache.layers), batch, lean.num_kv_heads, lean.head_dim, length, weight.dtype, weight.device)
            self.slots.append(slot)
            self.slots_made += 1
        slot.busy = True
        weakref.finalize(cache, slot.release)
        for layer, k, v in zip(cache.layers, slot.keys, slot.values):
            layer.adopt(k, v)
        cache.slot = slot
        self._check_weights()
        return slot

    def _evict(self) -> None:
        """Drop idle slots beyond ``MAX_IDLE_SLOTS`` or ``MAX_IDLE_BYTES``, those without graphs first (oldest
        first), those holding graphs only when no graph-less idle slot is left: prompts of alternating
        length buckets keep their slots and graphs (no re-capture per sequence, none inside a timed pass
        after the profile's prefill stage left a slot per prompt), while a sweep over batch sizes and
        contexts (``profile``) does not keep every cache it ever made."""
        idle = [s for s in self.slots if not s.busy]
        idle = [s for s in idle if not s.graphs] + [s for s in idle if s.graphs]
        size = sum(s.nbytes for s in idle)
        while idle and (len(idle) >= MAX_IDLE_SLOTS or size > MAX_IDLE_BYTES):
            gone = idle.pop(0)
            size -= gone.nbytes
            self.slots.remove(gone)
            self.evicted += 1

    def prepare(self, keys) -> int:
        """Make the graphs ``keys`` (``(new tokens, logits kept)`` pairs, ``engine.graph_state.decode_keys``) on
        every idle slot that lacks them and already replayed a decode's forward, outside any timed region;
        returns how many were made. A slot that never replayed one (an eager prefill's, the profile's
        prefill benchmark) gets none: a decode binds the slot of its class holding the most graphs. The
        inputs are placeholders written after the slot's first position: a slot holds stale keys anyway,
        and a decode writes every position before it attends to it."""
        before = self.made
        self._check_weights()
        with torch.inference_mode():
            for slot in [s for s in self.slots if not s.busy and s.graphs]:
                for k, keep in sorted(set(keys)):
                    if self.failed is not None:
                        return self.made - before
                    if (k, keep) not in slot.graphs and 1 <= keep <= k <= MAX_GRAPH_TOKENS:
                        ids = torch.zeros(slot.batch, k, dtype=torch.long, device=slot.device)
                        self._make(slot, ids, 1, keep)
        return self.made - before

    def _check_weights(self) -> None:
        """Drop every graph when a weight moved or changed in place since they were captured (checked
        once per cache, not per forward: weights do not change inside a decode)."""
        key = self.lean._weights_key()
        if self._fused is not None and self._fused[0] != key:
            self._fused = None
            for slot in self.slots:
                slot.graphs.clear()

    def _weights(self) -> list[tuple]:
        """Per layer: (qkv weight, qkv bias, gate/up weight, gate/up bias), concatenated once so a layer
        runs two projections where it would run five; None entries where concatenating would cost too
        much memory (``lean.PACK_MAX_BYTES``): then the model's own weights."""
        if self._fused is None:
            lean = self.lean
            small = sum(p.numel() * p.element_size() for p in lean.hf.parameters()) <= PACK_MAX_BYTES
            layers = []
            for (_, wq, bq, wk, bk, wv, bv, _, _, _, wg, bg, wu, bu, _, _) in lean._layers:
                if not small:
                    layers.append(None)
                    continue
                qkv, gu = (wq, wk, wv), (wg, wu)
                layers.append((torch.cat([w.detach() for w in qkv]), _cat_bias(bq, bk, bv, weights=qkv),
                               torch.cat([w.detach() for w in gu]), _cat_bias(bg, bu, weights=gu)))
            self._fused = (lean._weights_key(), layers)
        return self._fused[1]

    # -- forwards ------------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, cache: GraphCache, logits_to_keep: int, tree) -> torch.Tensor | None:
        """The logits of a graphed forward, or None when this forward must run eagerly (on the slot's
        buffers, bound here first)."""
        batch, k = input_ids.shape
        slot = self._bind(cache, batch)
        start = cache.get_seq_length()
        if slot is None or tree is not None or start == 0 or k > MAX_GRAPH_TOKENS or self.failed is not None:
            return None
        if start + k > cache.max_len:
            raise RuntimeError(f"KV cache overflow: {start + k} positions > preallocated {cache.max_len}")
        keep = logits_to_keep if 0 < logits_to_keep <= k else k
        graph = slot.graphs.get((k, keep))
        if graph is None:
            if keep == k > 1:  # a verify: capture every narrower verify now (they write a prefix of its keys)
                for j in range(1, k):
                    if (j, j) not in slot.graphs and self._make(slot, input_ids[:, :j], start, j) is None:
                        return None
            graph = self._make(slot, input_ids, start, keep)
            if graph is None:
                return None
        else:
            graph.ids.copy_(input_ids)
            graph.start.fill_(start)
        if graph.graph is not None:
            graph.graph.replay()
            out = graph.out.clone()
        else:  # CPU: the same static-cache function, run eagerly
            out = self._body(graph, slot, keep)
        for layer in cache.layers:
            layer.length = start + k
        return out

    def _make(self, slot: _Slot, input_ids: torch.Tensor, start: int, keep: int) -> _Graph | None:
        """Static inputs (holding this forward's ids and length) and, on CUDA, the captured graph."""
        lean = self.lean
        self.made += 1
        with torch.inference_mode(False):
            ids = input_ids.detach().clone()
            begin = torch.tensor(start, dtype=torch.long, device=input_ids.device)
        cos, sin = lean._rope(slot.length, slot.keys[0])
        graph = _Graph(ids, begin, {"cos": cos[:slot.length], "sin": sin[:slot.length],
                                    "arange": torch.arange(max(slot.length, ids.shape[1]), device=ids.device)})
        if not self.capture:
            slot.graphs[(ids.shape[1], keep)] = graph
            return graph
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-ups with the real inputs: they write the keys the replay writes
                    self._body(graph, slot, keep)
            torch.cuda.current_stream().wait_stream(side)
            self._make_pool(ids.device)
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph, pool=self.pool):
                out = self._body(graph, slot, keep)
        except Exception as exc:  # noqa: BLE001 - a capture that fails leaves the forward eager, said once
            self.failed = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            torch.cuda.synchronize()
            return None
        graph.graph, graph.out = cuda_graph, out
        slot.graphs[(ids.shape[1], keep)] = graph
        self.captured += 1
        return graph

    def _make_pool(self, device: torch.device) -> None:
        """The shared pool (:func:`anchored_pool`), made once for the runner's life."""
        if self.pool is None:
            self.pool, self._anchor = anchored_pool(device)

    def _body(self, graph: _Graph, slot: _Slot, keep: int) -> torch.Tensor:
        """The lean forward's function on the slot's static cache (the graph's kernels). Fewer kernels than
        the eager forward, the same arithmetic: q/k/v and gate/up as one product each, q and k rotated in
        one pass (``x·cos + roll(x, D/2)·[-sin, sin]`` is HF's rotate-half exactly), and below float32
        RMSNorm as torch's fused kernel on the input dtype (float32 inside, one rounding, as HF's)."""
        lean = self.lean
        ids, extra = graph.ids, graph.tables
        batch, k = ids.shape
        hq, hkv, d, eps = lean.num_heads, lean.num_kv_heads, lean.head_dim, lean.eps
        nq = hq * d
        gqa = {"enable_gqa": True} if hq != hkv and _GQA_ARG else {}
        pos = graph.start + extra["arange"][:k]  # [k]
        x = F.embedding(ids, lean._embed)
        cos, sin = extra["cos"].index_select(0, pos), extra["sin"].index_select(0, pos)  # [k, D]
        sin = torch.cat((-sin[:, :d // 2], sin[:, d // 2:]), dim=-1)  # rotate-half's signs, folded into sin
        mask = attention_mask(pos, extra["arange"][:slot.length], x.dtype)
        norm = _rms_norm if x.dtype == torch.float32 else _rms_fused  # float32: lean's own (one kernel)

        def rotate(t: torch.Tensor) -> torch.Tensor:  # [B, heads, k, D]
            return t * cos + t.roll(d // 2, dims=-1) * sin

        for i, (w, fused) in enumerate(zip(lean._layers, self._weights())):
            ln1, wq, bq, wk, bk, wv, bv, wo, bo, ln2, wg, bg, wu, bu, wd, bd = w
            h = norm(x, ln1, eps)
            if fused is not None:
                qkv = F.linear(h, fused[0], fused[1]).view(batch, k, hq + 2 * hkv, d).transpose(1, 2)
                qk = rotate(qkv[:, :hq + hkv])
                q, key, value = qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv:]
            else:
                q = rotate(F.linear(h, wq, bq).view(batch, k, hq, d).transpose(1, 2))
                key = rotate(F.linear(h, wk, bk).view(batch, k, hkv, d).transpose(1, 2))
                value = F.linear(h, wv, bv).view(batch, k, hkv, d).transpose(1, 2)
            slot.keys[i].index_copy_(2, pos, key)
            slot.values[i].index_copy_(2, pos, value)
            keys, values = slot.keys[i], slot.values[i]
            if hq != hkv and not gqa:
                keys, values = (t.repeat_interleave(hq // hkv, dim=1) for t in (keys, values))
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=lean.scaling, **gqa)
            x = x + F.linear(att.transpose(1, 2).reshape(batch, k, nq), wo, bo)
            h = norm(x, ln2, eps)
            if fused is not None:
                gate, up = F.linear(h, fused[2], fused[3]).chunk(2, dim=-1)
            else:
                gate, up = F.linear(h, wg, bg), F.linear(h, wu, bu)
            x = x + F.linear(F.silu(gate) * up, wd, bd)
        x = x[:, -keep:]
        return F.linear(norm(x, lean._norm, eps), lean._head, lean._head_bias)


def _rms_fused(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm below float32 (normalise in float32, round to the input dtype, then scale) in two
    kernels instead of four: torch's RMSNorm computes in float32 and rounds once to the input dtype."""
    return weight * F.rms_norm(x, weight.shape, None, eps)


def attach(lean, mode: str = "auto") -> None:
    """Give ``lean`` a :class:`GraphRunner` when ``mode`` asks for one on its device.

    Raises:
        ValueError: ``on`` for a model that is not on a CUDA device (``wrap_forward`` checks the mode).
    """
    device = lean._embed.device
    if mode == "on" and device.type != "cuda":
        raise ValueError(f"--cuda-graphs on needs the model on a CUDA device, not {device.type}")
    lean.cuda_graph_runner = GraphRunner(lean) if mode != "off" and device.type == "cuda" else None


def anchored_pool(device: torch.device) -> tuple[object, tuple]:
    """A CUDA graph memory pool and a trivial graph captured into it (keep both for the pool's life). A pool
    whose graphs are all destroyed (idle slots dropped, weights changed) keeps its id with a use count of 0,
    and a later capture into it fails PyTorch's assertion ``use_count > 0`` (seen on an H100, torch 2.11)."""
    pool = torch.cuda.graph_pool_handle()
    anchor = torch.cuda.CUDAGraph()
    with torch.cuda.graph(anchor, pool=pool):
        out = torch.ones(1, device=device) + 1
    return pool, (anchor, out)
