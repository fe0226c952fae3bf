"""Token trees in the engine: the drafted tree, its attention mask and positions, one forward over it,
and compaction of the KV cache to the accepted path (docs/architecture.md, Engine contracts).

A tree cycle feeds ``[last, n_0 .. n_{n-1}]`` (the last emitted token, then every drafted node
breadth first) to a model in one forward. Fed row 0 is the root; node i is fed row i + 1. Each row
attends to the whole cache and to its own ancestors in the tree (itself included), and sits at
position ``start + depth`` (SpecInfer, Miao et al. 2023, Section 4 "tree attention"; the "tree mask"
of Medusa and EAGLE). After the verdict the cache keeps the root and the accepted path only: the
path's keys and values are moved down to consecutive positions, which are exactly the positions
their rotary embedding was computed for, so nothing is recomputed.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from specdec_tune.engine.kvcache import PreallocatedCache, forward_with_cache
from specdec_tune.engine.lean import LeanCausalLM
from specdec_tune.core.trees import TreeShape


@dataclass(frozen=True)
class TokenTree:
    """One cycle's drafted tree: the contract between tree drafter, verifier and loop.

    Attributes:
        tokens: ``[n]`` node token ids, breadth first (a parent precedes its children).
        shape: parents and sibling ranks of the nodes.
        probs: ``[n, vocab]`` the distribution node i was drawn from (its parent's draft q), or
            ``None`` when every node is a deterministic proposal (greedy, top-k children or
            n-gram): sampling then treats node i as a point mass on its token.
    """

    tokens: torch.Tensor  # [n]
    shape: TreeShape
    probs: torch.Tensor | None = None  # [n, vocab]

    @property
    def size(self) -> int:
        return self.shape.size


def tree_attention(shape: TreeShape, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Position offsets ``[n + 1]`` (depth; 0 for the root) and the ancestor mask ``[n + 1, n + 1]``
    (True where fed row a may attend to fed row b: b is a or an ancestor of a; the root is everyone's).
    Built once per shape (a static shape repeats every cycle), then moved to ``device``."""
    offsets, mask = _tree_attention(shape)
    return offsets.to(device), mask.to(device)


@lru_cache(maxsize=256)
def _tree_attention(shape: TreeShape) -> tuple[torch.Tensor, torch.Tensor]:
    n = shape.size
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    mask[0, 0] = True
    for i, p in enumerate(shape.parents):
        if p >= 0:
            mask[i + 1] = mask[p + 1]
        mask[i + 1, i + 1] = True
    offsets = torch.tensor((0, *shape.depths), dtype=torch.long)
    return offsets, mask


def tree_forward(model: torch.nn.Module, ids: torch.Tensor, cache: PreallocatedCache, positions: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
    """One forward over the new rows ``ids`` ``[k]`` under a tree mask; logits ``[k, vocab]``.

    The lean forward takes positions and mask directly; an HF model gets position ids and a 4-D
    additive mask ``[1, 1, k, cached + k]``, which transformers 5.x passes through unchanged
    (``masking_utils._preprocess_mask_arguments``: "If the mask is already 4D, simply return as-is")
    to its eager and SDPA attention.

    Args:
        model: the target or the draft (lean wrapper or HF model).
        ids: ``[k]`` new token ids, appended at the cache's current length.
        cache: the model's preallocated cache.
        positions: ``[k]`` absolute position of each new row (its rotary embedding).
        mask: ``[k, cached + k]`` bool, True where new row a may attend to row b of the cache + new rows.
    """
    k = ids.shape[0]
    if isinstance(model, LeanCausalLM):
        return model(input_ids=ids[None], cache=cache, logits_to_keep=k, tree=(positions, mask)).logits[0]
    weight = next(model.parameters(), None)
    dtype = weight.dtype if weight is not None else torch.float32
    additive = torch.zeros(mask.shape, dtype=dtype, device=ids.device).masked_fill(~mask, torch.finfo(dtype).min)
    out = forward_with_cache(model, ids[None], cache, attention_mask=additive[None, None], position_ids=positions[None],
                             logits_to_keep=k)
    return out.logits[0]


def verify_rows(shape: TreeShape, start: int, device: torch.device | str = "cpu"
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the target's verify forward over ``[last, nodes]`` needs when ``start`` positions are cached:
    positions ``[n + 1]``, the full mask ``[n + 1, start + n + 1]`` and the ancestor mask ``[n + 1, n + 1]``."""
    offsets, ancestors = tree_attention(shape, device)
    visible = torch.ones(shape.size + 1, start, dtype=torch.bool, device=device)
    return offsets + start, torch.cat([visible, ancestors], dim=1), ancestors


def compact(cache: PreallocatedCache, base: int, keep: Sequence[int]) -> None:
    """Keep cache positions ``base + keep[i]`` at ``base + i`` and drop everything after them.

    ``keep`` is increasing (an accepted path in breadth-first order), so every source lies at or
    after its destination; the gather copies before writing, so overlapping moves are safe.

    Args:
        cache: a preallocated cache whose rows from ``base`` on are one tree forward's.
        base: the first position of the tree's rows.
        keep: offsets (from ``base``) of the rows to keep, in order.
    """
    n = len(keep)
    if n and list(keep) != list(range(n)):
        src = torch.tensor(keep, dtype=torch.long)
        for layer in cache.layers:
            if layer._k is None:
                continue
            idx = src.to(layer._k.device) + base
            layer._k[:, :, base:base + n] = layer._k[:, :, idx]
            layer._v[:, :, base:base + n] = layer._v[:, :, idx]
    cache.truncate(base + n)
