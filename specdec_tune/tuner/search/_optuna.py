"""The Optuna search of ``tune``: predicted end-to-end throughput over a server's discrete space.

Every trial proposes one :class:`~specdec_tune.tuner.model.Candidate` (drafter, N, θ, schedule),
the model predicts it from a stored profile (:func:`specdec_tune.tuner.model.predict_config`,
the same end-to-end tokens/s that ``measure`` observes) and the trial stores that prediction in its
user attributes. Predictions are cached per candidate (a sampler may propose a point twice, and a
resumed or joined study already holds many), so a point is predicted once per process.

The space is finite (:mod:`._space`). When ``trials`` covers it, Optuna's brute-force sampler
walks it whole and the study's best *is* the model's optimum; otherwise TPE (seeded, multivariate)
samples it. A study optimises the user's objective (``tune --objective``: throughput, goodput under a
latency SLO, cost or energy per token; :class:`~specdec_tune.tuner.model.Objective`); ``--objectives A,B``
makes a two-objective study over any two of throughput, goodput, cost, energy and memory, each in its
own direction (Optuna's multi-objective TPE/brute force), whose Pareto front is ``study.best_trials``.
Under ``--memory-budget`` a configuration that does not fit is pruned, with the bytes it needs.
"""
from __future__ import annotations

import logging
import math
import signal
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import NGRAM, NONE, OBJECTIVES, Candidate, Evaluator, Scored
from specdec_tune.tuner.model import direction
from specdec_tune.core.speculative import SUFFIX, SUFFIX_FIELDS
from specdec_tune.tuner.search._space import SearchSpace, make_candidate, suffix_candidate, unsupported
from specdec_tune.tuner.search._tree_space import shape_candidate, shape_choices



def suggest(trial: Any, space: SearchSpace) -> Candidate:
    """Define-by-run: θ only for model drafts (n-gram confidences are 1), nothing else for ``none``."""
    drafter = trial.suggest_categorical("drafter", list(space.drafters))
    if drafter == NONE:
        return Candidate(NONE, 0)
    n = trial.suggest_int("num_speculative_tokens", 1, space.n_max)
    if drafter == SUFFIX:  # its four fields (the grids of the space), a chain, no θ, the constant schedule
        return suffix_candidate(n, [trial.suggest_categorical(f, list(g)) for f, g in zip(SUFFIX_FIELDS, space.suffix_grid)])
    shapes = shape_choices(space) if drafter != NGRAM else ["chain"]
    if len(shapes) > 1:  # a tree or staged drafter runs θ = 0, the constant schedule, exact acceptance (._tree_space)
        shape = trial.suggest_categorical("shape", shapes)
        if shape != "chain":
            return shape_candidate(drafter, n, shape)
    kind, theta, step = "per-token", 0.0, 0.05
    if drafter != NGRAM and len(space.threshold_kinds) > 1:
        kind = trial.suggest_categorical("threshold_kind", list(space.threshold_kinds))
    if drafter != NGRAM and len(space.thresholds) > 1:
        # one parameter name per range: the kinds search different θ ranges (space.thetas_for)
        thetas = space.thetas_for(kind)
        theta = trial.suggest_float("threshold" if kind == "per-token" else f"threshold_{kind}", thetas[0], thetas[-1],
                                    step=round(space.thresholds[1] - space.thresholds[0], 2))
    if kind == "adaptive":
        step = trial.suggest_categorical("threshold_step", list(space.steps))
        return _lossy(trial, space, drafter, make_candidate(drafter, n, theta, space.threshold_rule, "constant", kind, step))
    schedules = space.schedules_for(drafter)
    # one parameter name per choice set: Optuna refuses a categorical whose choices change between trials
    key = "ngram_schedule" if drafter == NGRAM else "schedule"
    schedule = trial.suggest_categorical(key, list(schedules)) if len(schedules) > 1 else schedules[0]
    return _lossy(trial, space, drafter, make_candidate(drafter, n, theta, space.threshold_rule, schedule, kind))


def _lossy(trial: Any, space: SearchSpace, drafter: str, c: Candidate) -> Candidate:
    """The acceptance rule of a model draft's candidate: exact, or Decoding-OPT at an ε of the space."""
    pairs = space.acceptances()
    if drafter == NGRAM or len(pairs) == 1:
        return c
    index = trial.suggest_categorical("acceptance", list(range(len(pairs))))
    method, epsilon = pairs[index]
    return replace(c, acceptance=method, epsilon=epsilon)


@dataclass
class SearchOutcome:
    """A finished (or resumed-to-completion) search.

    Attributes:
        study: the Optuna study.
        ranked: distinct candidates of the completed trials, best predicted throughput first.
        pareto: the Pareto front (two objectives) or the best trial (one), as :class:`Scored`.
        completed: completed trials in the study (all workers).
        sampler: ``bruteforce`` or ``tpe``.
        new_trials: the trials this process ran, whatever their end.
        new_states: those trials per end state (``COMPLETE``, ``PRUNED``: a point the model cannot predict
            or outside the budget, ``FAIL``), so the counts printed add up.
    """

    study: Any
    ranked: list[Scored]
    pareto: list[Scored]
    completed: int
    sampler: str
    new_trials: int = 0
    notes: list[str] = field(default_factory=list)
    new_states: dict[str, int] = field(default_factory=dict)


