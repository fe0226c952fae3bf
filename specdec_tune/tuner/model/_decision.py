"""What each server's file carries, and the measured evidence behind it: one record per server.

A server's file carries a speculative configuration only when that configuration was measured
interleaved with plain decoding on *held-out* prompts and the lower bound of its paired 95 % CI of
the speedup is at least :data:`MIN_LOWER` (1.0): otherwise it may be slower than plain decoding for
this user, and the file carries plain decoding and says why, with the measured numbers
(docs/architecture.md, Measurement rules; docs/servers.md, Exports).

:class:`ServerDecision` is the data contract: ``tune`` makes one per server, the exports and their
README render from it, the ``tune`` report prints it, and the study stores it as JSON (the values of
``TuningResult.best_per_server``). :func:`decide` is the rule, pure and alone, so every caller (the
tuner, an exporter reading an older study, a future per-batch-size rule) applies the same one.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from specdec_tune.tuner.model._configs import NONE, Candidate, TuningResult

MIN_LOWER = 1.0  # the CI lower bound a shipped speculative configuration needs (not slower than plain decoding)
SPECULATE = "speculate"
PLAIN = "plain"

_PLAIN_CANDIDATE = Candidate(NONE, 0)


def decide(candidate: Candidate, speedup: float | None, ci: tuple[float, float] | None, *,
           heldout: bool = True, min_lower: float = MIN_LOWER) -> tuple[str, str]:
    """``(decision, reason)`` for shipping ``candidate``, from its measured held-out speedup and CI.

    Args:
        candidate: the configuration measured.
        speedup: its measured speedup over plain decoding (``None``: not measured).
        ci: the paired 95 % CI of that speedup (``None``: not measured, or not finite).
        heldout: the measurement ran on held-out prompts (a tuning-prompt measurement is not evidence).
        min_lower: the lower bound the CI needs.

    Returns:
        ``(SPECULATE, why)`` or ``(PLAIN, why)``; ``why`` names the numbers.
    """
    if candidate.is_plain:
        return PLAIN, "plain decoding measured fastest inside this server's space (tuning prompts)"
    label = candidate.label()
    if speedup is None or ci is None or not all(math.isfinite(x) for x in (speedup, *ci)):
        return PLAIN, f"{label} has no measured held-out speedup with a 95% CI"
    if not heldout:
        return PLAIN, f"{label} was measured on tuning prompts only, not held out"
    measured = (f"{label} measured {speedup:.2f}× over plain decoding on held-out prompts "
                f"(95% CI {ci[0]:.2f}–{ci[1]:.2f})")
    if ci[0] < min_lower:
        return PLAIN, (f"{measured}: the CI's lower bound is below {min_lower:g}, so it may be slower than plain "
                       "decoding")
    return SPECULATE, measured


@dataclass(frozen=True)
class ServerDecision:
    """One server's measured configuration and what its file carries.

    Attributes:
        server: the capability table's name (``vllm``, ``sglang``, ``trtllm``, ``llamacpp``, ``hf``).
        candidate: the configuration measured for the server (the best measured inside its space).
        decision: :data:`SPECULATE` (the file carries ``candidate``) or :data:`PLAIN` (plain decoding).
        reason: why, with the measured numbers (one line).
        selected: how ``candidate`` was chosen (one line).
        predicted_tokens_per_s: the model's tokens/s for the held-out prompts measured (predicted).
        predicted_speedup: the model's speedup over plain decoding (predicted).
        measured_tokens_per_s: ``candidate``'s tokens/s on the held-out prompts (measured).
        baseline_tokens_per_s: plain decoding's tokens/s in the same interleaved passes (measured).
        speedup: measured over plain decoding, same prompts and passes.
        speedup_ci: its paired bootstrap 95 % CI.
        heldout: the measurement ran on prompts the profile never saw.
        per_batch_size: batch size -> N for ``candidate`` (B = 1 is its N; each other band as
            :func:`decide_bands` left it where the bands were measured, else the model's proposal).
        predicted_basis: what ``predicted_tokens_per_s`` was computed for (prompts, machine speed).
        per_batch_size_reasons: batch size -> why its N is what it is (measured, with the numbers).
    """

    server: str
    candidate: Candidate
    decision: str
    reason: str
    selected: str = ""
    predicted_tokens_per_s: float | None = None
    predicted_speedup: float | None = None
    measured_tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    heldout: bool = False
    per_batch_size: dict[int, int] = field(default_factory=dict)
    predicted_basis: str = ""
    per_batch_size_reasons: dict[int, str] = field(default_factory=dict)

    @property
    def speculates(self) -> bool:
        """The file carries ``candidate`` (else plain decoding)."""
        return self.decision == SPECULATE

    @property
    def shipped(self) -> Candidate:
        """What the server's file carries."""
        return self.candidate if self.speculates else _PLAIN_CANDIDATE

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the candidate's fields at the top level (what older readers of
        ``best_per_server`` take as the server's best), then the evidence and the decision."""
        return {**self.candidate.to_dict(), "server": self.server, "decision": self.decision, "reason": self.reason,
                "selected": self.selected, "shipped": self.shipped.to_dict(),
                "predicted_tokens_per_s": self.predicted_tokens_per_s, "predicted_speedup": self.predicted_speedup,
                "measured_tokens_per_s": self.measured_tokens_per_s,
                "baseline_tokens_per_s": self.baseline_tokens_per_s, "speedup": self.speedup,
                "speedup_ci": list(self.speedup_ci) if self.speedup_ci else None, "heldout": self.heldout,
                "measured_on": "held-out prompts" if self.heldout else "tuning prompts",
                "per_batch_size": {str(b): int(n) for b, n in self.per_batch_size.items()},
                "per_batch_size_reasons": {str(b): r for b, r in self.per_batch_size_reasons.items()},
                "predicted_basis": self.predicted_basis}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServerDecision | None:
        """Back from :meth:`to_dict`; ``None`` for an entry without a decision (a study from before
        decisions were recorded: its best per server is predicted only)."""
        if not d or "decision" not in d:
            return None
        ci = d.get("speedup_ci")
        return cls(server=str(d["server"]), candidate=Candidate.from_dict(d), decision=str(d["decision"]),
                   reason=str(d.get("reason", "")), selected=str(d.get("selected", "")),
                   predicted_tokens_per_s=d.get("predicted_tokens_per_s"), predicted_speedup=d.get("predicted_speedup"),
                   measured_tokens_per_s=d.get("measured_tokens_per_s"),
                   baseline_tokens_per_s=d.get("baseline_tokens_per_s"), speedup=d.get("speedup"),
                   speedup_ci=(float(ci[0]), float(ci[1])) if ci else None, heldout=bool(d.get("heldout")),
                   per_batch_size={int(b): int(n) for b, n in (d.get("per_batch_size") or {}).items()},
                   predicted_basis=str(d.get("predicted_basis") or ""),
                   per_batch_size_reasons={int(b): str(r) for b, r in (d.get("per_batch_size_reasons") or {}).items()})


def decisions(result: TuningResult) -> dict[str, ServerDecision]:
    """The servers of ``result`` with a measured decision (``tune`` records one per server it tuned for)."""
    out = {}
    for server, entry in result.best_per_server.items():
        d = ServerDecision.from_dict({**entry, "server": entry.get("server", server)})
        if d is not None:
            out[server] = d
    return out


@dataclass(frozen=True)
class BandEvidence:
    """What was measured for one batch size's band: the schedule's N there against plain decoding at that batch
    size, held out (``None`` speedup: not measured, and ``why``)."""

    speedup: float | None = None
    ci: tuple[float, float] | None = None
    heldout: bool = True
    batches: int = 0
    why: str | None = None


def decide_bands(candidate: Candidate, schedule: Mapping[int, int], evidence: Mapping[int, BandEvidence]
                 ) -> tuple[dict[int, int], dict[int, str]]:
    """Each batch size's N above 1 by :func:`decide` on its own band: it ships where the band's held-out
    speedup CI's lower bound is at least :data:`MIN_LOWER`; a band below it, or without a measured CI, speculates 0
    and so does every larger one (no server drafts more at a larger batch, TensorRT-LLM's rule). B = 1 keeps the
    configuration's own N (its decision is the configuration's). Returns (schedule, reasons)."""
    out, reasons, off = dict(schedule), {}, None
    for b in sorted(schedule):
        n = schedule[b]
        if b == 1:
            reasons[b] = "measured held out (the decision's numbers)"
            continue
        if off is not None:
            out[b], reasons[b] = 0, f"0: speculation turned off from B={off} (a larger batch drafts no more)"
            continue
        if n == 0:
            reasons[b] = f"0: predicted: speculation does not pay at B={b} (plain decoding, nothing to measure)"
            continue
        ev = evidence.get(b) or BandEvidence(why="not measured")
        if ev.speedup is None:
            out[b], off = 0, b
            reasons[b] = f"0: predicted N={n}, not measured at B={b} ({ev.why}); a band ships only with a measured CI"
            continue
        verdict, why = decide(replace(candidate, num_speculative_tokens=n), ev.speedup, ev.ci, heldout=ev.heldout)
        text = f"at B={b} ({ev.batches} batches of {b} held-out prompts): {why}"
        if verdict == SPECULATE:
            reasons[b] = f"N={n}: {text}"
        else:
            out[b], off, reasons[b] = 0, b, f"0: {text}"
    return out, reasons
