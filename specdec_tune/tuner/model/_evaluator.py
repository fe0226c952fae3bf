"""Cached predictions of candidates from one profile run: what the search, the server calibration and
the exports ask the model, each point predicted once per process."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdec_tune.db import Database
from specdec_tune.tuner.model._bias import bias_of
from specdec_tune.tuner.model._configs import Candidate, spec_config
from specdec_tune.tuner.model._latency_prediction import predict_latency
from specdec_tune.tuner.model._load import load_run_profile, load_tree_data
from specdec_tune.tuner.model._objective import Objective, predicted_value
from specdec_tune.tuner.model._predict import predict_baseline, predict_config, profiled_specs
from specdec_tune.tuner.model._profile import RunProfile
from specdec_tune.tuner.model._tree import TreeData
from specdec_tune.tuner.model._tree_predict import TreePlan, predict_tree_prompts, tree_plan


@dataclass(frozen=True)
class Scored:
    """A candidate and what the model predicts for it (all numbers predicted)."""

    candidate: Candidate
    predicted_tokens_per_s: float
    predicted_speedup: float
    expected_tokens_per_cycle: float
    source: str
    memory_bytes: float | None = None
    attainment: float = 1.0  # share of requests predicted to meet the SLO (1 without one)
    tpot_s: tuple[float, ...] = ()  # predicted TPOT p50, p90, p99 (with an objective that needs latency)
    bias: float | None = None  # per verified position (tuner.model.bias_of); 0 for exact acceptance

    def value(self, name: str, objective: Objective | None = None) -> float:
        """The predicted value of objective ``name`` (:func:`predicted_value`)."""
        o = objective or Objective()
        return predicted_value(name, self.predicted_tokens_per_s, self.attainment, self.memory_bytes, o.gpu_price,
                               o.watts, self.bias)

    def attrs(self) -> dict[str, Any]:
        """What a trial stores (Optuna user attributes). Each attribute is one storage commit, so only
        what readers need is stored."""
        out = {"candidate": self.candidate.to_dict(), "predicted_speedup": self.predicted_speedup,
               "expected_tokens_per_cycle": self.expected_tokens_per_cycle, "source": self.source,
               "predicted_tokens_per_s": self.predicted_tokens_per_s}
        if self.memory_bytes is not None:
            out["memory_bytes"] = self.memory_bytes
        if self.tpot_s:
            out.update(attainment=self.attainment, tpot_s=list(self.tpot_s))
        if self.bias is not None:
            out["bias"] = self.bias
        return out

    @classmethod
    def from_trial(cls, t: Any) -> Scored:
        """Back from a completed trial (studies from before objectives stored their tokens/s as value 0)."""
        a = t.user_attrs
        rate = a.get("predicted_tokens_per_s", t.values[0])
        return cls(Candidate.from_dict(a["candidate"]), float(rate), float(a["predicted_speedup"]),
                   float(a["expected_tokens_per_cycle"]), str(a["source"]), a.get("memory_bytes"),
                   float(a.get("attainment", 1.0)), tuple(a.get("tpot_s") or ()), a.get("bias"))


class Evaluator:
    """Cached predictions of candidates from one profile run.

    Args:
        db: the results database.
        run_id: the profile run (on the tuning prompts).
        mode: ``greedy`` or ``sampling``.
        memory: candidate -> the bytes it holds (:class:`MemoryModel`), for the memory objective and budget.
        objective: what is optimised; with a latency SLO every candidate's TPOT distribution is predicted
            too (:func:`predict_latency` on the profiled prompts) and its share of requests meeting the SLO.
    """

    objective: Objective = Objective()  # throughput, no SLO: what an evaluator built without one optimises

    def __init__(self, db: Database, run_id: int, mode: str = "greedy",
                 memory: Callable[[Candidate], float] | None = None, objective: Objective | None = None) -> None:
        self.db, self.run_id, self.mode, self.memory = db, run_id, mode, memory
        self.objective = objective or Objective()
        self._profiles: dict[str | None, RunProfile] = {}
        self._trees: dict[str, TreeData | None] = {}
        self.cache: dict[Candidate, Scored] = {}
        self.predictions = 0  # model evaluations actually run (cache misses)
        self._plain_rate: float | None = None

    def profile(self, drafter: str | None) -> RunProfile:
        if drafter not in self._profiles:
            self._profiles[drafter] = load_run_profile(self.db, self.run_id, drafter, baseline_only=drafter is None)
        return self._profiles[drafter]

    def plain_tokens_per_s(self) -> float:
        """Plain decoding's predicted tokens/s as the search scores it (the target-only profile): the
        denominator of every candidate's predicted speedup."""
        if self._plain_rate is None:
            self._plain_rate = predict_baseline(self.profile(None)).tokens_per_s
        return self._plain_rate

    def tree_data(self, drafter: str) -> TreeData | None:
        """The drafter's token-tree data (``None``: the profile has none)."""
        if drafter not in self._trees:
            self._trees[drafter] = load_tree_data(self.db, self.run_id, drafter, self.mode)
        return self._trees[drafter]

    def plan(self, c: Candidate) -> TreePlan | None:
        """The tree or staged plan of ``c`` (``None``: a chain)."""
        if not c.tree and not c.staged:
            return None
        inner = self.profile(c.staged) if c.staged else None
        return tree_plan(c.tree, c.staged, self.tree_data(c.drafter), inner)

    def score(self, c: Candidate) -> Scored:
        if c in self.cache:
            return self.cache[c]
        rp = self.profile(None if c.is_plain else c.drafter)
        config = spec_config(c, self.mode)
        plan = None if c.is_plain else self.plan(c)
        if c.is_plain:
            p = predict_baseline(rp)
        elif plan is not None:
            p = predict_tree_prompts(rp, self.tree_data(c.drafter), config, plan)
        else:
            p = predict_config(rp, config)
        self.predictions += 1
        attainment, tpot = 1.0, ()
        if self.objective.slo.active:
            if plan is None:
                lat = predict_latency(rp, config, profiled_specs(rp))
                attainment, tpot = lat.attainment(self.objective.slo), (lat.tpot(0.5), lat.tpot(0.9), lat.tpot(0.99))
            else:  # a tree's or staged cycle's latency distribution is not modelled: under an SLO it never qualifies
                attainment = 0.0
        bias = None
        if self.mode == "sampling":
            bias = 0.0 if c.is_plain else bias_of(self.profile(c.drafter).bias_front, c.acceptance, c.epsilon).bias
        # The speedup is over plain decoding as the search scores it (the target-only profile's prediction),
        # not over the baseline inside p (the draft's profile, calibrated to that draft's passes): one
        # denominator for every candidate, so a speedup and the tokens/s it came from never disagree.
        speedup = 1.0 if c.is_plain else p.tokens_per_s / self.plain_tokens_per_s()
        s = Scored(c, p.tokens_per_s, speedup, p.expected_tokens_per_cycle, p.source,
                   self.memory(c) if self.memory else None, attainment, tpot, bias)
        self.cache[c] = s
        return s
