"""The configuration a tuning produces, as the search, the exporters and the dashboard exchange it.

One data contract per boundary (docs/architecture.md, Style): :class:`Candidate` is a point of the search space
(what a trial proposes, what a server may or may not express); :class:`TuningResult` is a finished
tuning (the winner, its measured numbers and where they came from), stored as JSON in the Optuna
study's user attributes and read back by ``export`` and the dashboard.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specdec_tune.tuner.model._throughput import SpecConfig

NONE = "none"  # plain decoding (no drafter)
NGRAM = "ngram"  # prompt lookup
THRESHOLD_RULES = ("before", "hf")
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


@dataclass(frozen=True)
class Candidate:
    """One speculative-decoding configuration.

    Attributes:
        drafter: a draft model (bundled name, local path or hub id), ``"ngram"`` or ``"none"``.
        num_speculative_tokens: N, the most tokens drafted per cycle (0 with ``drafter="none"``).
        threshold: θ; 0 disables it.
        threshold_rule: ``"before"`` (stop before a position whose top draft probability is below θ;
            llama.cpp ``p-min``) or ``"hf"`` (HF ``assistant_confidence_threshold``: the token below θ
            is proposed, then drafting stops).
        schedule: ``"constant"`` or ``"heuristic"`` (HF's ``num_assistant_tokens_schedule``).
        ngram_max: prompt-lookup longest n-gram (n-gram drafter only).
        ngram_min: prompt-lookup shortest n-gram (n-gram drafter only).
        threshold_kind: ``"per-token"``, ``"cumulative"`` or ``"adaptive"`` (``specdec_tune.core.schedules``).
        threshold_step: the adaptive kind's step (how far one verdict moves θ).
        acceptance: ``"exact"``, ``"opt"`` (Decoding-OPT) or ``"uno"`` (Decoding-UNO): sampling only
            (``engine.lossy``).
        epsilon: the lossy rules' over-acceptance ε.
        tree: a token tree of depth N (``specdec_tune.core.trees``: ``chains:M``, ``topk:b1-b2``,
            ``sequoia:B``, ``eagle:K:B``); ``""`` drafts a chain.
        staged: the inner drafter that speculates the draft model's own decoding (``ngram`` or a
            smaller model draft of the profile); ``""``: the draft decodes alone.
    """

    drafter: str
    num_speculative_tokens: int
    threshold: float = 0.0
    threshold_rule: str = "before"
    schedule: str = "constant"
    ngram_max: int = 3
    ngram_min: int = 1
    threshold_kind: str = "per-token"
    threshold_step: float = 0.05
    acceptance: str = "exact"
    epsilon: float = 0.0
    tree: str = ""
    staged: str = ""

    @property
    def is_plain(self) -> bool:
        return self.drafter == NONE or self.num_speculative_tokens == 0

    @property
    def is_ngram(self) -> bool:
        return self.drafter == NGRAM

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Candidate:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def label(self) -> str:
        """Short human label, e.g. ``mini-draft-1l N=4 θ=0.3``."""
        if self.is_plain:
            return "plain decoding"
        parts = [self.drafter, f"N={self.num_speculative_tokens}"]
        if self.is_ngram:
            parts.append(f"ngram {self.ngram_min}..{self.ngram_max}")
        if self.threshold_kind == "adaptive":
            parts.append(f"adaptive θ from {self.threshold:g} step {self.threshold_step:g}")
        elif self.threshold > 0:
            kind = " cumulative" if self.threshold_kind == "cumulative" else ""
            parts.append(f"θ={self.threshold:g}{kind}" + (" (hf rule)" if self.threshold_rule == "hf" else ""))
        if self.schedule != "constant":
            parts.append(self.schedule)
        if self.acceptance != "exact":
            parts.append(f"{self.acceptance.upper()} ε={self.epsilon:g}")
        if self.tree:
            parts.append(f"tree {self.tree}")
        if self.staged:
            parts.append(f"staged by {self.staged}")
        return " ".join(parts)


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
    """The model's :class:`SpecConfig` for a candidate (plain decoding: N = 0, no θ, constant)."""
    n = 0 if c.is_plain else c.num_speculative_tokens
    rule = c.threshold_rule if n and c.threshold > 0 else "before"
    kind = c.threshold_kind if n else "per-token"
    lossy = n and c.acceptance != "exact"
    return SpecConfig(n, c.threshold if n else 0.0, c.schedule if n else "constant", batch_size, mode,  # type: ignore[arg-type]
                      threshold_rule=rule, threshold_kind=kind, threshold_step=c.threshold_step,  # type: ignore[arg-type]
                      acceptance=c.acceptance if lossy else "exact", epsilon=c.epsilon if lossy else 0.0)  # type: ignore[arg-type]