def _values(s: Scored, objectives: Sequence[str], evaluator: Evaluator) -> list[float]:
    return [s.value(o, evaluator.objective) for o in objectives]


def rank_key(evaluator: Evaluator) -> Callable[[Scored], tuple[float, float]]:
    """Sort key, best first, by the evaluator's objective (then by predicted tokens/s)."""
    name = evaluator.objective.name
    sign = -1.0 if direction(name) == "maximize" else 1.0

    def key(s: Scored) -> tuple[float, float]:
        v = s.value(name, evaluator.objective)
        return (sign * v if math.isfinite(v) else math.inf, -s.predicted_tokens_per_s)

    return key


def _completed(study: Any) -> list[Any]:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def run_search(
    evaluator: Evaluator,
    space: SearchSpace,
    *,
    storage: Any,
    study_name: str,
    trials: int,
    objectives: Sequence[str] = ("throughput",),
    attrs: dict[str, Any] | None = None,
    seed: int = 0,
    on_trial: Callable[[Any], None] | None = None,
) -> SearchOutcome:
    """Run (or resume, or join) the study until it holds ``trials`` completed trials.

    Completed trials are counted over the whole study, so a rerun continues where a stopped one ended
    and several workers on one storage share the budget. Ctrl-C ends the search after the trial in
    flight, keeps every completed trial (each is committed when it completes) and raises
    ``KeyboardInterrupt``; a trial a killed worker left RUNNING is failed and run again
    (:func:`~specdec_tune.tuner.search.open_storage`).

    Args:
        evaluator: cached predictions from the profile.
        space: the space to search (already restricted to the server's).
        storage: an Optuna storage (:func:`open_storage`).
        study_name: the study to create, resume or join.
        trials: completed trials to reach.
        objectives: one objective (the evaluator's) or two, for a Pareto front (:data:`OBJECTIVES`).
        attrs: the settings stored with a new study (a study made with others is refused).
        seed: sampler seed.
        on_trial: called after each trial of this process (progress).

    Raises:
        InputError: bad ``trials`` or ``objectives``, or a study of that name made for other settings.
    """
    if trials < 1:
        raise InputError(f"--trials must be >= 1, got {trials}")
    objectives = _checked_objectives(objectives, evaluator)
    size = space.size
    brute = trials >= size
    study = _open_study(evaluator, space, storage, study_name, objectives, attrs, _sampler(brute, trials, seed))
    new_states = _optimize(study, _objective(evaluator, space, objectives), trials, on_trial)
    done = _completed(study)
    if not done:
        raise InputError(f"study {study_name!r} has no completed trial")
    ranked = sorted(_ranked(done), key=rank_key(evaluator))
    if len(objectives) > 1:
        front = [Scored.from_trial(t) for t in study.best_trials if "candidate" in t.user_attrs]
        front = sorted({s.candidate: s for s in front}.values(), key=rank_key(evaluator))
    else:
        front = ranked[:1]
    notes = [f"brute force: all {size} points of the space predicted"] if brute and len(done) >= size else []
    return SearchOutcome(study, ranked, front, len(done), "bruteforce" if brute else "tpe",
                         sum(new_states.values()), notes, new_states)


def _checked_objectives(objectives: Sequence[str], evaluator: Evaluator) -> list[str]:
    """One objective, or two distinct ones for a Pareto front; each with what it needs."""
    objectives = list(objectives) if objectives else [evaluator.objective.name]
    if len(objectives) not in (1, 2) or any(o not in OBJECTIVES for o in objectives) \
            or len(set(objectives)) != len(objectives):
        raise InputError(f"--objectives must be one or two distinct of {', '.join(OBJECTIVES)}, "
                         f"got {','.join(objectives)!r}")
    if "bias" in objectives and evaluator.mode != "sampling":
        raise InputError("a bias budget needs sampling (--temperature > 0): greedy decoding has no lossy acceptance")
    if "memory" in objectives and evaluator.memory is None:
        raise InputError("the memory objective needs the models' sizes (not available for this run)")
    for o in objectives:
        if o != "memory":
            evaluator.objective.check(o)
        if o == "energy" and evaluator.objective.watts is None:
            raise InputError("the energy objective needs NVML's power readings on a GPU; this profile has none")
    return objectives


