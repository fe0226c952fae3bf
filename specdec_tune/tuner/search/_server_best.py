"""Each server's best inside its own space, and the best N per batch size: exhaustive over the cached model.

A server's space is small and a prediction costs milliseconds (cached), so every point is predicted: a
server's best is the model's optimum inside its space, not an artefact of where the main study (TPE over
the whole space, ``_optuna``) happened to sample.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import Candidate, Evaluator, Scored, best_n_per_batch_size
from specdec_tune.tuner.search._optuna import over_budget, rank_key
from specdec_tune.tuner.search._space import SearchSpace, server_search_space, unsupported
from specdec_tune.tuner.servers import SERVERS


def brute_force(evaluator: Evaluator, space: SearchSpace) -> list[Scored]:
    """Every point of ``space`` that fits the memory budget predicted (cached), best by the evaluator's
    objective first."""
    scored = []
    for c in space.candidates():
        if over_budget(evaluator, c) is not None:
            continue
        try:
            scored.append(evaluator.score(c))
        except InputError:
            continue
    return sorted(scored, key=rank_key(evaluator))


def best_per_server(evaluator: Evaluator, model_drafts: Sequence[str], n_max: int, ngram: bool,
                    servers: Sequence[str] = tuple(SERVERS), thresholds: Sequence[float] | None = None,
                    tree_args: dict[str, Any] | None = None) -> dict[str, Scored]:
    """The best predicted candidate inside each server's space (exhaustive over the cached model).

    Each server's space is small and a prediction costs milliseconds (cached: the spaces overlap, and
    the main study's points are not predicted again), so every point of it is predicted: a server's best
    is the model's optimum inside its space, also where the main study (TPE over the whole space) never
    sampled it, and the side-by-side comparison is not an artefact of sampling.

    Args:
        thresholds: the θ grid for servers with θ (default: the full grid).
        tree_args: the trees and staged drafting each server runs (``._tree_space.tree_space_args``).
    """
    out = {}
    for server in servers:
        space = server_search_space(server, model_drafts, n_max, ngram, **(tree_args or {}))
        if thresholds is not None and len(space.thresholds) > 1:
            space = replace(space, thresholds=tuple(thresholds))
        ranked = brute_force(evaluator, space)
        if ranked:
            out[server] = ranked[0]
    return out


def per_batch_size(evaluator: Evaluator, c: Candidate, batch_sizes: Sequence[int], n_max: int) -> dict[int, int]:
    """Best N per batch size (0 = do not speculate) for the winner's drafter and θ, from T_v(B, k).

    Raises:
        InputError: the profile lacks T_v(B, k) for a batch size asked (profile with --batch-sizes).
    """
    if c.is_plain:
        return {int(b): 0 for b in batch_sizes}
    rp = evaluator.profile(c.drafter)
    measured = sorted(rp.model.verify_s)
    outside = [b for b in batch_sizes if b < measured[0] or b > measured[-1]]
    if outside:
        raise InputError(f"batch size(s) {outside} are outside the profile's measured {measured}; profile with "
                         f"--batch-sizes {','.join(str(b) for b in sorted(set(batch_sizes) | set(measured)))}")
    mode = "sampling" if evaluator.mode == "sampling" else "greedy"
    return best_n_per_batch_size(rp.model, list(batch_sizes), range(1, min(n_max, rp.traced_n_max) + 1),
                                 threshold=c.threshold, mode=mode)


def expressible_on(c: Candidate) -> list[str]:
    """The servers whose space holds ``c``."""
    return [s for s in SERVERS if unsupported(s, c) is None]
