"""Drafting with an EAGLE-3 head (``engine.eagle``): chains and token trees.

The head keeps its own one-layer KV cache, whose entry at position t pairs the target's features at t
with the token at t + 1 (it predicts t + 2). Only entries built from the *target's* features are kept
between cycles (the committed ones: positions ``0..T - 2`` for a context of T tokens). A proposal

1. runs one forward over the committed entries the cache lacks: the rows ``[start, T - 1)``, each the
   target's features at its position (``fc`` fuses them) with the next token, read from the drafter's
   :class:`~specdec_tune.engine.features.FeatureStore`, which the loop's verify forward filled
   (``engine.features.FeatureForward``: the same forward, no second target pass). Its last row's logits
   are the first drafted position's; its pre-norm output is the next step's feature;
2. chains: each step feeds the drafted token with the previous step's pre-norm output (a token tree
   feeds every node with its parent's), as vLLM's proposer loop does (``llm_base_proposer.propose``:
   ``hidden_states`` of step i are the input of step i + 1).

``observe`` rolls the cache back to the committed entries: the drafted entries were built from the
head's own outputs, and the next proposal rebuilds the accepted ones from the verify's features (vLLM
overwrites the same slots in its next first pass). θ, schedules and the sampling rows come from
:class:`~specdec_tune.engine.drafters.ModelDrafter` and :class:`~specdec_tune.engine.tree_draft.TreeDrafter`:
only where rows come from differs.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.core.trees import TreeSpec
from specdec_tune.engine.drafters import ModelDrafter
from specdec_tune.engine.eagle import EagleHead, EagleOutput
from specdec_tune.engine.features import FeatureStore
from specdec_tune.engine.kvcache import PreallocatedCache
from specdec_tune.engine.tree_draft import TreeDrafter


def feature_store(head: EagleHead, max_len: int) -> FeatureStore:
    """The store a head's drafter reads (one row per target position)."""
    return FeatureStore(max_len, head.aux_count * head.target_hidden, head.layer_ids, head.aux_count)


