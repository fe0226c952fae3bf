"""CUDA graphs for the batched forward (``engine.ragged``): one graph per (padded batch size, width, logits kept).

Why and how as for one sequence (``engine.cuda_graphs``: the small models of this tool are launch-bound on a
GPU, so forwards are captured once and replayed), with what a batch adds:

- **Padding to captured batch sizes.** A graph has fixed shapes, so a batch of B rows runs on the graph of
  the smallest captured size >= B (``core.limits.BATCH_CAPTURE_SIZES``, vLLM's default list; vLLM pads the
  same way, ``_compute_bs_to_padded_graph_size`` in vllm/v1/cudagraph_dispatcher.py, and SGLang captures a
  list of batch sizes, docs/advanced_features/cuda_graphs.md). The padding rows (ids 0 at position 0) compute
  and are thrown away, so a step at B costs what it costs at the padded size: the throughput model prices the
  verify and draft forwards of a graphed batch as a step function of B (``ModelProfile.batch_graph_sizes``),
  as vLLM PR #47808 (DSpark confidence-scheduled verification) prices verification at its capture sizes and
  SGLang PR #35413 derives its verify-cost table at its capture tiers.
- **Ragged rows.** The graph's inputs are device tensors: ids ``[s, W]``, each row's start ``[s]`` and the
  position whose logits a row keeps ``[s]``; the body (:func:`engine.ragged.ragged_body`) writes keys at each
  row's own positions and attends over the whole slot under a per-row mask: no host synchronisation inside.
- **Slots.** A cache's buffers are a slot of ``padded rows x slot_length(max_len)`` positions, taken at its
  first forward and given back when the cache is collected, so the next batch of the same shape replays the
  graphs already captured. Compaction (a finished sequence leaving) moves rows within the slot, so graphs of
  smaller padded sizes read the same buffers.
- Eager on the slot's buffers: a prefill (every row's cache empty), widths over ``MAX_GRAPH_TOKENS``,
  batches over the largest captured size, and everything after a failed capture (said once, in ``failed``).

On a CPU (``capture=False``) the runner runs the same padded static function eagerly: the tests check there
that padding rows and whole-slot masks leave every row's output what the eager ragged forward gives.
Kept apart from ``engine.cuda_graphs`` (the one-sequence runner); the two share nothing but the rule of a
slot's length.
"""
from __future__ import annotations

import weakref

import torch

from specdec_tune.core.limits import BATCH_CAPTURE_SIZES, MAX_GRAPH_TOKENS, padded_batch_size, slot_length
from specdec_tune.engine.cuda_graphs import anchored_pool
from specdec_tune.engine.ragged import RaggedCache, ragged_body

MAX_IDLE_SLOTS = 4  # idle slots kept for reuse (oldest dropped first)


class _Slot:
    """Buffers for one live ragged cache and the graphs captured over them."""

    def __init__(self, cache: RaggedCache, capacity: int, length: int, lean) -> None:
        like = lean._embed
        cache.allocate(lean.num_kv_heads, lean.head_dim, lean.head_dim, like.dtype, like.device, capacity, length)
        self.keys, self.values = cache.keys, cache.values
        self.capacity, self.length, self.dtype, self.device = capacity, length, like.dtype, like.device
        self.busy = True
        self.graphs: dict[tuple[int, int, bool], _Graph] = {}

    def lend(self, cache: RaggedCache) -> None:
        cache.keys, cache.values = self.keys, self.values
        cache.capacity, cache.max_len = self.capacity, self.length
        self.busy = True

    def release(self) -> None:
        self.busy = False


class _Graph:
    """One captured batched forward: its static inputs and output."""

    def __init__(self, ids: torch.Tensor, starts: torch.Tensor, pick: torch.Tensor | None) -> None:
        self.ids, self.starts, self.pick = ids, starts, pick
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None


