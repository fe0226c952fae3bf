"""The configuration a tuning produces, as the search, the exporters and the dashboard exchange it.

One data contract per boundary (docs/architecture.md, Style): :data:`Candidate` is a point of the search
space (what a trial proposes, what a server may or may not express: the speculative configuration itself);
:class:`TuningResult` is a finished tuning (the winner, its measured numbers and where they came from),
stored as JSON in the Optuna study's user attributes and read back by ``export`` and the dashboard.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from specdec_tune.core.schedules import THRESHOLD_RULES
from specdec_tune.core.speculative import NGRAM, NONE, SpeculativeConfig
from specdec_tune.tuner.model._throughput import SpecConfig

__all__ = ["NGRAM", "NONE", "SEARCH_BASIS", "THRESHOLD_RULES", "Candidate", "TuningResult", "predicted_basis",
           "spec_config"]

# A configuration's predicted tokens/s differs with the prompts it is predicted for and the machine speed it
# is stated at; every printed prediction names both (its "basis"), so two figures for one configuration
# that differ say why.
SEARCH_BASIS = "the profiled tuning prompts at the profile's machine speed, as the search ranked it"


def predicted_basis(heldout: bool, speed_source: str | None = None) -> str:
    """What a prediction made beside a measurement was computed for: the prompts measured, rescaled to
    the machine speed ``speed_source`` measured in the same passes (None: the profile's speed)."""
    prompts = "the held-out prompts measured" if heldout else "the tuning prompts measured"
    if speed_source is None:
        return f"{prompts}, at the profile's machine speed"
    return f"{prompts}, rescaled to the machine speed measured by {speed_source}"


# A point of the search space is a speculative configuration: the one record (core/speculative.py), by
# the name the search, the exporters and the dashboard know it by. Its dict is what studies store.
Candidate = SpeculativeConfig


@dataclass
class TuningResult:
    """A finished tuning: the winner inside one server's space and the numbers behind it.

    Rates are tokens/s. ``measured_*`` come from real decoding (``heldout`` says on which prompts),
    ``predicted_*`` from the throughput model. ``per_batch_size`` maps batch size B to the best N
    (0 = do not speculate), the schedule servers with one take. ``best_per_server`` maps each server
    name to the best candidate inside its space (``Candidate.to_dict()`` plus ``predicted_tokens_per_s``
    and, where measured, ``measured_tokens_per_s``) so reports can show what deploying on each costs.
    """

    candidate: Candidate
    server: str
    target: str
    workload: str
    hardware: str = ""
    draft_path: str | None = None
    target_path: str | None = None
    per_batch_size: dict[int, int] = field(default_factory=dict)
    per_batch_size_source: str = "predicted from T_v(B, k)"  # or measured on the server (tune --backend vllm)
    measured_tokens_per_s: float | None = None
    predicted_tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    heldout: bool = False
    temperature: float = 0.0
    study: str | None = None
    run_id: int | None = None
    best_per_server: dict[str, dict[str, Any]] = field(default_factory=dict)
    bias: dict[str, Any] | None = None  # a lossy winner's bias per verified position (tuner.model.bias_of)
    pareto: list[dict[str, Any]] = field(default_factory=list)  # throughput ↔ bias front (tune --max-bias)
    # What was optimised and how it came out held out (``tune --objective``; the exports state it):
    # the Objective's dict plus the winner's measured value, its CI, and whether the SLO was met.
    objective: dict[str, Any] = field(default_factory=dict)
    per_batch_size_reasons: dict[int, str] = field(default_factory=dict)  # why N is what it is at B
    predicted_basis: str = ""  # what predicted_tokens_per_s was computed for (predicted_basis; "" unknown)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["candidate"] = self.candidate.to_dict()
        d["per_batch_size"] = {str(b): n for b, n in self.per_batch_size.items()}
        d["per_batch_size_reasons"] = {str(b): r for b, r in self.per_batch_size_reasons.items()}
        d["speedup_ci"] = list(self.speedup_ci) if self.speedup_ci else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TuningResult:
        d = dict(d)
        d["candidate"] = Candidate.from_dict(d["candidate"])
        d["per_batch_size"] = {int(b): int(n) for b, n in (d.get("per_batch_size") or {}).items()}
        d["per_batch_size_reasons"] = {int(b): str(r) for b, r in (d.get("per_batch_size_reasons") or {}).items()}
        if d.get("speedup_ci") is not None:
            d["speedup_ci"] = tuple(d["speedup_ci"])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def spec_config(c: Candidate, mode: str = "greedy", batch_size: int = 1) -> SpecConfig:
    """The model's :class:`SpecConfig` for a candidate (θ's rule is moot, and stated ``before``, at θ = 0)."""
    spec = c if c.threshold > 0 or c.threshold_rule == "before" else replace(c, threshold_rule="before")
    return SpecConfig(spec=spec, batch_size=batch_size, mode=mode)