def _sampler(brute: bool, trials: int, seed: int) -> Any:
    """Brute force when the budget covers the space (the study's best is then the model's optimum), else TPE."""
    import optuna

    with warnings.catch_warnings():  # BruteForceSampler and TPE's group are "experimental" in Optuna 5.0
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if brute:
            return optuna.samplers.BruteForceSampler(seed=seed)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                          n_startup_trials=min(20, max(trials // 5, 5)), constant_liar=True)


def _open_study(evaluator: Evaluator, space: SearchSpace, storage: Any, study_name: str, objectives: list[str],
                attrs: dict[str, Any] | None, sampler: Any) -> Any:
    """Create, resume or join the study; what it already predicted goes into the evaluator's cache."""
    from specdec_tune.tuner.search._study import load_or_create

    directions = [direction(o) for o in objectives]
    study = load_or_create(storage, study_name, directions, {**(attrs or {}), "space": space.to_dict(),
                                                              "objectives": objectives}, sampler)
    if "objectives" not in study.user_attrs:  # the dashboard names the study's values with these
        study.set_user_attr("objectives", [_VALUE_NAMES[o] for o in objectives])
    for t in _completed(study):  # what earlier runs or other workers predicted from this profile is not predicted again
        if "candidate" in t.user_attrs and t.user_attrs.get("run_id") in (None, getattr(evaluator, "run_id", None)):
            s = Scored.from_trial(t)
            evaluator.cache.setdefault(s.candidate, s)
    return study


_VALUE_NAMES = {"throughput": "predicted_tokens_per_s", "goodput": "predicted_goodput", "cost": "predicted_usd_per_mtok",
                "energy": "predicted_joules_per_token", "memory": "memory_bytes", "bias": "bias"}


def over_budget(evaluator: Evaluator, c: Candidate) -> str | None:
    """Why ``c`` does not fit the memory budget (None: it fits, or there is no budget)."""
    budget = evaluator.objective.memory_budget_bytes
    if budget is None or evaluator.memory is None:
        return None
    need = evaluator.memory(c)
    if need <= budget:
        return None
    return f"{c.label()} needs {need / 2**30:.3f} GiB, over the memory budget of {budget / 2**30:g} GiB"


def _objective(evaluator: Evaluator, space: SearchSpace, objectives: list[str]) -> Callable[[Any], Any]:
    """One trial: propose a candidate, predict it (cached), store the prediction on the trial."""
    import optuna

    def objective(trial: Any) -> float | list[float]:
        c = suggest(trial, space)
        reason = unsupported(space.server, c) or over_budget(evaluator, c)
        if reason is not None:  # the space holds only expressible points; a budget excludes what does not fit
            trial.set_user_attr("error", reason)
            raise optuna.TrialPruned(reason)
        try:
            s = evaluator.score(c)
        except InputError as exc:  # the profile cannot predict this point: not a result
            trial.set_user_attr("error", str(exc))
            raise optuna.TrialPruned(str(exc)) from None
        for key, value in {**s.attrs(), "run_id": getattr(evaluator, "run_id", None)}.items():  # predicted from
            trial.set_user_attr(key, value)
        values = _values(s, objectives, evaluator)
        return values[0] if len(values) == 1 else values

    return objective


def _optimize(study: Any, objective: Callable[[Any], Any], trials: int,
              on_trial: Callable[[Any], None] | None) -> dict[str, int]:
    """Run trials until the study (all workers) holds ``trials`` completed ones; the trials this process
    ran, per end state (a pruned trial does not count towards ``trials``)."""
    from optuna.study import MaxTrialsCallback
    from optuna.trial import TrialState

    remaining = trials - len(_completed(study))
    new: dict[str, int] = {}
    if remaining <= 0:
        return new

    with _stop_on_ctrl_c() as asked, _quiet("optuna"):

        def counted(study_: Any, trial: Any) -> None:
            new[trial.state.name] = new.get(trial.state.name, 0) + 1
            if on_trial is not None:
                on_trial(trial)
            if asked:
                study_.stop()

        # n_trials bounds a pathological run of pruned trials; MaxTrialsCallback stops at the study's
        # completed count (every worker's), which is what --trials means.
        study.optimize(objective, n_trials=2 * remaining + 20, gc_after_trial=False,
                       callbacks=[MaxTrialsCallback(trials, states=(TrialState.COMPLETE,)), counted])
    if asked:
        raise KeyboardInterrupt
    return new


@contextmanager
def _stop_on_ctrl_c() -> Iterator[list[bool]]:
    """Ctrl-C during the search ends it after the trial in flight, which completes and is committed:
    no trial is left RUNNING or FAIL, and no traceback is logged. The caller raises
    ``KeyboardInterrupt`` when the list it gets is not empty. A second Ctrl-C interrupts at once.

    Only the main thread receives signals; elsewhere Ctrl-C is Python's usual ``KeyboardInterrupt``.
    """
    asked: list[bool] = []
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous in (None, signal.SIG_IGN):  # not the main thread, or Ctrl-C deliberately ignored (a background job)
        yield asked
        return

    def handler(signum: int, frame: Any) -> None:
        asked.append(True)
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, handler)
    try:
        yield asked
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Optuna logs a failed trial with its whole traceback (a second Ctrl-C); the error itself is what
    the caller reports, in one line."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _ranked(done: Sequence[Any]) -> list[Scored]:
    """Distinct candidates of the completed trials, best predicted throughput first (callers re-rank by
    their objective)."""
    by_candidate: dict[Candidate, Scored] = {}
    for t in done:
        if "candidate" in t.user_attrs:
            s = Scored.from_trial(t)
            by_candidate.setdefault(s.candidate, s)
    return sorted(by_candidate.values(), key=lambda s: -s.predicted_tokens_per_s)


def finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)