class BatchGraphRunner:
    """Graphed (or, with ``capture=False``, padded static eager) batched forwards of one lean model."""

    def __init__(self, lean, capture: bool = True, sizes: tuple[int, ...] = BATCH_CAPTURE_SIZES) -> None:
        self.lean, self.capture, self.sizes = lean, capture, tuple(sorted(sizes))
        self.slots: list[_Slot] = []
        self.pool = None
        self._anchor: tuple | None = None
        self.captured = 0
        self.failed: str | None = None

    def bind(self, cache: RaggedCache) -> bool:
        """Give ``cache`` a slot (once); False when its buffers were allocated elsewhere (then: eager)."""
        if cache.owner is self:
            return True
        if cache.allocated:
            return False
        capacity = padded_batch_size(cache.rows, self.sizes) or cache.rows
        length = slot_length(cache.max_len)
        weight = self.lean._embed
        fits = [s for s in self.slots if not s.busy and s.capacity == capacity and s.length >= length
                and s.dtype == weight.dtype and s.device == weight.device]
        if fits:
            slot = min(fits, key=lambda s: s.length)
            slot.lend(cache)
        else:
            idle = [s for s in self.slots if not s.busy]
            for gone in idle[:max(0, len(idle) - MAX_IDLE_SLOTS + 1)]:
                self.slots.remove(gone)
            slot = _Slot(cache, capacity, length, self.lean)
            self.slots.append(slot)
        weakref.finalize(cache, slot.release)
        cache.owner, cache.slot = self, slot
        return True

    def forward(self, ids: torch.Tensor, cache: RaggedCache, starts: torch.Tensor,
                pick: torch.Tensor | None) -> torch.Tensor | None:
        """The logits of a graphed forward, or None when this one runs eagerly (on the slot, bound here)."""
        if not self.bind(cache):
            return None
        rows, width = ids.shape
        size = padded_batch_size(rows, self.sizes)
        if size is None or size > cache.capacity or width > MAX_GRAPH_TOKENS or max(cache.lengths) == 0 \
                or self.failed is not None:
            return None
        key = (size, width, pick is not None)
        graph = cache.slot.graphs.get(key)
        fresh = graph is None
        if fresh:
            graph = self._inputs(size, width, pick is not None, cache.slot.device)
        graph.ids.zero_()
        graph.ids[:rows].copy_(ids)
        graph.starts.zero_()
        graph.starts[:rows].copy_(starts)
        if graph.pick is not None:
            graph.pick.zero_()
            graph.pick[:rows].copy_(pick)
        if fresh and not self._capture(graph, cache.slot, key):
            return None
        if graph.graph is not None:
            graph.graph.replay()
            return graph.out[:rows].clone()
        return self._body(graph, cache.slot)[:rows]

    def _body(self, graph: _Graph, slot: _Slot) -> torch.Tensor:
        table = self.lean._rope(slot.length, slot.keys[0])
        return ragged_body(self.lean, graph.ids, graph.starts, slot.keys, slot.values, slot.length, graph.pick,
                           tables=(table[0][:slot.length], table[1][:slot.length]))

    @staticmethod
    def _inputs(size: int, width: int, keep_last: bool, device: torch.device) -> _Graph:
        with torch.inference_mode(False):  # normal tensors: copied into inside and outside inference mode
            return _Graph(torch.zeros(size, width, dtype=torch.long, device=device),
                          torch.zeros(size, dtype=torch.long, device=device),
                          torch.zeros(size, dtype=torch.long, device=device) if keep_last else None)

    def _capture(self, graph: _Graph, slot: _Slot, key: tuple[int, int, bool]) -> bool:
        """Capture ``graph`` (its static inputs hold this forward's): two warm-ups on a side stream with the real
        inputs (they write the keys the replay writes, PyTorch's rule for capture), then the capture. On a CPU
        the static inputs are kept and the body runs eagerly. False: the capture failed (said in ``failed``)."""
        if not self.capture:
            slot.graphs[key] = graph
            return True
        self.lean._rope(slot.length, slot.keys[0])  # the rotary tables exist before capture
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._body(graph, slot)
            torch.cuda.current_stream().wait_stream(side)
            self._make_pool(slot.device)
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph, pool=self.pool):
                out = self._body(graph, slot)
        except Exception as exc:  # noqa: BLE001 - a capture that fails leaves the forward eager, said once
            self.failed = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            torch.cuda.synchronize()
            return False
        graph.graph, graph.out = cuda_graph, out
        slot.graphs[key] = graph
        self.captured += 1
        return True

    def _make_pool(self, device: torch.device) -> None:
        """One memory pool for every graph of this runner (``engine.cuda_graphs.anchored_pool``)."""
        if self.pool is None:
            self.pool, self._anchor = anchored_pool(device)


def runner_for(lean) -> BatchGraphRunner | None:
    """The lean model's batch graph runner: made on first use where the model replays CUDA graphs (the
    one-sequence runner is attached: ``--cuda-graphs`` auto or on, on CUDA), or one a test attached."""
    runner = lean.__dict__.get("batch_graph_runner")
    if runner is None and getattr(lean, "cuda_graph_runner", None) is not None:
        runner = lean.__dict__["batch_graph_runner"] = BatchGraphRunner(lean)
    return runner
