"""The speculative-length schedules, defined once (engine, greedy simulation and replay call these).

Pure Python with no torch import, so the throughput model (``tuner.model``) can use it.

Heuristic schedule (HF transformers 5.23, ``AssistedCandidateGenerator.update_candidate_strategy`` in
``transformers/generation/candidate_generator.py``): ``if num_matches == len(scores[0]) - 1:
num_assistant_tokens += 2 else: num_assistant_tokens = max(1, num_assistant_tokens - 1)``.
``len(scores[0]) - 1`` is the number of candidates *proposed* in that cycle (L), not the length asked
for (N_cur), so the test is A == L. We follow it exactly, with two deliberate choices:

- L = 0 (a threshold refused the first position, or n-gram lookup found no match) counts as growth:
  A == L holds vacuously, and HF (whose candidate count is 0 there) grows too. Such a cycle carries no
  evidence that the draft is wrong, so shrinking N would be arbitrary.
- N_cur is capped at the N the user gave (HF grows without bound); the tuner's N is the cap.

Threshold kinds: :func:`stops_before` is the one stop rule the draft model's drafter
(``engine.drafters.ModelDrafter``), the trace replay and the greedy simulation (``tuner.model``) run;
:func:`threshold_cut` applies it to a recorded cycle, and :class:`AdaptiveThreshold` moves the adaptive
kind's θ between cycles.
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("constant", "heuristic")
THRESHOLD_RULES = ("before", "hf")
# How θ is applied (docs/architecture.md, Words): per-token (the top probability at the position),
# cumulative (the drafted prefix's probability times it; seed 004 "if prob(context) < threshold, stop
# generating"), adaptive (per-token, θ moved after each cycle by the verdict; seed 004 "adjust threshold
# based on whether base model accepts the generations").
THRESHOLD_KINDS = ("per-token", "cumulative", "adaptive")
ADAPTIVE_BOUNDS = (0.0, 0.9)  # the adaptive θ stays on its lattice inside these (0.9: a draft can still start)


def heuristic_grows(drafted: int, accepted: int) -> bool:
    """The heuristic schedule's "grow" event: every proposed token was accepted (A == L, L = 0 too)."""
    return accepted == drafted


def next_num_speculative(schedule: str, current: int, cap: int, drafted: int, accepted: int) -> int:
    """N_cur for the next cycle after a cycle that proposed ``drafted`` and accepted ``accepted``.

    Args:
        schedule: 'constant' (N every cycle) or 'heuristic' (see the module docstring).
        current: N_cur of the cycle just run.
        cap: N, the most tokens a cycle may draft.
        drafted: L, tokens proposed by the cycle.
        accepted: A, tokens of the draft accepted.
    """
    if schedule == "constant":
        return cap
    if schedule != "heuristic":
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    return min(cap, current + 2) if heuristic_grows(drafted, accepted) else max(1, current - 1)


def heuristic_transitions(size: int, n: int) -> tuple[int, int]:
    """(state after growth, state after shrinking) from N_cur = n in 1..size (the chain of the replay)."""
    return next_num_speculative("heuristic", n, size, 0, 0), next_num_speculative("heuristic", n, size, 1, 0)


def check_threshold_kind(kind: str, rule: str = "before") -> str:
    """``kind`` if it is a threshold kind that can run with ``rule``, else ``ValueError`` naming it.

    Only rule ``before`` decides before the token is drawn; the cumulative and adaptive kinds are
    defined on that decision (HF's rule ``hf`` is per-token only).
    """
    if kind not in THRESHOLD_KINDS:
        raise ValueError(f"threshold_kind must be one of {', '.join(THRESHOLD_KINDS)}, got {kind!r}")
    if rule not in THRESHOLD_RULES:
        raise ValueError(f"threshold_rule must be one of {', '.join(THRESHOLD_RULES)}, got {rule!r}")
    if kind != "per-token" and rule != "before":
        raise ValueError(f"threshold_kind {kind!r} needs threshold_rule 'before', got {rule!r}")
    return kind


