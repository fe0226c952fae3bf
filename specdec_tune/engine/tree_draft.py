"""The tree drafter: a draft model drafts a token tree depth by depth, one forward per depth.

Depth 1 is the root's children, read from the draft's distribution after the context. Every later
depth feeds the previous depth's nodes that have children in one forward under a tree mask
(``engine.tree``: each node attends to the context and its own ancestors), and reads their children
from the rows it returns. A static shape (``specdec_tune.core.trees``: chains, top-k, Sequoia) fixes how
many children each node has; the EAGLE-2/SGLang dynamic tree (``eagle:K:B``) keeps the K best
frontier nodes by cumulative draft probability per step and verifies the B best of all
(``trees`` module docstring, sglang 0.5.23 ``spec_utils._select_top_k_tokens_later``).

Children: greedy, a node's k children are the draft's top-k tokens; sampling, static shapes draw
them i.i.d. from the node's q (SpecInfer's multi-step speculative sampling needs independent draws;
duplicates are kept as separate nodes, which keeps the rule exact), while the dynamic tree keeps
SGLang's deterministic top-k (verified as point masses, as SGLang's
``tree_speculative_sampling_target_only`` does).

Cache bookkeeping: the draft cache holds the context plus the fed tree nodes. ``observe(path)``
compacts it to the context plus the fed nodes of the accepted path (``engine.tree.compact``), so the
next proposal feeds only what the cache has not seen (normally the target's next token and the
path's last node).
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from specdec_tune.engine.drafters import probs_from_logits
from specdec_tune.engine.kvcache import forward_with_cache, make_cache
from specdec_tune.engine.tree import TokenTree, compact, tree_forward
from specdec_tune.core.trees import TreeShape, TreeSpec


class TreeDrafter:
    """Drafts token trees with a causal LM that shares the target's vocabulary.

    Args:
        model: the draft model (lean wrapper or HF).
        max_len: positions its cache must hold (context + the largest tree).
        spec: the tree kind.
        rank_accept: per-rank acceptance, for ``sequoia`` shapes.
        temperature: 0 = greedy.
        generator: random source for sampling.
    """

    def __init__(self, model: torch.nn.Module, max_len: int, spec: TreeSpec, *, rank_accept: Sequence[float] = (),
                 temperature: float = 0.0, generator: torch.Generator | None = None) -> None:
        self.model = model
        self.cache = make_cache(model, max_len)
        self.spec = spec
        self.rank_accept = tuple(rank_accept)
        self.temperature = temperature
        self.generator = generator
        self.forwards = 0  # draft forwards run by the last proposal
        self._shapes: dict[int, TreeShape | None] = {}
        self._base = 0  # context length at the last proposal
        self._parents: Sequence[int] = ()  # the current proposal's node -> parent (-1: the root)
        self._fed: dict[int, int] = {}  # node -> its row offset in the cache after the context

    def shape(self, depth: int) -> TreeShape | None:
        """The static shape at ``depth`` (cached; ``None`` for the dynamic tree)."""
        if depth not in self._shapes:
            self._shapes[depth] = self.spec.shape(depth, self.rank_accept)
        return self._shapes[depth]

    def _rows(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy: the logits; sampling: q at the drafting temperature."""
        return logits if self.temperature == 0 else probs_from_logits(logits, self.temperature)

    def _children(self, row: torch.Tensor, k: int) -> torch.Tensor:
        """``[k]`` children from one row: top-k (greedy) or k i.i.d. draws from q (sampling)."""
        if self.temperature == 0:
            return row.topk(k).indices
        return torch.multinomial(row, k, replacement=True, generator=self.generator)

    def _feed(self, nodes: Sequence[int], parents: Sequence[int], tokens: Sequence[torch.Tensor],
              depths: Sequence[int]) -> torch.Tensor:
        """One forward over ``nodes`` (ids into the growing node lists); their rows ``[k, vocab]``."""
        order = list(self._fed) + list(nodes)
        for v in nodes:
            self._fed[v] = order.index(v)
        offsets, tail = _feed_rows(tuple(nodes), tuple(parents), tuple(depths), tuple(order))
        return self._forward_rows(torch.stack([tokens[v] for v in nodes]), offsets, tail, nodes)

    def _forward_rows(self, ids: torch.Tensor, offsets: torch.Tensor, tail: torch.Tensor,
                      nodes: Sequence[int] = ()) -> torch.Tensor:
        """The draft's forward over ``ids`` (the nodes ``nodes``) at positions base + ``offsets``, attending to
        the context and to the fed rows ``tail`` allows (``[k, fed]``)."""
        device = ids.device
        mask = torch.cat([torch.ones(ids.shape[0], self._base, dtype=torch.bool, device=device),
                          tail.to(device)], dim=1)
        self.forwards += 1
        return self._rows(tree_forward(self.model, ids, self.cache, offsets.to(device) + self._base, mask))

    def propose_tree(self, context: torch.Tensor, depth: int) -> TokenTree:
        """Draft a tree of at most ``depth`` levels after ``context`` (``[T]``)."""
        self._fed = {}
        root = self._root(context)
        self.forwards = 1
        shape = self.shape(depth)
        if shape is None:
            return self._propose_dynamic(root, depth)
        return self._propose_static(root, shape)

    def _root(self, context: torch.Tensor) -> torch.Tensor:
        """The root's row (the depth-1 children's distribution) after one forward over what the cache has
        not seen; sets the base the tree's rows sit after (the context's length)."""
        self._base = context.shape[0]
        out = forward_with_cache(self.model, context[self.cache.get_seq_length():][None], self.cache, logits_to_keep=1)
        return self._rows(out.logits[0, -1])

    def _propose_static(self, root: torch.Tensor, shape: TreeShape) -> TokenTree:
        self._parents = shape.parents
        tokens: list[torch.Tensor] = []
        dist: list[torch.Tensor] = []  # [n] the row each node was drawn from
        rows = {-1: root}
        plan = _static_plan(shape)
        for d in range(1, shape.depth + 1):
            parents, offsets, tail = plan[d - 1]
            if d > 1:
                for p in parents:
                    self._fed[p] = len(self._fed)
                fed = self._forward_rows(torch.stack([tokens[p] for p in parents]), offsets, tail, parents)
                rows.update({p: fed[j] for j, p in enumerate(parents)})
            for p in parents:
                kids = shape.children[p + 1]
                drawn = self._children(rows[p], len(kids))
                tokens.extend(drawn.unbind(0))
                dist.extend([rows[p]] * len(kids))
        ids = torch.stack(tokens) if tokens else root.new_empty(0, dtype=torch.long)
        probs = torch.stack(dist) if self.temperature > 0 and dist else None
        return TokenTree(ids, shape, probs)

    def _propose_dynamic(self, root: torch.Tensor, steps: int) -> TokenTree:
        """SGLang's EAGLE-2 tree: top-K per step by cumulative probability, then the B best nodes."""
        k, budget = self.spec.width, self.spec.budget
        q = torch.softmax(root.float(), -1) if self.temperature == 0 else root
        top = q.topk(k)
        tokens = list(top.indices.unbind(0))
        scores = top.values.tolist()
        parents, depths = [-1] * k, [1] * k
        self._parents = parents  # grows with the pool (a feature head reads each fed node's parent)
        frontier = list(range(k))
        for step in range(1, steps):
            fed = self._feed(frontier, parents, tokens, depths)
            probs = torch.softmax(fed.float(), -1) if self.temperature == 0 else fed
            kids = probs.topk(k, dim=-1)  # [K, K]
            cand = []
            for j, v in enumerate(frontier):
                for c in range(k):
                    cand.append((scores[v] * float(kids.values[j, c]), v, kids.indices[j, c]))
            first = len(tokens)
            for s, v, t in cand:
                tokens.append(t)
                scores.append(s)
                parents.append(v)
                depths.append(step + 1)
            # SGLang keeps the K best children of the step as the next frontier (ties: lower index).
            frontier = sorted(range(first, len(tokens)), key=lambda i: (-scores[i], i))[:k]
        keep = sorted(sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:budget])
        return self._select(keep, tokens, parents, scores)

    def _select(self, keep: list[int], tokens: list[torch.Tensor], parents: list[int], scores: list[float]) -> TokenTree:
        """The kept pool nodes as a breadth-first tree, siblings ranked by score; fed rows remapped."""
        kept = set(keep)
        keep = [v for v in keep if all(a in kept for a in _ancestors(v, parents))]  # ties may drop a parent
        depth = {v: len(_ancestors(v, parents)) + 1 for v in keep}
        order = sorted(keep, key=lambda v: (depth[v], [-scores[a] for a in (*reversed(_ancestors(v, parents)), v)], v))
        new = {v: i for i, v in enumerate(order)}
        new_parents, ranks, seen = [], [], {}
        for v in order:
            p = new[parents[v]] if parents[v] >= 0 else -1
            new_parents.append(p)
            ranks.append(seen.get(p, 0))
            seen[p] = ranks[-1] + 1
        self._fed = {new[v]: off for v, off in self._fed.items() if v in new}
        ids = torch.stack([tokens[v] for v in order]) if order else tokens[0].new_empty(0)
        return TokenTree(ids, TreeShape(tuple(new_parents), tuple(ranks)), None)

    def observe_path(self, path: Sequence[int]) -> None:
        """Keep the context and the accepted path's fed nodes in the draft cache (``engine.tree.compact``)."""
        keep = []
        for v in path:
            if v not in self._fed:
                break
            keep.append(self._fed[v])
        compact(self.cache, self._base, keep)