def first_pass(head: EagleHead, cache: PreallocatedCache, store: FeatureStore,
               context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The committed entries the cache lacks, in one forward: (logits ``[V]`` of the first drafted position,
    the last row's pre-norm output ``[1, 1, H]``).

    With one context token there is no target feature yet: the head reads the token with a zero feature
    at position 0 (a proposal from nothing, which the verify judges like any other; ``observe`` drops it).
    """
    end = context.shape[0] - 1  # entries 0..end - 1 are committed
    if end < 1:
        cache.truncate(0)
        out = head(input_ids=context[-1:][None], cache=cache, logits_to_keep=1)
    else:
        start = min(cache.get_seq_length(), end - 1)  # at least one row: its output starts the chain
        cache.truncate(start)
        out = head(input_ids=context[start + 1:end + 1][None], cache=cache, logits_to_keep=1,
                   features=store.read(start, end)[None])
    return out.logits[0, -1], out.hidden[:, -1:]


class EagleDrafter(ModelDrafter):
    """Drafts chains with an EAGLE-3 head (θ rules, sampling and confidences as :class:`ModelDrafter`).

    Args:
        head: the loaded head.
        max_len: positions the head's cache and the feature store hold (context + N + spare).
        spec: the θ fields (or by name, as ``ModelDrafter`` takes them).
    """

    def __init__(self, head: EagleHead, max_len: int, spec: SpeculativeConfig | None = None, *,
                 temperature: float = 0.0, generator: torch.Generator | None = None, **speculative: Any) -> None:
        super().__init__(head, max_len, spec, temperature=temperature, generator=generator, **speculative)
        self.features = feature_store(head, max_len)
        self._hidden: torch.Tensor | None = None  # [1, 1, H]: the last row's pre-norm output

    def _first(self, context: torch.Tensor) -> torch.Tensor:
        logits, self._hidden = first_pass(self.model, self.cache, self.features, context)
        return logits

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        """One chain step: the drafted token ``ids`` ``[1]`` with the previous step's output."""
        out = self.model(input_ids=ids[None], cache=self.cache, logits_to_keep=1, hidden_states=self._hidden)
        self._hidden = out.hidden[:, -1:]
        return out.logits[0, -1]

    def observe(self, num_accepted: int) -> None:
        """Move the adaptive θ; keep only the committed entries (module docstring)."""
        super().observe(num_accepted)
        self.cache.truncate(min(self.cache.get_seq_length(), self._base_len - 1))


class EagleTreeDrafter(TreeDrafter):
    """Drafts token trees (static shapes and the dynamic ``eagle:K:B``) with an EAGLE-3 head: every fed
    node reads its parent's pre-norm output (the root's: the first pass's last row)."""

    def __init__(self, head: EagleHead, max_len: int, spec: TreeSpec, *, rank_accept: Sequence[float] = (),
                 temperature: float = 0.0, generator: torch.Generator | None = None) -> None:
        super().__init__(head, max_len, spec, rank_accept=rank_accept, temperature=temperature, generator=generator)
        self.features = feature_store(head, max_len)
        self._out: dict[int, torch.Tensor] = {}  # fed node -> its row's pre-norm output [1, 1, H]; -1: the root
        self._committed = 0

    def _root(self, context: torch.Tensor) -> torch.Tensor:
        logits, root = first_pass(self.model, self.cache, self.features, context)
        self._committed = max(context.shape[0] - 1, 0)
        self._base = self.cache.get_seq_length()  # the tree's rows sit after the entries just fed
        self._out = {-1: root}
        return self._rows(logits)

    def _forward_rows(self, ids: torch.Tensor, offsets: torch.Tensor, tail: torch.Tensor,
                      nodes: Sequence[int] = ()) -> torch.Tensor:
        device = ids.device
        mask = torch.cat([torch.ones(ids.shape[0], self._base, dtype=torch.bool, device=device), tail.to(device)], dim=1)
        hidden = torch.cat([self._out[self._parents[v]] for v in nodes], dim=1)  # [1, k, H]
        out = self.model(input_ids=ids[None], cache=self.cache, logits_to_keep=ids.shape[0], hidden_states=hidden,
                         tree=(offsets.to(device) + self._base, mask))
        for j, v in enumerate(nodes):
            self._out[v] = out.hidden[:, j:j + 1]
        self.forwards += 1
        return self._rows(out.logits[0])

    def observe_path(self, path: Sequence[int]) -> None:
        """Keep only the committed entries (the path's are rebuilt from the verify's features)."""
        self.cache.truncate(min(self.cache.get_seq_length(), self._committed))


class TeacherForcedHead(torch.nn.Module):
    """A head read as a causal LM over a whole text, for the profiler's teacher-forced comparisons: the
    target reads the text once (``engine.features``: the decode's own feature forward), then row t is the
    head's first step from the target's features at t - 1 with token t (row 0, which has no feature: a
    zero one, as :func:`first_pass` drafts from nothing). ``model(input_ids=[1, T]).logits`` is ``[1, T, V]``,
    row t predicting token t + 1, like any draft model's. The target is not a submodule (hooks on this
    module time the head's forwards only)."""

    def __init__(self, head: EagleHead, target: torch.nn.Module) -> None:
        super().__init__()
        self.head = head
        self._target = (target,)

    @property
    def config(self):
        return self.head.config

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False, **kwargs) -> EagleOutput:
        from specdec_tune.engine.features import FeatureForward
        from specdec_tune.engine.kvcache import make_cache

        target, ids = self._target[0], input_ids[0]
        n = ids.shape[0]
        store = feature_store(self.head, n)
        FeatureForward(target, store)(ids, make_cache(target, n), 1)
        first = self.head(input_ids=ids[:1][None], use_cache=False)
        if n == 1:
            return first
        rest = self.head(input_ids=ids[1:][None], features=store.read(0, n - 1)[None], use_cache=False)
        return EagleOutput(torch.cat([first.logits, rest.logits], dim=1), torch.cat([first.hidden, rest.hidden], dim=1))
