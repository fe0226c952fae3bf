"""Expected tokens per cycle of token trees from recorded acceptance (docs/model.md, Token trees and
staged drafting). Pure Python.

Greedy: a tree node is accepted when its token is the target's argmax after its parent. Along the
output the target's context is its own greedy text, so the profile records, at every output position,
the rank of the target's token in the draft's distribution there (teacher-forced, ``ranks``). A static
tree's cycle is then *simulated exactly* (:func:`simulate_tree`): from position j, the child of rank
r_j is accepted when the node has a child of that rank, and so on down. Sequoia's per-rank acceptance
a_r is the frequency of rank r. The dynamic EAGLE-2/SGLang tree depends on draft probabilities off the
target's path, which no pass records; :func:`_dynamic_depth` builds it with every node at depth d
using the on-path draft distribution at that depth (the top probabilities recorded there): a proxy,
labelled so.

Sampling: at each position the profile records β_m, the acceptance of the m-th of i.i.d. siblings once
the ones before it were rejected (recursive residuals of p and q, ``siblings``), and the p-mass of the
draft's top-m tokens (point-mass siblings). A tree's E[τ] from position j is the recursion
E = 1 + Σ_children P(child m accepted) (1 + E_child), P = Π_{i<m} (1 - β_i) β_m, with depth d read at
position j + d (consecutive positions of a sampled output stand in for the accepted path's contexts,
as the teacher-forced 1 - TV does for chains).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from specdec_tune.core.trees import TreeShape, TreeSpec, breadth_first

RANKS = 8  # ranks recorded per position; rank RANKS means "not among the draft's RANKS best"


@dataclass(frozen=True)
class StagedStats:
    """What a staged drafter cost in the profile's staged pass (greedy, N = N_max).

    Attributes:
        inner: the inner drafter (``ngram`` or a model draft's name).
        inner_n: the most tokens it proposed per inner cycle.
        tokens: tokens the staged drafter proposed (Σ L).
        draft_forwards: draft-model forwards it ran.
        fed: tokens those forwards carried.
        inner_forwards: inner-model forwards (0 for n-gram).
        cycles: per timed cycle (tokens proposed, the engine's seconds outside every forward).
    """

    inner: str
    inner_n: int
    tokens: int
    draft_forwards: int
    fed: int
    inner_forwards: int
    cycles: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TreeData:
    """One draft's tree data (``profiler.tree_profile``), per profiled prompt and output position.

    Attributes:
        ranks: ``[prompt][position]`` rank of the target's greedy token in the draft's distribution.
        top: ``[prompt][position][K]`` the draft's K highest probabilities there (greedy outputs).
        iid: ``[prompt][position][M]`` β_1..β_M of i.i.d. siblings (sampled outputs; empty: greedy only).
        point: ``[prompt][position][K]`` p-mass of the draft's top-1..K tokens (sampled outputs).
        width_raw_s: draft forward over w tokens (micro-benchmark median), w = 1..W.
        staged: inner drafter name -> :class:`StagedStats`.
        overhead: per timed tree cycle (dynamic tree?, nodes, draft forwards, engine seconds outside
            the forwards), from the profile's tree overhead pass.
        width_in_loop_s: median in-loop draft forward over w tree nodes (the same pass), w -> seconds.
        rollouts: an EAGLE-3 head's roll-outs per prompt (:class:`Rollout`), which the greedy simulation
            reads instead of ``ranks``; empty for a draft model.
    """

    ranks: tuple[tuple[int, ...], ...]
    top: tuple[tuple[tuple[float, ...], ...], ...] = ()
    iid: tuple[tuple[tuple[float, ...], ...], ...] = ()
    point: tuple[tuple[tuple[float, ...], ...], ...] = ()
    width_raw_s: dict[int, float] = field(default_factory=dict)
    staged: dict[str, StagedStats] = field(default_factory=dict)
    overhead: tuple[tuple[int, int, int, float], ...] = ()
    width_in_loop_s: dict[int, float] = field(default_factory=dict)
    rollouts: tuple[Rollout, ...] = ()

    @property
    def rank_accept(self) -> tuple[float, ...]:
        """a_r = P(the target's token has draft rank r), r = 0..RANKS-1 (Sequoia's positional acceptance)."""
        counts = [0] * RANKS
        total = 0
        for prompt in self.ranks:
            for r in prompt:
                total += 1
                if r < RANKS:
                    counts[r] += 1
        return tuple(c / total for c in counts) if total else (0.0,) * RANKS


class TreeCycle(NamedTuple):
    """One simulated tree cycle: nodes verified, nodes accepted, widths of the draft forwards after the
    first (one per depth whose nodes have children)."""

    nodes: int
    accepted: int
    widths: tuple[int, ...]


def shape_for(spec: TreeSpec, depth: int, rank_accept: Sequence[float]) -> TreeShape | None:
    """The static shape of ``spec`` at ``depth`` (``None`` for the dynamic tree)."""
    return spec.shape(depth, rank_accept)


class Rollout(NamedTuple):
    """An EAGLE-3 head's data for one prompt (``profiler.head_profile``): ``ranks[d][j]`` and ``top[d][j]`` at
    depth d + 1 of a tree (a chain step) started at output position j. A head's node at depth d is drafted
    by step d of its chain, whose guess depends on where the chain began; a draft model's depends on the
    text alone (``ranks[j + d]``)."""

    ranks: Sequence[Sequence[int]]
    top: Sequence[Sequence[Sequence[float]]]


def _rank(ranks: Sequence[int] | Rollout, j: int, d: int) -> int | None:
    """The target token's rank at depth d + 1 of a tree started at output position j (None: past the data)."""
    if isinstance(ranks, Rollout):
        return ranks.ranks[d][j] if d < len(ranks.ranks) and j < len(ranks.ranks[d]) else None
    return ranks[j + d] if j + d < len(ranks) else None


def _top(ranks: Sequence[int] | Rollout, top: Sequence[Sequence[float]], j: int, d: int, k: int) -> list[float]:
    """The draft's k best probabilities at depth d + 1 from position j (zeros past the data)."""
    if isinstance(ranks, Rollout):
        rows = ranks.top[d] if d < len(ranks.top) else ()
        return list(rows[j][:k]) if j < len(rows) else [0.0] * k
    return list(top[j + d][:k]) if j + d < len(top) else [0.0] * k


def _static_depth(shape: TreeShape, ranks: Sequence[int] | Rollout, j: int) -> int:
    """Accepted nodes of ``shape`` from output position j: follow the child of the recorded rank."""
    node, acc = 0, 0  # node: row in shape.children (0 = the root)
    while (r := _rank(ranks, j, acc)) is not None:
        kids = shape.children[node]
        if r >= len(kids):
            break
        node = kids[r] + 1
        acc += 1
    return acc


def _dynamic_depth(spec: TreeSpec, steps: int, ranks: Sequence[int] | Rollout, top: Sequence[Sequence[float]],
                   j: int) -> tuple[int, int]:
    """SGLang's EAGLE-2 tree from position j with the on-path distributions as the proxy of every node
    at their depth; (accepted nodes, nodes verified)."""
    k, budget = spec.width, spec.budget
    # pool entries: (score, depth, on_path); the on-path child of an on-path node has the recorded rank
    probs = lambda d: _top(ranks, top, j, d - 1, k)  # noqa: E731
    first = _rank(ranks, j, 0)
    pool = [(p, 1, r == first) for r, p in enumerate(probs(1))] if first is not None else []
    frontier = list(range(len(pool)))
    for step in range(1, steps):
        frontier = sorted(frontier, key=lambda i: -pool[i][0])[:k]
        new = []
        for v in frontier:
            score, depth, on = pool[v]
            here = _rank(ranks, j, depth)
            for r, p in enumerate(probs(depth + 1)):
                new.append(len(pool))
                pool.append((score * p, depth + 1, on and here is not None and r == here))
        frontier = new
    kept = sorted(range(len(pool)), key=lambda i: (-pool[i][0], i))[:budget]
    deepest = max((pool[i][1] for i in kept if pool[i][2]), default=0)
    return deepest, len(kept)


def simulate_tree(
    ranks: Sequence[int] | Rollout, top: Sequence[Sequence[float]], new_tokens: int, max_new_tokens: int, depth: int,
    spec: TreeSpec, rank_accept: Sequence[float],
) -> list[TreeCycle]:
    """Replay the tree loop over one prompt's greedy output (static shapes exact; dynamic: proxy); ``ranks``
    is a draft model's per-position ranks or an EAGLE-3 head's :class:`Rollout`."""
    out: list[TreeCycle] = []
    shapes: dict[int, TreeShape | None] = {}
    j = 0
    while j < new_tokens:
        d = min(depth, max_new_tokens - j)
        if d not in shapes:
            shapes[d] = shape_for(spec, d, rank_accept)
        shape = shapes[d]
        if shape is None:
            acc, nodes = _dynamic_depth(spec, d, ranks, top, j)
            out.append(TreeCycle(nodes, acc, (spec.width,) * (d - 1)))
        else:
            acc = _static_depth(shape, ranks, j)
            out.append(TreeCycle(shape.size, acc, shape.expanded()[1:]))
        j += acc + 1
    return out


def mean_shape(spec: TreeSpec, depth: int, data: TreeData) -> TreeShape:
    """A static stand-in for ``spec`` in sampling mode: itself, or for the dynamic tree the shape
    SGLang builds from the mean top probabilities per depth."""
    shape = shape_for(spec, depth, data.rank_accept)
    if shape is not None:
        return shape
    rows = [row for prompt in data.top for row in prompt]
    mean = [sum(r[i] for r in rows) / len(rows) for i in range(spec.width)] if rows else [1.0] + [0.0] * (spec.width - 1)
    # With the same distribution at every depth the kept nodes are the B highest products of the
    # mean probabilities of their ranks: grow the tree best first.
    parents: list[int] = []
    ranks: list[int] = []
    heap = [(-mean[r], -1, r, 1) for r in range(spec.width)]
    heapq.heapify(heap)
    while heap and len(parents) < spec.budget:
        neg, parent, r, d = heapq.heappop(heap)
        parents.append(parent)
        ranks.append(r)
        if d < depth:
            me = len(parents) - 1
            for c in range(spec.width):
                heapq.heappush(heap, (neg * mean[c], me, c, d + 1))
    return breadth_first(parents, ranks)


def sibling_betas(point_row: Sequence[float]) -> list[float]:
    """Point-mass siblings (the draft's top tokens in order): β_m = p(x_m) / (1 - Σ_{i<m} p(x_i)),
    from the cumulative p-masses c_m of the top-m set."""
    out, prev = [], 0.0
    for c in point_row:
        out.append(0.0 if prev >= 1.0 else max(0.0, (c - prev) / (1.0 - prev)))
        prev = c
    return out


def expected_tau(shape: TreeShape, betas_at: Callable[[int], Sequence[float]], j: int) -> float:
    """E[τ] of one cycle from position j: 1 + Σ over accepted nodes (module docstring's recursion)."""

    def value(row: int, pos: int) -> float:
        kids = shape.children[row]
        betas = betas_at(pos) if kids else ()
        if not betas:
            return 0.0
        total, survive = 0.0, 1.0
        for m, child in enumerate(kids):
            b = betas[min(m, len(betas) - 1)]
            total += survive * b * (1.0 + value(child + 1, pos + 1))
            survive *= 1.0 - b
        return total

    return 1.0 + value(0, j)
