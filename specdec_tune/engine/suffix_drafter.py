"""The suffix drafter: suffix decoding (``specdec_tune.core.suffix``) as a ``Drafter`` of the decode loops.

One drafter per request, bound to a :class:`~specdec_tune.core.suffix.SuffixCache`, the serving history it
shares with the requests before and after it (the global tree over their responses). Who runs a sequence
of requests owns that cache and says when a history starts afresh (``SuffixCache.reset``): the profiler one
per decoding pass, ``generate`` one per command. A request starts on the first proposal (its context then
is the prompt), adds the tokens emitted since the last proposal to its trees before drafting (vLLM's
``SuffixDecodingProposer.propose``: ``add_active_response`` then ``speculate``), and :meth:`finish` adds the
last cycle's tokens and closes it, so its whole response stays in the global tree.

Drafts are deterministic: in sampling mode each drafted token is a point mass (q = one-hot), which the
verifiers already handle (``engine.verify``, ``engine.tree_verify``), so sampling stays exact. A draft's
``confidence`` carries each token's estimated probability (the counts' D(N)); θ does not apply (the
configuration's ``suffix_min_token_prob`` is the cut).
"""
from __future__ import annotations

import torch

from specdec_tune.core.speculative import SUFFIX_TREE, SpeculativeConfig
from specdec_tune.core.suffix import SuffixDraft
from specdec_tune.core.suffix_cache import SuffixCache
from specdec_tune.core.trees import TreeShape
from specdec_tune.engine.tree import TokenTree
from specdec_tune.engine.types import Draft


class _NodeBudget:
    """What the tree loop asks a tree drafter's spec: the most nodes at depth N (suffix trees: N nodes)."""

    @staticmethod
    def nodes(depth: int) -> int:
        return depth


def cache_for(spec: SpeculativeConfig) -> SuffixCache:
    """An empty serving history with ``spec``'s tree depth and global-tree bound."""
    return SuffixCache(spec.suffix_max_tree_depth, spec.suffix_max_cached_requests)


class SuffixDrafter:
    """Drafts one request by suffix decoding (module docstring).

    Args:
        cache: the serving history (its depth and bound must be ``spec``'s).
        spec: the configuration (``suffix_*`` fields; ``tree="suffix"`` drafts trees).
        prompt_tokens: where the response starts in the first proposal's context (default: all of it is
            prompt), for a caller whose first cycle follows an undrafted token (vLLM's prefill token).
    """

    spec = _NodeBudget()

    def __init__(self, cache: SuffixCache, spec: SpeculativeConfig, prompt_tokens: int | None = None) -> None:
        if (cache.max_tree_depth, cache.max_cached_requests) != (spec.suffix_max_tree_depth,
                                                                 spec.suffix_max_cached_requests):
            raise ValueError(f"the suffix cache (depth {cache.max_tree_depth}, {cache.max_cached_requests} cached) "
                             f"is not the configuration's ({spec.suffix_max_tree_depth}, {spec.suffix_max_cached_requests})")
        self.cache = cache
        self.config = spec
        self.tree = spec.tree == SUFFIX_TREE
        self.forwards = 0  # no model runs
        self.last: SuffixDraft = SuffixDraft()  # the last proposal (its match length, for the profile)
        self._prompt_tokens = prompt_tokens
        self._req: int | None = None
        self._ids: list[int] = []

    def _catch_up(self, context: torch.Tensor) -> None:
        """Start the request on the first call; add the tokens emitted since the last one."""
        if self._req is None:
            self._ids = context.tolist()
            cut = len(self._ids) if self._prompt_tokens is None else self._prompt_tokens
            self._req = self.cache.start_request(self._ids[:cut])
            if cut < len(self._ids):
                self.cache.add_response(self._req, self._ids[cut:])
            return
        if context.shape[0] < len(self._ids):
            raise ValueError("a suffix drafter serves one request; its context only grows")
        new = context[len(self._ids):].tolist()
        if new:
            self._ids += new
            self.cache.add_response(self._req, new)

    def _speculate(self, context: torch.Tensor, max_tokens: int) -> SuffixDraft:
        self._catch_up(context)
        c = self.config
        self.last = self.cache.speculate(self._req, self._ids, max_tokens, c.suffix_max_spec_factor,
                                         c.suffix_min_token_prob, tree=self.tree)
        return self.last

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        """Draft a chain of up to ``max_tokens`` tokens after ``context`` (``[T]``)."""
        d = self._speculate(context, max_tokens)
        device = context.device
        return Draft(tokens=torch.tensor(d.tokens, dtype=torch.long, device=device), probs=None,
                     confidence=torch.tensor(d.probs, dtype=torch.float32, device=device))

    def observe(self, num_accepted: int) -> None:
        """Nothing to roll back: the trees follow the context."""

    def propose_tree(self, context: torch.Tensor, depth: int) -> TokenTree:
        """Draft the suffix tree's own speculation tree of at most ``depth`` nodes (point masses)."""
        d = self._speculate(context, depth)
        seen: dict[int, int] = {}
        ranks = []
        for p in d.parents:
            ranks.append(seen.get(p, 0))
            seen[p] = ranks[-1] + 1
        tokens = torch.tensor(d.tokens, dtype=torch.long, device=context.device)
        return TokenTree(tokens, TreeShape(tuple(d.parents), tuple(ranks)), None)

    def observe_path(self, path: tuple[int, ...]) -> None:
        """Nothing to compact: no draft cache."""

    def finish(self, context: torch.Tensor) -> None:
        """The request is over: its last tokens join the trees, and it stops (its response stays cached)."""
        if self._req is None:
            return
        self._catch_up(context)
        self.cache.stop_request(self._req)
        self._req = None
