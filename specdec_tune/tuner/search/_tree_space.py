"""Token trees and staged drafting in the search space (docs/model.md, Token trees and staged drafting).

A *shape* is a tree spec of ``specdec_tune.core.trees`` (``chains:2``, ``topk:2-1``, ``sequoia:8``,
``eagle:2:6``); a *staged pair* is a model draft and the inner drafter that speculates its own decoding
(n-gram lookup or a smaller model draft), one for every staged pass the profile ran. Both are searched
for model drafts only, with θ = 0 and the constant schedule (the tree loop and the staged drafter have
neither); the depth is the candidate's N. A tree whose nodes exceed the profile's verify curve
(nodes + 1 > k_max) is left out of the space rather than extrapolated.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from specdec_tune.core.errors import InputError
from specdec_tune.core.trees import parse_tree
from specdec_tune.core.speculative import MODEL_FREE
from specdec_tune.tuner.model import NGRAM, NONE, Candidate
from specdec_tune.tuner.servers import expressible, server_space

STAGED = "staged:"
# The trees ``tune --trees`` searches by default: two and three chains (seed 003), top-2 branching at the
# root or at the first two depths (SpecInfer / EAGLE-2 static trees), Sequoia's DP trees and SGLang's
# dynamic tree (the one a server runs with a separate draft model) at a few node budgets.
DEFAULT_TREES = ("chains:2", "chains:3", "topk:2", "topk:2-2", "topk:3", "sequoia:6", "sequoia:10", "sequoia:14",
                 "eagle:2:6", "eagle:2:10", "eagle:3:10", "eagle:4:14")


def shape_candidate(drafter: str, n: int, shape: str) -> Candidate:
    """The candidate of ``drafter`` at N = ``n`` drafting ``shape``."""
    if shape.startswith(STAGED):
        return Candidate(drafter, n, staged=shape[len(STAGED):])
    return Candidate(drafter, n, tree=shape)


def shape_nodes(shape: str, n: int) -> int:
    """Nodes verified per cycle (a staged chain verifies N)."""
    if shape.startswith(STAGED):
        return n
    spec = parse_tree(shape)
    return spec.nodes(n) if spec is not None else n


def check_shapes(shapes: Sequence[str]) -> tuple[str, ...]:
    """Validate shapes (``--trees`` values) up front.

    Raises:
        InputError: a bad tree spec or an empty staged inner drafter, naming it.
    """
    out = []
    for shape in shapes:
        shape = shape.strip()
        if shape.startswith(STAGED):
            if not shape[len(STAGED):]:
                raise InputError(f"shape {shape!r} needs an inner drafter, e.g. staged:ngram")
        elif parse_tree(shape) is None:
            raise InputError(f"shape {shape!r} is a chain; list trees (chains:M, topk:.., sequoia:B, eagle:K:B)")
        out.append(shape)
    return tuple(dict.fromkeys(out))


def shaped_candidates(space: Any) -> Iterator[Candidate]:
    """Every tree and staged point of a search space: each tree shape for each model draft (within
    ``max_nodes``), and each (draft, inner drafter) pair the profile ran a staged pass for."""
    for drafter in space.drafters:
        if drafter in (NONE, *MODEL_FREE):
            continue
        for n in range(1, space.n_max + 1):
            for shape in space.shapes:
                if shape_nodes(shape, n) <= space.max_nodes:
                    yield shape_candidate(drafter, n, shape)
            for d, inner in space.staged_pairs:
                if d == drafter:
                    yield Candidate(drafter, n, staged=inner)


def shape_choices(space: Any) -> list[str]:
    """The ``shape`` parameter's choices of an Optuna trial: the chain, every tree, every staged inner."""
    inners = dict.fromkeys(f"{STAGED}{inner}" for _, inner in space.staged_pairs)
    return ["chain", *space.shapes, *inners]


def expressible_shapes(server: str, model_drafts: Sequence[str], shapes: Sequence[str]) -> tuple[str, ...]:
    """The shapes ``server`` can run (all of them for ``any``), asked from the capability table."""
    if server == "any" or not shapes or not model_drafts:
        return tuple(shapes) if model_drafts else ()
    space = server_space(server)
    return tuple(s for s in shapes if expressible(space, shape_candidate(model_drafts[0], 4, s)) is None)


def tree_space_args(req: Any, run: Any, evaluator: Any) -> dict[str, Any]:
    """``server_search_space``'s tree arguments for a tune request: the requested trees, the staged
    pairs the profile ran, and the node limit of its verify curve (``{}`` without ``--trees``)."""
    if not req.trees:
        return {}
    staged = []
    for d in req.drafts:
        if d not in MODEL_FREE:
            data = evaluator.tree_data(d)
            staged += [(d, inner) for inner in (data.staged if data is not None else {})]
    max_nodes = run.settings.k_max - 1
    return {"shapes": tuple(req.trees), "max_nodes": max_nodes, "staged_pairs": tuple(staged)}
