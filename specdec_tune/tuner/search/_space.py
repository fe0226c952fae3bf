"""The discrete search space of ``tune`` and its restriction to what one server can express.

The space: drafter (each profiled draft model, ``ngram``, ``none`` = plain decoding),
N in 1..N_max (N_max = min(16, the profile's), θ on a 0.05 grid in [0, 0.95], schedule ``constant``
or ``heuristic``. It is finite on purpose: Optuna's brute-force sampler can walk it whole, and tests
compare the search with an exhaustive enumeration of the very same points.

Two choices are fixed rather than searched, and said so wherever results are printed:
- n-gram lookup sizes stay at the engine's default (longest 3, shortest 1): the profiler records one
  n-gram variant, so the model could not tell sizes apart;
- θ is not searched for n-gram lookup (its confidences are all 1, so a θ below 1 never cuts).

Suffix decoding (``suffix``) searches N and its four vLLM parameters on grids (:data:`SUFFIX_GRID`: tree
depth, cached requests, spec factor, min token probability), chains with the constant schedule (vLLM's
proposer has neither θ nor a schedule), predicted by exact simulation of the profiled sequences.

Which part of the space a server can express is asked from :mod:`specdec_tune.tuner.servers`
(the capability table) by probing it with candidates, so this module depends on its
``expressible`` check only, not on how the table is laid out.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from specdec_tune.core.errors import InputError
from specdec_tune.core.limits import MAX_SEARCHED_TOKENS
from specdec_tune.core.speculative import SUFFIX, SUFFIX_FIELDS
from specdec_tune.tuner.model import NGRAM, NONE, Candidate
from specdec_tune.tuner.servers import SERVERS, expressible, server_space
from specdec_tune.tuner.search._tree_space import expressible_shapes, shaped_candidates

ANY = "any"
N_LIMIT = MAX_SEARCHED_TOKENS  # the largest N searched (core/limits.py)
THETA_STEP = 0.05
THETA_MAX = 0.95
THETA_GRID = tuple(round(i * THETA_STEP, 2) for i in range(int(round(THETA_MAX / THETA_STEP)) + 1))
SCHEDULES = ("constant", "heuristic")
THRESHOLD_KINDS = ("per-token", "cumulative", "adaptive")  # specdec_tune.core.schedules.THRESHOLD_KINDS
ADAPTIVE_STEPS = (0.02, 0.05, 0.1)  # the adaptive kind's steps searched
ADAPTIVE_MAX = 0.9  # the adaptive θ's upper bound (specdec_tune.core.schedules.ADAPTIVE_BOUNDS)
_PROBE_DRAFT = "draft-model"  # any model draft stands for all of them when probing a server
# Suffix decoding's grids, per vLLM field (SUFFIX_FIELDS order): its default 24, 10000, 1.0, 0.1 included;
# 0 cached requests turns the global tree off, 4 keeps only the last few responses.
SUFFIX_GRID: tuple[tuple[float, ...], ...] = ((8, 16, 24, 32), (0, 4, 10000), (0.5, 1.0, 2.0, 4.0),
                                               (0.0, 0.05, 0.1, 0.2, 0.4))


@dataclass(frozen=True)
class SearchSpace:
    """The finite space one study searches.

    Attributes:
        drafters: model drafts (names as profiled), then ``ngram`` and ``none`` where allowed.
        n_max: largest N searched (N runs over 1..n_max).
        thresholds: θ values for model drafts (``(0.0,)``: no threshold).
        threshold_rule: ``before`` (our engine, llama.cpp p-min) or ``hf`` (HF's rule).
        schedules: schedules for model drafts: ``constant`` and, where allowed, ``heuristic``.
        ngram_schedules: schedules for n-gram lookup.
        server: the server whose space this is (``any``: the whole space).
        threshold_kinds: how θ applies (``per-token``; with ``tune --threshold-kinds`` also
            ``cumulative`` and ``adaptive``). A cumulative θ of 0 is per-token θ = 0, so it is not
            searched twice; the adaptive θ starts at most at 0.9, runs the constant schedule only, and
            takes a step from ``steps``.
        steps: the adaptive kind's steps.
        epsilons: over-acceptance ε searched with Decoding-OPT next to exact acceptance (``tune
            --max-bias``; empty: exact only). Decoding-UNO is not searched: it accepts as OPT does
            (same speed) and is at least as biased (Theorem 4), so it is never on the front.
        shapes: token trees (``chains:2``, ``sequoia:8``, ...) searched for model drafts besides the
            chain, with θ = 0, the constant schedule and exact acceptance (:mod:`._tree_space`); ``()``:
            chains only.
        max_nodes: the most tree nodes a candidate may verify (the profile's T_v(k) reaches nodes + 1).
        staged_pairs: (draft, inner drafter) pairs searched as staged drafting.
        suffix_grid: suffix decoding's values per field (``SUFFIX_FIELDS`` order), searched when ``suffix``
            is a drafter.
    """

    drafters: tuple[str, ...]
    n_max: int
    thresholds: tuple[float, ...] = THETA_GRID
    threshold_rule: str = "before"
    schedules: tuple[str, ...] = SCHEDULES
    ngram_schedules: tuple[str, ...] = SCHEDULES
    server: str = ANY
    threshold_kinds: tuple[str, ...] = ("per-token",)
    steps: tuple[float, ...] = ADAPTIVE_STEPS
    epsilons: tuple[float, ...] = ()
    shapes: tuple[str, ...] = ()
    max_nodes: int = N_LIMIT
    staged_pairs: tuple[tuple[str, str], ...] = ()
    suffix_grid: tuple[tuple[float, ...], ...] = SUFFIX_GRID

    def suffix_points(self) -> Iterator[Candidate]:
        """Suffix decoding's points: every combination of its grids at every N, the tree parameters outermost
        (the model simulates per tree depth and global-tree bound, so their points come together)."""
        from itertools import product

        for values in product(*self.suffix_grid):
            for n in range(1, self.n_max + 1):
                yield suffix_candidate(n, values)

    def acceptances(self) -> tuple[tuple[str, float], ...]:
        """(rule, ε) pairs searched for model drafts: exact, then OPT at each ε > 0."""
        return (("exact", 0.0),) + tuple(("opt", e) for e in self.epsilons if e > 0)

    def thetas_for(self, kind: str) -> tuple[float, ...]:
        """θ values searched for ``kind`` (model drafts)."""
        if kind == "cumulative":
            return tuple(t for t in self.thresholds if t > 0)
        if kind == "adaptive":
            return tuple(t for t in self.thresholds if t <= ADAPTIVE_MAX + 1e-9)
        return self.thresholds

    def _model_points(self, drafter: str, n: int) -> Iterator[Candidate]:
        for kind in self.threshold_kinds:
            for theta in self.thetas_for(kind):
                if kind == "adaptive":
                    for step in self.steps:
                        yield make_candidate(drafter, n, theta, self.threshold_rule, "constant", kind, step)
                    continue
                for schedule in self.schedules:
                    yield make_candidate(drafter, n, theta, self.threshold_rule, schedule, kind)

    def schedules_for(self, drafter: str) -> tuple[str, ...]:
        return self.ngram_schedules if drafter == NGRAM else self.schedules

    def candidates(self) -> Iterator[Candidate]:
        """Every point of the space, in a fixed order (plain decoding last)."""
        for drafter in self.drafters:
            if drafter == NONE:
                continue
            if drafter == SUFFIX:
                yield from self.suffix_points()
                continue
            for n in range(1, self.n_max + 1):
                if drafter != NGRAM:
                    for c in self._model_points(drafter, n):
                        yield from (replace(c, acceptance=a, epsilon=e) for a, e in self.acceptances())
                    continue
                for schedule in self.ngram_schedules:
                    yield make_candidate(drafter, n, 0.0, self.threshold_rule, schedule)
        yield from shaped_candidates(self)
        if NONE in self.drafters:
            yield Candidate(NONE, 0)

    @property
    def size(self) -> int:
        return sum(1 for _ in self.candidates())

    def to_dict(self) -> dict:
        return {"drafters": list(self.drafters), "n_max": self.n_max, "thresholds": list(self.thresholds),
                "threshold_rule": self.threshold_rule, "schedules": list(self.schedules),
                "ngram_schedules": list(self.ngram_schedules), "server": self.server,
                "threshold_kinds": list(self.threshold_kinds), "steps": list(self.steps),
                "epsilons": list(self.epsilons),
                **({"suffix_grid": dict(zip(SUFFIX_FIELDS, map(list, self.suffix_grid)))} if SUFFIX in self.drafters
                   else {}),
                **({"shapes": list(self.shapes), "max_nodes": self.max_nodes,
                    "staged_pairs": [list(p) for p in self.staged_pairs]} if self.shapes or self.staged_pairs else {})}


def make_candidate(drafter: str, n: int, theta: float, rule: str, schedule: str, kind: str = "per-token",
                   step: float = 0.05) -> Candidate:
    """A candidate with θ rounded to the grid (Optuna's stepped floats carry binary noise); a cumulative
    θ of 0 is per-token θ = 0, and only the adaptive kind keeps its step."""
    theta = round(float(theta), 2)
    if kind == "cumulative" and theta == 0:
        kind = "per-token"
    step = round(float(step), 3) if kind == "adaptive" else 0.05
    return Candidate(drafter, int(n), theta, rule if theta > 0 else "before", schedule, threshold_kind=kind,
                     threshold_step=step)


def suffix_candidate(n: int, values: Sequence[float]) -> Candidate:
    """Suffix decoding at N = ``n`` with its four fields (``SUFFIX_FIELDS`` order)."""
    depth, cached, factor, floor = values
    return Candidate(SUFFIX, int(n), suffix_max_tree_depth=int(depth), suffix_max_cached_requests=int(cached),
                     suffix_max_spec_factor=float(factor), suffix_min_token_prob=float(floor))


# --------------------------------------------------------------------------- servers


def unsupported(server: str, candidate: Candidate) -> str | None:
    """Why ``server`` cannot run ``candidate`` (``None``: it can; ``any`` runs everything).

    Asks the capability table (:mod:`specdec_tune.tuner.servers`), the one list of servers.
    """
    if server == ANY:
        return None
    return expressible(server_space(check_server(server)), candidate)


def check_server(server: str) -> str:
    if server != ANY and server not in SERVERS:
        raise InputError(f"unknown --server {server!r}; valid: {ANY}, {', '.join(SERVERS)}")
    return server


def server_search_space(server: str, model_drafts: Sequence[str], n_max: int, ngram: bool,
                        kinds: Sequence[str] = ("per-token",), epsilons: Sequence[float] = (),
                        shapes: Sequence[str] = (), max_nodes: int = N_LIMIT,
                        staged_pairs: Sequence[tuple[str, str]] = (), suffix: bool = False) -> SearchSpace:
    """The part of the whole space ``server`` can express, found by probing :func:`expressible`.

    Args:
        server: a server name or ``any``.
        model_drafts: the draft models profiled (names as stored in the run).
        n_max: largest N the profile can predict (capped at ``N_LIMIT``).
        ngram: whether n-gram lookup was profiled.
        kinds: the threshold kinds asked (``tune --threshold-kinds``); the server keeps those it can express.
        epsilons: over-acceptance ε asked (``tune --max-bias``); kept where the server runs Decoding-OPT.
        shapes: trees to search besides chains (kept where the server runs them).
        max_nodes: the most tree nodes a candidate may verify.
        staged_pairs: (draft, inner) staged drafting to search (kept where the server runs it).
        suffix: whether suffix decoding was profiled (searched where the server runs it).
    """
    check_server(server)
    n_max = min(int(n_max), N_LIMIT)
    if n_max < 1:
        raise InputError(f"the profile's N_max is {n_max}; profile with --n-max {N_LIMIT}")
    probe = model_drafts[0] if model_drafts else _PROBE_DRAFT
    ok = lambda c: unsupported(server, c) is None  # noqa: E731
    drafters = [d for d in model_drafts if ok(Candidate(d, 1))]
    with_ngram = ngram and ok(Candidate(NGRAM, 1))
    if with_ngram:
        drafters.append(NGRAM)
    if suffix and ok(Candidate(SUFFIX, 1)):
        drafters.append(SUFFIX)
    drafters.append(NONE)
    # the largest N the server takes (a server may cap it)
    n_max = next((n for n in range(n_max, 0, -1) if ok(Candidate(probe if model_drafts else NGRAM, n))), 1)
    rule = next((r for r in ("before", "hf") if ok(Candidate(probe, 4, 0.3, r))), None)
    if server == ANY:
        rule = "before"
    schedules = tuple(s for s in SCHEDULES if ok(Candidate(probe, 4, schedule=s))) or ("constant",)
    ngram_schedules = tuple(s for s in SCHEDULES if ok(Candidate(NGRAM, 4, schedule=s))) or ("constant",)
    bad = [k for k in kinds if k not in THRESHOLD_KINDS]
    if bad or not kinds:
        raise InputError(f"--threshold-kinds must list some of {', '.join(THRESHOLD_KINDS)}, got {','.join(kinds)!r}")
    kept = tuple(k for k in THRESHOLD_KINDS if k in kinds and (
        k == "per-token" or (rule == "before" and ok(make_candidate(probe, 4, 0.3, "before", "constant", k)))))
    lossy = tuple(e for e in epsilons if ok(Candidate(probe, 4, acceptance="opt", epsilon=e)))
    return SearchSpace(tuple(drafters), n_max, THETA_GRID if rule else (0.0,), rule or "before", schedules,
                       ngram_schedules, server, kept or ("per-token",), epsilons=lossy,
                       shapes=expressible_shapes(server, model_drafts, shapes), max_nodes=max_nodes,
                       staged_pairs=tuple(p for p in staged_pairs if ok(Candidate(p[0], 4, staged=p[1]))))
