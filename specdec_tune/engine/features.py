"""The target's forward, chosen once per decode: plain, or one that also keeps the hidden states a
feature drafter (an EAGLE-3 head, ``engine.eagle``) reads.

The decode loops (``engine.decode``, ``engine.tree_decode``) call the chosen forward for their prefill
and for every verify, and never ask which kind runs (as they never ask which verifier runs). A drafter
that needs the target's hidden states carries a :class:`FeatureStore` (attribute ``features``);
:func:`choose_target_forward` then picks :class:`FeatureForward`, which asks the same verify forward for
the residual stream after the head's layers and writes it into the store at the rows' positions. So
there is no second target pass: vLLM likewise returns ``(hidden_states, aux_hidden_states)`` from the
target's one forward (``llama.LlamaModel.forward``) and hands them to the proposer.

Positions: the store's row p holds the features of the target's position p, the same index as the
target's KV cache. A chain verify writes consecutive rows; a tree verify writes its rows in fed order
and :meth:`TargetForward.compact` moves the accepted path's rows down as ``engine.tree.compact`` moves
the cache's, so after every cycle rows ``[0, cache length)`` are the committed positions' features.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import torch

from specdec_tune.engine.kvcache import PreallocatedCache, forward_with_cache
from specdec_tune.engine.lean import LeanCausalLM
from specdec_tune.engine.tree import tree_forward


class FeatureStore:
    """Target features by position, ``[max_len, n·H]`` preallocated; which layers it keeps is bound by the
    target (:meth:`bind`: the head's layer ids, or the defaults for that target's depth)."""

    def __init__(self, max_len: int, width: int, layer_ids: tuple[int, ...] | None, count: int) -> None:
        self.max_len, self.width = max_len, width
        self.layer_ids = layer_ids
        self.count = count  # how many layers (the head's fc reads count · target width)
        self.layers: tuple[int, ...] = layer_ids or ()
        self._rows: torch.Tensor | None = None

    def bind(self, target: torch.nn.Module) -> None:
        """Decide the target layers from the target's depth (``engine.eagle.default_aux_layers`` unless named)."""
        from specdec_tune.engine.eagle_layout import default_aux_layers

        layers = int(target.config.get_text_config(decoder=True).num_hidden_layers)
        self.layers = self.layer_ids or default_aux_layers(layers)
        if len(self.layers) != self.count or any(not 0 <= i <= layers for i in self.layers):
            raise ValueError(f"the head reads {self.count} target layers; {list(self.layers)} does not fit a target "
                             f"of {layers} layers")

    def write(self, start: int, rows: torch.Tensor) -> None:
        """Rows ``[k, n·H]`` at positions ``start..start + k - 1``."""
        if self._rows is None:
            self._rows = rows.new_empty(self.max_len, self.width)
        if start + rows.shape[0] > self.max_len:
            raise RuntimeError(f"feature store overflow: {start + rows.shape[0]} positions > {self.max_len}")
        self._rows[start:start + rows.shape[0]] = rows

    def read(self, start: int, end: int) -> torch.Tensor:
        """Rows ``[end - start, n·H]`` of positions ``start..end - 1``."""
        if self._rows is None:
            raise RuntimeError("no target features yet (the target forward was not the feature forward)")
        return self._rows[start:end]

    def compact(self, base: int, keep: Sequence[int]) -> None:
        """Keep rows ``base + keep[i]`` at ``base + i`` (a tree's accepted path, ``engine.tree.compact``)."""
        n = len(keep)
        if self._rows is not None and n and list(keep) != list(range(n)):
            src = torch.tensor(keep, dtype=torch.long, device=self._rows.device) + base
            self._rows[base:base + n] = self._rows[src]


class TargetForward(Protocol):
    def __call__(self, ids: torch.Tensor, cache: PreallocatedCache, keep: int) -> torch.Tensor:
        """Logits ``[keep, vocab]`` of the last ``keep`` of ``ids`` ``[k]`` (appended to ``cache``)."""
        ...

    def tree(self, ids: torch.Tensor, cache: PreallocatedCache, positions: torch.Tensor,
             mask: torch.Tensor) -> torch.Tensor:
        """Logits ``[k, vocab]`` of tree rows (``engine.tree.tree_forward``)."""
        ...

    def compact(self, base: int, keep: Sequence[int]) -> None:
        """The tree loop compacted the cache to ``keep`` after ``base``: follow it."""
        ...


class PlainForward:
    """The target's forward alone."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, ids: torch.Tensor, cache: PreallocatedCache, keep: int) -> torch.Tensor:
        return forward_with_cache(self.model, ids[None], cache, logits_to_keep=keep).logits[0]

    def tree(self, ids, cache, positions, mask) -> torch.Tensor:
        return tree_forward(self.model, ids, cache, positions, mask)

    def compact(self, base: int, keep: Sequence[int]) -> None:
        """Nothing kept beside the cache."""


class FeatureForward(PlainForward):
    """The target's forward that also writes the store's layers into ``store`` (one forward, not two)."""

    def __init__(self, model: torch.nn.Module, store: FeatureStore) -> None:
        super().__init__(model)
        store.bind(model)
        self.store = store

    def __call__(self, ids: torch.Tensor, cache: PreallocatedCache, keep: int) -> torch.Tensor:
        start = cache.get_seq_length()
        if isinstance(self.model, LeanCausalLM):
            out = self.model(input_ids=ids[None], cache=cache, logits_to_keep=keep, aux_layers=self.store.layers)
            self.store.write(start, out.aux[0])
            return out.logits[0]
        with hf_hidden_states(self.model, self.store.layers) as got:
            logits = super().__call__(ids, cache, keep)
        self.store.write(start, got()[0])
        return logits

    def tree(self, ids, cache, positions, mask) -> torch.Tensor:
        start = cache.get_seq_length()
        if isinstance(self.model, LeanCausalLM):
            out = self.model(input_ids=ids[None], cache=cache, logits_to_keep=ids.shape[0], tree=(positions, mask),
                             aux_layers=self.store.layers)
            self.store.write(start, out.aux[0])
            return out.logits[0]
        with hf_hidden_states(self.model, self.store.layers) as got:
            logits = super().tree(ids, cache, positions, mask)
        self.store.write(start, got()[0])
        return logits

    def compact(self, base: int, keep: Sequence[int]) -> None:
        self.store.compact(base, keep)


def choose_target_forward(model: torch.nn.Module, drafter: object) -> PlainForward:
    """The forward a drafter needs: :class:`FeatureForward` into its store when it has one, else plain."""
    store = getattr(drafter, "features", None)
    return FeatureForward(model, store) if isinstance(store, FeatureStore) else PlainForward(model)


@contextmanager
def hf_hidden_states(model: torch.nn.Module, layers: Sequence[int]) -> Iterator:
    """Forward hooks on a Hugging Face model's embedding and decoder layers that keep the residual stream
    after each of ``layers`` layers; yields a function returning them concatenated ``[B, k, n·H]``.

    Hooks, not ``output_hidden_states``: what that tuple's last entry holds (before or after the final
    norm) has changed between transformers versions; a decoder layer's output has not."""
    base = model.model
    kept: dict[int, torch.Tensor] = {}

    def keeper(i: int):
        def hook(module, args, output):
            kept[i] = (output[0] if isinstance(output, tuple) else output).detach().clone()
        return hook

    handles = [(base.embed_tokens if i == 0 else base.layers[i - 1]).register_forward_hook(keeper(i)) for i in layers]
    try:
        yield lambda: torch.cat([kept[i] for i in sorted(layers)], dim=-1)
    finally:
        for h in handles:
            h.remove()
