"""Token-tree shapes (specdec_tune/core/trees.py): sizes and order, Sequoia's dynamic program against
brute force, and the ``--tree`` forms."""
from __future__ import annotations

import itertools

import pytest

from specdec_tune.core.errors import InputError
from specdec_tune.core.trees import TreeShape, chains_shape, expected_accepted, parse_tree, sequoia_tree, topk_shape


def test_shapes_have_the_documented_sizes_and_order():
    s = chains_shape(3, 4)
    assert s.size == 12 and s.depth == 4 and s.widths() == (3, 3, 3, 3) and s.expanded() == (1, 3, 3, 3)
    assert s.ranks[:3] == (0, 1, 2) and all(r == 0 for r in s.ranks[3:])
    t = topk_shape((2, 3), 3)
    assert t.size == 2 + 6 + 6 and t.widths() == (2, 6, 6) and t.path(13)[0] in (0, 1)
    with pytest.raises(ValueError, match="precede"):
        TreeShape((1, -1), (0, 0))
    with pytest.raises(ValueError, match="ranked"):
        TreeShape((-1, -1), (1, 0))


def _all_trees(budget: int, depth: int, ranks: int):
    """Every rank-ordered tree of <= budget nodes and depth <= depth, as nested child lists."""
    if budget == 0 or depth == 0:
        yield ()
        return
    for k in range(0, min(ranks, budget) + 1):
        for sizes in itertools.product(range(1, budget + 1), repeat=k):
            if sum(sizes) > budget:
                continue
            for subs in itertools.product(*[list(_all_trees(s - 1, depth - 1, ranks)) for s in sizes]):
                yield tuple(subs)


def _value(tree, a) -> float:
    return sum(a[r] * (1 + _value(sub, a)) for r, sub in enumerate(tree))


@pytest.mark.parametrize("a", [(0.6, 0.2, 0.1), (0.9, 0.05, 0.04), (0.4, 0.35, 0.2)])
def test_sequoia_dp_finds_the_best_tree_by_brute_force(a):
    """The dynamic program's tree is worth as much as the best of every tree of the budget."""
    for budget, depth in [(4, 4), (6, 3), (7, 4)]:
        best = max(_value(t, a) for t in _all_trees(budget, depth, len(a)))
        shape = sequoia_tree(a, budget, depth)
        assert shape.size <= budget and shape.depth <= depth
        assert expected_accepted(shape, a) == pytest.approx(best, rel=1e-9)
        # a chain of the same budget is worth less whenever a second rank has weight
        chain = expected_accepted(chains_shape(1, min(budget, depth)), a)
        assert expected_accepted(shape, a) >= chain - 1e-12


def test_parse_tree_forms_and_errors():
    assert parse_tree("") is None and parse_tree("chain") is None
    assert parse_tree("chains:3").nodes(4) == 12
    assert parse_tree("topk:2-2").nodes(3) == 2 + 4 + 4
    assert parse_tree("sequoia:10").nodes(5) == 10
    assert parse_tree("eagle:4:8").text == "eagle:4:8"
    for bad in ("chains:0", "topk:", "topk:2-x", "sequoia", "eagle:4", "tree:3", "sequoia:999"):
        with pytest.raises(InputError, match="tree"):
            parse_tree(bad)