def stops_before(kind: str, threshold: float, prefix_prob: float, top_prob: float) -> bool:
    """The one stop rule of rule ``before``: stop drafting before this position, before its token is drawn.

    It reads only the draft side of the cycle so far (the drafted prefix's probability and the draft's
    top probability here), never the token about to be drawn, so speculative sampling stays exact
    (docs/architecture.md, Words). ``adaptive`` compares like ``per-token``; its θ is moved between
    cycles by :class:`AdaptiveThreshold`.

    Args:
        kind: 'per-token', 'cumulative' or 'adaptive'.
        threshold: θ (0 never stops).
        prefix_prob: Π q(x_j) over the tokens drafted before this position in this cycle (1 at the first).
        top_prob: the draft's top probability at this position.
    """
    if threshold <= 0:
        return False
    score = prefix_prob * top_prob if kind == "cumulative" else top_prob
    return score < threshold


def threshold_cut(confidences, cap: int, threshold: float, rule: str = "before", *, kind: str = "per-token",
                  token_probs=None) -> tuple[int, bool]:
    """Proposed length under θ from per-position confidences (the same cut the drafter makes).

    ``before`` (ours, llama.cpp's ``--spec-draft-p-min``): stop before the first position where
    :func:`stops_before` holds. ``hf`` (transformers' ``ConfidenceCriteria``): propose the first token
    whose confidence is below θ, then stop (per-token only).

    Args:
        confidences: the draft's top probability at positions 1.. (at least ``cap`` of them are read when present).
        cap: the most tokens to propose.
        threshold: θ; 0 never cuts.
        rule: 'before' or 'hf'.
        kind: 'per-token', 'cumulative' or 'adaptive' (adaptive cuts like per-token at the θ given).
        token_probs: each drafted token's own draft probability q(x_i) (cumulative kind); ``None``:
            the confidences (greedy drafting, where the drafted token is the argmax).

    Returns:
        (L, cut): proposed length, and whether θ ended the draft before ``cap``.
    """
    check_threshold_kind(kind, rule)
    probs = confidences if token_probs is None else token_probs
    prefix = 1.0
    for i in range(min(cap, len(confidences))):
        if rule == "hf":
            if confidences[i] < threshold:
                return i + 1, i + 1 < cap
            continue
        if stops_before(kind, threshold, prefix, confidences[i]):
            return i, True
        prefix *= float(probs[i])
    return min(cap, len(confidences)), False


@dataclass(frozen=True)
class AdaptiveThreshold:
    """The adaptive kind's θ: moved after every cycle by the target's verdict, within bounds.

    θ lives on the lattice ``start + k·step`` inside :data:`ADAPTIVE_BOUNDS`: one step up after a cycle
    with a rejection (the draft was too bold), one step down after a cycle whose proposed tokens were
    all accepted (L = 0 included, as the heuristic schedule counts it: ``heuristic_grows``), never past
    a bound. The engine's drafter and the model's replay both walk this lattice, so they agree
    exactly. The move happens between cycles, from verdicts already taken, so it never touches
    exactness.

    Attributes:
        start: θ of the first cycle of a sequence.
        step: how far one verdict moves θ (> 0).
        low: the lowest θ (inclusive).
        high: the highest θ (inclusive).
    """

    start: float
    step: float
    low: float = ADAPTIVE_BOUNDS[0]
    high: float = ADAPTIVE_BOUNDS[1]

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high < 1.0:
            raise ValueError(f"adaptive θ bounds must satisfy 0 <= low <= high < 1, got {self.low}, {self.high}")
        if not self.low <= self.start <= self.high:
            raise ValueError(f"adaptive θ start {self.start} must lie in its bounds [{self.low}, {self.high}]")
        if not 0.0 < self.step <= 1.0:
            raise ValueError(f"threshold_step must be in (0, 1], got {self.step}")

    def levels(self) -> tuple[float, ...]:
        """The θ values the lattice can reach, ascending (rounded to 1e-9 so replay keys are stable)."""
        eps = 1e-9  # a level on a bound up to float noise stays
        below = int((self.start - self.low + eps) // self.step)
        above = int((self.high - self.start + eps) // self.step)
        return tuple(round(self.start + k * self.step, 9) for k in range(-below, above + 1))

    @property
    def start_index(self) -> int:
        """Index of ``start`` in :meth:`levels`."""
        return int((self.start - self.low + 1e-9) // self.step)

    def next_index(self, index: int, drafted: int, accepted: int) -> int:
        """The level after a cycle that proposed ``drafted`` tokens and had ``accepted`` accepted."""
        top = len(self.levels()) - 1
        return max(0, index - 1) if heuristic_grows(drafted, accepted) else min(top, index + 1)
