"""Cached predictions of candidates from one profile run: what the search, the server calibration and
the exports ask the model, each point predicted once per process."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdec_tune.db import Database
from specdec_tune.tuner.model._configs import Candidate, spec_config
from specdec_tune.tuner.model._latency import predict_latency
from specdec_tune.tuner.model._load import load_run_profile
from specdec_tune.tuner.model._objective import Objective, predicted_value
from specdec_tune.tuner.model._predict import predict_baseline, predict_config, profiled_specs
from specdec_tune.tuner.model._profile import RunProfile


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

    def value(self, name: str, objective: Objective | None = None) -> float:
        """The predicted value of objective ``name`` (:func:`predicted_value`)."""
        o = objective or Objective()
        return predicted_value(name, self.predicted_tokens_per_s, self.attainment, self.memory_bytes, o.gpu_price,
                               o.watts)

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
        return out

    @classmethod
    def from_trial(cls, t: Any) -> Scored:
        """Back from a completed trial (studies from before objectives stored their tokens/s as value 0)."""
        a = t.user_attrs
        rate = a.get("predicted_tokens_per_s", t.values[0])
        return cls(Candidate.from_dict(a["candidate"]), float(rate), float(a["predicted_speedup"]),
                   float(a["expected_tokens_per_cycle"]), str(a["source"]), a.get("memory_bytes"),
                   float(a.get("attainment", 1.0)), tuple(a.get("tpot_s") or ()))


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
        self.cache: dict[Candidate, Scored] = {}
        self.predictions = 0  # model evaluations actually run (cache misses)

    def profile(self, drafter: str | None) -> RunProfile:
        if drafter not in self._profiles:
            self._profiles[drafter] = load_run_profile(self.db, self.run_id, drafter, baseline_only=drafter is None)
        return self._profiles[drafter]

    def score(self, c: Candidate) -> Scored:
        if c in self.cache:
            return self.cache[c]
        rp = self.profile(None if c.is_plain else c.drafter)
        config = spec_config(c, self.mode)
        p = predict_baseline(rp) if c.is_plain else predict_config(rp, config)
        self.predictions += 1
        attainment, tpot = 1.0, ()
        if self.objective.slo.active:
            lat = predict_latency(rp, config, profiled_specs(rp))
            attainment, tpot = lat.attainment(self.objective.slo), (lat.tpot(0.5), lat.tpot(0.9), lat.tpot(0.99))
        s = Scored(c, p.tokens_per_s, p.speedup, p.expected_tokens_per_cycle, p.source,
                   self.memory(c) if self.memory else None, attainment, tpot)
        self.cache[c] = s
        return s
