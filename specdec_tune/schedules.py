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
"""
from __future__ import annotations

SCHEDULES = ("constant", "heuristic")
THRESHOLD_RULES = ("before", "hf")
MAX_SPECULATIVE_TOKENS = 64  # the most tokens one cycle may draft (the engine's and the CLI's limit)


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


def threshold_cut(confidences, cap: int, threshold: float, rule: str = "before") -> tuple[int, bool]:
    """Proposed length under θ from per-position confidences (the same cut the drafter makes).

    ``before`` (ours, llama.cpp's ``--spec-draft-p-min``): stop before the first position whose top
    draft probability is below θ. ``hf`` (transformers' ``ConfidenceCriteria``): propose that token,
    then stop.

    Args:
        confidences: confidence of positions 1.. (at least ``cap`` of them are read when present).
        cap: the most tokens to propose.
        threshold: θ; 0 never cuts.
        rule: 'before' or 'hf'.

    Returns:
        (L, cut): proposed length, and whether θ ended the draft before ``cap``.
    """
    if rule not in THRESHOLD_RULES:
        raise ValueError(f"threshold_rule must be one of {', '.join(THRESHOLD_RULES)}, got {rule!r}")
    for i in range(min(cap, len(confidences))):
        if confidences[i] < threshold:
            length = i if rule == "before" else i + 1
            return length, length < cap
    return min(cap, len(confidences)), False