@lru_cache(maxsize=256)
def _static_plan(shape: TreeShape) -> tuple[tuple[tuple[int, ...], torch.Tensor, torch.Tensor], ...]:
    """Per depth d = 1..D of a static shape, once: the nodes whose children are drawn at d (their
    parents; fed to the draft for d >= 2), their position offsets and their mask over the fed rows."""
    plan = []
    fed: list[int] = []
    for d in range(1, shape.depth + 1):
        parents = tuple(sorted({shape.parents[i] for i, dd in enumerate(shape.depths) if dd == d}))
        if d == 1:
            plan.append((parents, torch.empty(0, dtype=torch.long), torch.empty(0, 0, dtype=torch.bool)))
            continue
        fed += parents
        offsets, tail = _feed_rows(parents, shape.parents, shape.depths, tuple(fed))
        plan.append((parents, offsets, tail))
    return tuple(plan)


def _feed_rows(nodes: tuple[int, ...], parents: tuple[int, ...], depths: tuple[int, ...],
               order: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Position offsets ``[k]`` (depth - 1 after the context) of ``nodes`` and their ancestor-or-self
    mask ``[k, len(order)]`` over the fed rows ``order``."""
    rows = []
    for v in nodes:
        chain = {v, *_ancestors(v, parents)}
        rows.append([u in chain for u in order])
    return torch.tensor([depths[v] - 1 for v in nodes], dtype=torch.long), torch.tensor(rows, dtype=torch.bool)


def _ancestors(v: int, parents: Sequence[int]) -> list[int]:
    """Ancestors of pool node ``v``, nearest first."""
    out = []
    a = parents[v]
    while a >= 0:
        out.append(a)
        a = parents[a]
    return out


def build_tree_drafter(model: torch.nn.Module, max_len: int, spec: TreeSpec, *, rank_accept: Sequence[float] = (),
                       temperature: float = 0.0, generator: torch.Generator | None = None) -> TreeDrafter:
    """A fresh tree drafter for one sequence: an EAGLE-3 head's (``engine.eagle_draft``) or a draft model's."""
    from specdec_tune.engine.eagle import EagleHead

    kind = TreeDrafter
    if isinstance(model, EagleHead):
        from specdec_tune.engine.eagle_draft import EagleTreeDrafter as kind
    return kind(model, max_len, spec, rank_accept=rank_accept, temperature=temperature, generator=generator)
