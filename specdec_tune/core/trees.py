"""Token-tree shapes, defined once (the engine drafts and verifies them, the tuner predicts them).

Pure Python with no torch import, so the throughput model (``tuner.model``) can use it.

A cycle with a tree drafts several continuations at once and verifies all of them in one target
forward under a tree attention mask (docs/architecture.md, Engine contracts). Node ``i`` of a tree has
a parent (``-1``: the root, i.e. the last emitted token) and a *sibling rank* (0 = the draft's best
child). Nodes are stored breadth first, siblings in rank order, so a parent always precedes its
children. The tree kinds (``Candidate.tree`` holds their spec text; the depth is the candidate's N):

- ``chains:M`` -- M independent chains of depth N (Yin et al. 2024, seed 003, "batch speculative
  decoding"): the root has M children, every other node one. Greedy: chain m starts with the draft's
  m-th most likely token and continues greedily (M identical greedy chains would be pointless);
  sampling: the M first tokens are drawn i.i.d. from q (SpecInfer, Miao et al. 2023).
- ``topk:b1-b2-..`` -- every node at depth d has b_d children (1 past the listed depths): the top-k
  branching of SpecInfer's expansion-based trees and of EAGLE-2's static trees (Li et al. 2024).
- ``sequoia:B`` -- the tree of B nodes and depth <= N that maximises the expected accepted tokens
  under positional acceptance (Chen et al. 2024, Sequoia, Section 3.1: each child of rank r is accepted
  with probability a_r given its parent, independently of its depth), found by dynamic programming
  (:func:`sequoia_tree`) from the profile's per-rank acceptance.
- ``eagle:K:B`` -- the dynamic tree SGLang builds for EAGLE and STANDALONE drafts (sglang 0.5.23
  ``srt/speculative/spec_utils.py`` ``_select_top_k_tokens_first/_later``, ``eagle_utils.py``
  ``organize_draft_results``): N steps; step 0 takes the draft's top K tokens, each later step
  expands the K frontier nodes by their top K children and keeps the K best by cumulative draft
  probability; finally the B nodes of highest cumulative probability are verified
  (``--speculative-eagle-topk K --speculative-num-steps N --speculative-num-draft-tokens B+1``). It
  depends on the draft's probabilities, so it has no static shape.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

from specdec_tune.core.errors import InputError

TREE_KINDS = ("chains", "topk", "sequoia", "eagle")
MAX_TREE_NODES = 64  # the most nodes one verify forward may carry (the engine's and the CLI's limit)


@dataclass(frozen=True)
class TreeShape:
    """A static token tree.

    Attributes:
        parents: ``[n]`` parent of each node (``-1``: the root); a parent precedes its children.
        ranks: ``[n]`` sibling rank of each node (0 = the draft's best child); siblings are 0..k-1.
    """

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.ranks):
            raise ValueError(f"a tree needs one rank per node: {len(self.parents)} parents, {len(self.ranks)} ranks")
        seen: dict[int, int] = {}
        for i, (p, r) in enumerate(zip(self.parents, self.ranks)):
            if not -1 <= p < i:
                raise ValueError(f"node {i}'s parent {p} must precede it (or be -1, the root)")
            if r != seen.get(p, 0):
                raise ValueError(f"node {i} has sibling rank {r}; its parent's children must be ranked 0, 1, .. in order")
            seen[p] = r + 1

    @property
    def size(self) -> int:
        """Number of drafted nodes (the verify forward carries size + 1 positions)."""
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """``[n]`` depth of each node (a child of the root has depth 1)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return tuple(out)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """``[n + 1]`` children of each node in rank order; entry 0 is the root's, entry i + 1 node i's."""
        out: list[list[int]] = [[] for _ in range(self.size + 1)]
        for i, p in enumerate(self.parents):
            out[p + 1].append(i)
        return tuple(tuple(c) for c in out)

    def path(self, node: int) -> tuple[int, ...]:
        """The nodes from the root's child down to ``node`` (``()`` for the root, ``node = -1``)."""
        out: list[int] = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return tuple(reversed(out))

    def widths(self) -> tuple[int, ...]:
        """``[depth]`` nodes at each depth 1..depth."""
        out = [0] * self.depth
        for d in self.depths:
            out[d - 1] += 1
        return tuple(out)

    def expanded(self) -> tuple[int, ...]:
        """``[depth]`` nodes that have children at each depth 0..depth-1 (the root counts at depth 0):
        what a depth-by-depth drafter feeds to the draft model per forward."""
        out = [0] * self.depth
        for node, kids in enumerate(self.children):
            if kids:
                out[0 if node == 0 else self.depths[node - 1]] += 1
        return tuple(out)


def chain_shape(depth: int) -> TreeShape:
    """A single chain of ``depth`` nodes (ordinary speculative decoding as a tree)."""
    return TreeShape(tuple(range(-1, depth - 1)), (0,) * depth)


def chains_shape(m: int, depth: int) -> TreeShape:
    """M independent chains of ``depth`` nodes each, stored breadth first."""
    if m < 1 or depth < 1:
        raise ValueError(f"chains need M >= 1 and depth >= 1, got M={m}, depth={depth}")
    parents, ranks = [-1] * m, list(range(m))
    for d in range(1, depth):
        parents += [(d - 1) * m + c for c in range(m)]
        ranks += [0] * m
    return TreeShape(tuple(parents), tuple(ranks))


def topk_shape(branching: Sequence[int], depth: int) -> TreeShape:
    """Every node at depth d (the root is depth 0) has ``branching[d]`` children (1 past the list)."""
    if depth < 1 or any(b < 1 for b in branching):
        raise ValueError(f"top-k trees need depth >= 1 and branching >= 1, got {list(branching)}, depth={depth}")
    parents: list[int] = []
    ranks: list[int] = []
    frontier = [-1]
    for d in range(depth):
        b = branching[d] if d < len(branching) else 1
        nxt = []
        for p in frontier:
            for r in range(b):
                nxt.append(len(parents))
                parents.append(p)
                ranks.append(r)
        frontier = nxt
    return TreeShape(tuple(parents), tuple(ranks))


def expected_accepted(shape: TreeShape, rank_accept: Sequence[float]) -> float:
    """E[accepted nodes] under positional acceptance: Σ_nodes Π_{edges to it} a_rank (Sequoia, eq. 1)."""
    weight: list[float] = []
    for p, r in zip(shape.parents, shape.ranks):
        a = rank_accept[r] if r < len(rank_accept) else 0.0
        weight.append(a * (1.0 if p < 0 else weight[p]))
    return sum(weight)


def sequoia_tree(rank_accept: Sequence[float], budget: int, depth: int) -> TreeShape:
    """See :func:`_sequoia_tree` (computed once per (acceptance, budget, depth))."""
    return _sequoia_tree(tuple(float(x) for x in rank_accept), int(budget), int(depth))


@lru_cache(maxsize=1024)
def _sequoia_tree(rank_accept: tuple[float, ...], budget: int, depth: int) -> TreeShape:
    """The tree of at most ``budget`` nodes and depth <= ``depth`` maximising :func:`expected_accepted`.

    Sequoia's dynamic program (Chen et al. 2024, Section 3.1, "positional acceptance"): a node's
    children use ranks 0..k-1; a subtree of n nodes below a node at remaining depth d is worth
    g(n, d) = max over splits n = n_0 + .. + n_{k-1} of Σ_r a_r (1 + g(n_r - 1, d - 1)). The split
    is a knapsack over ranks in order (h below). O(budget² · ranks · depth), milliseconds here.

    Args:
        rank_accept: a_r, P(the child of sibling rank r is accepted | its parent was), r = 0..R-1.
        budget: the most nodes (>= 1).
        depth: the deepest level allowed (>= 1).
    """
    if budget < 1 or depth < 1:
        raise ValueError(f"a Sequoia tree needs budget >= 1 and depth >= 1, got {budget}, {depth}")
    a = [min(max(float(x), 0.0), 1.0) for x in rank_accept]
    ranks = len(a)
    g = [[0.0] * (budget + 1) for _ in range(depth + 1)]  # g[d][n]: n nodes below, d levels left
    split: dict[tuple[int, int, int], int] = {}  # (d, r, m) -> n_r chosen for rank r with m nodes left
    for d in range(1, depth + 1):
        # h[r][m]: best value of m nodes spread over ranks r.. (each used rank takes >= 1 node)
        h = [[0.0] * (budget + 1) for _ in range(ranks + 1)]
        for r in range(ranks - 1, -1, -1):
            for m in range(1, budget + 1):
                best, arg = 0.0, 0  # 0: rank r and later unused
                for n_r in range(1, m + 1):
                    v = a[r] * (1.0 + g[d - 1][n_r - 1]) + h[r + 1][m - n_r]
                    if v > best + 1e-15:
                        best, arg = v, n_r
                h[r][m] = best
                split[(d, r, m)] = arg
        g[d] = [h[0][m] for m in range(budget + 1)]
    parents: list[int] = []
    ranks_out: list[int] = []
    # Rebuild breadth first: a queue of (parent node, nodes below it, levels left).
    queue = [(-1, budget, depth)]
    while queue:
        nxt = []
        for parent, m, d in queue:
            r = 0
            while m > 0 and d > 0 and r < ranks and split.get((d, r, m), 0):
                n_r = split[(d, r, m)]
                parents.append(parent)
                ranks_out.append(r)
                nxt.append((len(parents) - 1, n_r - 1, d - 1))
                m -= n_r
                r += 1
        queue = nxt
    return breadth_first(parents, ranks_out)


def breadth_first(parents: list[int], ranks: list[int]) -> TreeShape:
    """Renumber nodes breadth first, siblings by rank (the order :class:`TreeShape` requires)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)

    def key(i: int) -> tuple:
        chain = []
        node = i
        while node >= 0:
            chain.append(ranks[node])
            node = parents[node]
        return (depth[i], tuple(reversed(chain)))

    order = sorted(range(len(parents)), key=key)
    new = {old: k for k, old in enumerate(order)}
    return TreeShape(tuple(-1 if parents[o] < 0 else new[parents[o]] for o in order), tuple(ranks[o] for o in order))


@dataclass(frozen=True)
class TreeSpec:
    """A tree kind and its parameters (what ``Candidate.tree`` holds as text; the depth is N).

    Attributes:
        kind: ``chains``, ``topk``, ``sequoia`` or ``eagle`` (module docstring).
        width: M for chains, K for eagle.
        branching: b_1.. for topk.
        budget: the node budget B of sequoia and eagle.
    """

    kind: str
    width: int = 0
    branching: tuple[int, ...] = ()
    budget: int = 0

    @property
    def text(self) -> str:
        if self.kind == "chains":
            return f"chains:{self.width}"
        if self.kind == "topk":
            return "topk:" + "-".join(str(b) for b in self.branching)
        if self.kind == "sequoia":
            return f"sequoia:{self.budget}"
        return f"eagle:{self.width}:{self.budget}"

    def nodes(self, depth: int) -> int:
        """Nodes verified per cycle at ``depth`` (the verify forward carries nodes + 1 positions)."""
        if self.kind == "chains":
            return self.width * depth
        if self.kind == "topk":
            return topk_shape(self.branching, depth).size
        if self.kind == "sequoia":
            return self.budget
        return min(self.budget, self.width + (depth - 1) * self.width * self.width)

    def shape(self, depth: int, rank_accept: Sequence[float] | None = None) -> TreeShape | None:
        """The static shape at ``depth`` (``None`` for ``eagle``, built per cycle by the drafter).

        Raises:
            InputError: ``sequoia`` without per-rank acceptance to shape it from.
        """
        if self.kind == "chains":
            return chains_shape(self.width, depth)
        if self.kind == "topk":
            return topk_shape(self.branching, depth)
        if self.kind == "sequoia":
            if not rank_accept:
                raise InputError("a sequoia tree is shaped from per-rank acceptance; profile the draft with --trees")
            return sequoia_tree(rank_accept, self.budget, depth)
        return None


def parse_tree(text: str | None) -> TreeSpec | None:
    """``chains:M``, ``topk:b1-b2-..``, ``sequoia:B`` or ``eagle:K:B`` -> :class:`TreeSpec`; empty or
    ``chain`` -> ``None`` (an ordinary chain).

    Raises:
        InputError: anything else, naming the text and the valid forms.
    """
    t = (text or "").strip().lower()
    if t in ("", "chain"):
        return None
    forms = "chains:M, topk:b1-b2-.., sequoia:B or eagle:K:B (integers >= 1; b_i >= 1)"
    kind, _, rest = t.partition(":")
    try:
        if kind == "chains":
            spec = TreeSpec("chains", width=int(rest))
            ok = spec.width >= 1
        elif kind == "topk":
            spec = TreeSpec("topk", branching=tuple(int(b) for b in rest.split("-")))
            ok = bool(spec.branching) and all(b >= 1 for b in spec.branching)
        elif kind == "sequoia":
            spec = TreeSpec("sequoia", budget=int(rest))
            ok = spec.budget >= 1
        elif kind == "eagle":
            k, b = rest.split(":")
            spec = TreeSpec("eagle", width=int(k), budget=int(b))
            ok = spec.width >= 1 and spec.budget >= 1
        else:
            ok = False
    except ValueError:
        ok = False
    if not ok:
        raise InputError(f"tree {text!r} is not valid; use {forms}")
    if spec.budget > MAX_TREE_NODES:
        raise InputError(f"tree {text!r} has more than {MAX_TREE_NODES} nodes")
    return spec
