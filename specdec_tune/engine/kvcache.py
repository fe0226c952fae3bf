"""A preallocated KV cache with position-based rollback, usable by any HF causal LM.

Why not ``DynamicCache``: it grows by ``torch.cat`` on every forward (a copy of the whole cache per
step) and rolls back by slicing. Here each layer owns one buffer ``[batch, heads, max_len, head_dim]``
allocated once; a forward writes its new keys/values in place at the current length and attention
reads the view ``[:, :, :length]``; rollback just moves ``length`` back (stale entries are overwritten
by the next write). Attention therefore never looks at the unused tail, unlike HF's ``StaticCache``,
which attends over ``max_len`` positions under a mask.
"""
from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import Cache, DynamicLayer


class _PreallocatedLayer(DynamicLayer):
    """One attention layer's cache: fixed buffers, a write position, views handed to attention.

    ``keys``/``values`` (what HF's cache API exposes) are views computed on access, so a rollback is
    one integer assignment per layer, not two new views.
    """

    def __init__(self, max_len: int) -> None:
        self._k: torch.Tensor | None = None  # [B, H, max_len, D]
        self._v: torch.Tensor | None = None  # [B, H, max_len, Dv]
        self.length = 0
        super().__init__()
        self.max_len = max_len

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[:, :, :self.length]

    @keys.setter
    def keys(self, value) -> None:
        if value is not None:  # the base class initialises it to None; nothing else may replace the buffer
            raise AttributeError("the preallocated cache's keys are views of its buffer; use update/truncate")

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, :self.length]

    @values.setter
    def values(self, value) -> None:
        if value is not None:
            raise AttributeError("the preallocated cache's values are views of its buffer; use update/truncate")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self._allocate(b, h, d, value_states.shape[-1], key_states.dtype, key_states.device)

    def _allocate(self, batch: int, heads: int, dk: int, dv: int, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self._k = torch.empty((batch, heads, self.max_len, dk), dtype=dtype, device=device)
        self._v = torch.empty((batch, heads, self.max_len, dv), dtype=dtype, device=device)
        self.is_initialized = True

    def adopt(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Use ``keys``/``values`` ``[B, H, L >= max_len, D]`` as this layer's buffers (a CUDA-graph slot,
        :mod:`engine.cuda_graphs`): nothing is allocated, and nothing but the length moves them."""
        self._k, self._v = keys, values
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def reserve(self, count: int, batch: int, heads: int, head_dim: int, like: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Claim the next ``count`` positions for a writer that fills them itself (the lean forward's
        fused kernel): returns the whole key and value buffers and the first claimed position."""
        if not self.is_initialized:
            self._allocate(batch, heads, head_dim, head_dim, like.dtype, like.device)
        start = self.length
        if start + count > self.max_len:
            raise RuntimeError(f"KV cache overflow: {start + count} positions > preallocated {self.max_len}")
        self.length = start + count
        return self._k, self._v, start

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.max_len:
            raise RuntimeError(f"KV cache overflow: {end} positions > preallocated {self.max_len}")
        self._k[:, :, start:end].copy_(key_states)
        self._v[:, :, start:end].copy_(value_states)
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return self.max_len

    def crop(self, tokens_to_remove: int) -> None:
        # transformers 5 convention: a negative value removes that many tokens.
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        self.truncate(self.length + tokens_to_remove)

    def truncate(self, new_length: int) -> None:
        if not 0 <= new_length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {new_length}")
        self.length = new_length

    def reset(self) -> None:
        self.truncate(0)


class PreallocatedCache(Cache):
    """KV cache for every layer of one model, preallocated to ``max_len`` positions."""

    def __init__(self, num_layers: int, max_len: int) -> None:
        super().__init__(layers=[_PreallocatedLayer(max_len) for _ in range(num_layers)])
        self.max_len = max_len

    def truncate(self, new_length: int) -> None:
        """Roll every layer back to ``new_length`` cached positions."""
        for layer in self.layers:
            layer.truncate(new_length)


def make_cache(model: torch.nn.Module, max_len: int) -> PreallocatedCache:
    """A preallocated cache sized for ``max_len`` positions of ``model`` (for a lean forward replaying CUDA
    graphs, one whose buffers come from the graphs' static slots: :mod:`engine.cuda_graphs`)."""
    runner = getattr(model, "cuda_graph_runner", None)
    if runner is not None:
        return runner.cache(max_len)
    config = model.config.get_text_config(decoder=True)
    return PreallocatedCache(config.num_hidden_layers, max_len)


_CACHE_KWARG: dict[type, str] = {}


def cache_kwarg(model: torch.nn.Module) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` in transformers ≥ 5.24 (where
    ``past_key_values`` is deprecated, to be removed in 5.40), ``past_key_values`` before it."""
    kind = type(model)
    name = _CACHE_KWARG.get(kind)
    if name is None:
        params = inspect.signature(model.forward).parameters
        name = _CACHE_KWARG[kind] = "cache" if "cache" in params else "past_key_values"
    return name


def forward_with_cache(model: torch.nn.Module, input_ids: torch.Tensor | None, cache, **kwargs):
    """``model(input_ids=..., <cache keyword>=cache, use_cache=True, **kwargs)`` for any transformers 5.x."""
    kwargs.setdefault("use_cache", True)
    return model(input_ids=input_ids, **{cache_kwarg(model): cache}, **kwargs)
