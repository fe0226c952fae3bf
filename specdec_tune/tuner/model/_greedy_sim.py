"""Exact replay of greedy speculative decoding over recorded roll-outs (used by :mod:`._predict`).

Greedy decoding is deterministic, so the draft's roll-out from any output position is a suffix of a
recorded θ = 0, N = N_max cycle; :func:`position_traces` rebuilds one roll-out per output position
and :func:`simulate_prompt` runs the engine's loop (budget, threshold cut, accepted prefix, schedule)
over them. Pure Python.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from specdec_tune.db import TraceRow
from specdec_tune.core.schedules import AdaptiveThreshold, heuristic_grows, next_num_speculative, threshold_cut
from specdec_tune.tuner.model._replay import ReplayStats


@dataclass(frozen=True)
class PositionTrace:
    """The draft's roll-out from one output position (greedy): confidences, accepted prefix length,
    and whether the first rejection lies inside the recorded confidences (else unknown beyond)."""

    confidences: tuple[float, ...]
    accepted: int
    rejection_known: bool


def position_traces(
    cycles: Sequence[TraceRow],
    continuations: dict[int, tuple[float, bool]] | None = None,
    cap: int = 64,
) -> tuple[PositionTrace, ...]:
    """Greedy roll-outs from every output position of one prompt, from its recorded cycles.

    A cycle starting at output position j drafted d_1..d_L with confidences c_1..c_L and had A
    accepted. For 0 ≤ i ≤ A the context at position j + i is the cycle's context plus d_1..d_i
    (the target's own tokens), so the greedy draft's roll-out from there is d_{i+1}..d_L: the
    confidences c_{i+1}.. and A - i accepted. The next cycle starts at j + A + 1.

    When all L were accepted, the roll-out goes on at the bonus position: ``continuations[c]`` holds
    the draft's (confidence, matched) there (teacher-forced, ``profiler.acceptance``); on a match it
    continues as the next cycle's roll-out. Without that entry the roll-out is unknown past d_L.

    Args:
        cycles: one prompt's traces in decode order.
        continuations: cycle index -> (confidence, accepted) at its bonus position.
        cap: longest roll-out kept per position (the largest N predicted).
    """
    continuations = continuations or {}
    full: list[tuple[tuple[float, ...], int, bool]] = [((), 0, False)] * len(cycles)
    for c in range(len(cycles) - 1, -1, -1):
        confs, acc = tuple(cycles[c].confidences), cycles[c].num_accepted
        cont = continuations.get(c)
        if acc < len(confs):
            full[c] = (confs, acc, True)
        elif cont is None or c + 1 >= len(cycles):
            full[c] = (confs, acc, False)
        elif cont[1]:
            nxt_confs, nxt_acc, nxt_known = full[c + 1]
            full[c] = ((confs + (cont[0],) + nxt_confs)[: 2 * cap], acc + 1 + nxt_acc, nxt_known)
        else:
            full[c] = (confs + (cont[0],), acc, True)
    out: list[PositionTrace] = []
    for c, row in enumerate(cycles):
        confs, acc, known = full[c]
        for i in range(row.num_accepted + 1):
            tail = confs[i:i + cap]
            accepted = min(acc - i, len(tail))
            out.append(PositionTrace(tail, accepted, known and accepted < len(tail)))
    return tuple(out)


def rollout_traces(rollouts: dict, cap: int = 64) -> tuple[PositionTrace, ...]:
    """An EAGLE-3 head's greedy roll-outs from every output position of one prompt, recorded as they start
    there (``profiler.head_profile``: ``ranks[s][j]``, the target token's rank at chain step s + 1 from
    position j, and ``top[s][j]``, the head's highest probabilities there). The head's guess depends on
    where its chain began, so suffixes of cycles (:func:`position_traces`) would not do."""
    ranks, top = rollouts["ranks"], rollouts["top"]
    out = []
    for j in range(len(ranks[0]) if ranks else 0):
        steps = [s for s in range(min(len(ranks), cap)) if j < len(ranks[s])]
        confs = tuple(float(top[s][j][0]) for s in steps)
        accepted = next((i for i, s in enumerate(steps) if ranks[s][j] != 0), len(steps))
        out.append(PositionTrace(confs, accepted, accepted < len(confs)))
    return tuple(out)


class SimulatedCycle(NamedTuple):
    """One cycle of the replayed loop: the draft length proposed (L), the tokens accepted (A) and the
    draft forwards run (F: L, or L + 1 when the θ rule 'before' computed one more position to stop)."""

    proposed: int
    accepted: int
    forwards: int


def simulate_prompt(
    positions: Sequence[PositionTrace],
    new_tokens: int,
    max_new_tokens: int,
    n: int,
    theta: float,
    schedule: str = "constant",
    tail_rate: float | Callable[[float], float] = 1.0,
    threshold_rule: str = "before",
    kind: str = "per-token",
    step: float = 0.05,
) -> list[SimulatedCycle]:
    """Replay the engine's loop over one prompt's greedy position traces.

    Every rule is the engine's (``specdec_tune.core.schedules``): the cut of :func:`threshold_cut` with the
    threshold kind, the schedule's next N and the adaptive kind's next θ level. A roll-out past what
    the N_max cycle drafted continues at ``tail_rate`` (P(confidence ≥ θ') for the per-position
    threshold θ' there: θ, or θ over the drafted prefix's probability for the cumulative kind).

    Returns:
        (L, A, F) per cycle: proposed length, accepted, draft forwards, in decode order.
    """
    rate = tail_rate if callable(tail_rate) else (lambda _theta: tail_rate)
    policy = AdaptiveThreshold(theta, step) if kind == "adaptive" else None
    levels = policy.levels() if policy else (theta,)
    level = policy.start_index if policy else 0
    out: list[SimulatedCycle] = []
    j, n_cur = 0, n
    while j < new_tokens and j < len(positions):
        pt = positions[j]
        budget = min(n_cur, max_new_tokens - j)
        confs, theta_now = pt.confidences, levels[level]
        length, cut = threshold_cut(confs, budget, theta_now, threshold_rule, kind=kind)
        if not cut and budget > len(confs):  # roll-out past what the N_max cycle drafted: continue at the tail rate
            prefix = math.prod(confs) if kind == "cumulative" else 1.0
            per_position = theta_now / prefix if prefix > 0 else math.inf
            r = rate(per_position) if per_position < 1 else 0.0
            extra = budget - len(confs)
            expected = sum(r**m for m in range(1, extra + 1))
            length = len(confs) + int(round(expected))
            cut = length < budget
        accepted = min(length, pt.accepted)
        out.append(SimulatedCycle(length, accepted, length + 1 if cut and threshold_rule == "before" else length))
        j += accepted + 1
        n_cur = next_num_speculative(schedule, n_cur, n, length, accepted)  # the engine's rule
        if policy is not None:
            level = policy.next_index(level, length, accepted)
    return out


def stats_from_cycles(cycles: Sequence[SimulatedCycle], n: int) -> ReplayStats:
    count = len(cycles)
    lengths: dict[int, int] = defaultdict(int)
    forwards: dict[int, int] = defaultdict(int)
    reached, accepted = [0] * n, [0] * n
    for length, acc, f in cycles:
        lengths[length] += 1
        forwards[f] += 1
        for i in range(min(length, acc + 1)):
            reached[i] += 1
        for i in range(acc):
            accepted[i] += 1
    return ReplayStats(
        mean_tau=sum(a + 1 for _, a, _ in cycles) / count,
        mean_draft_length=sum(length for length, _, _ in cycles) / count,
        mean_draft_forwards=sum(f for _, _, f in cycles) / count,
        draft_length_dist={k: v / count for k, v in sorted(lengths.items())},
        all_accepted_rate=sum(heuristic_grows(length, a) for length, a, _ in cycles) / count,
        reached=tuple(r / count for r in reached),
        accepted=tuple(a / count for a in accepted),
        draft_forwards_dist={f: v / count for f, v in sorted(forwards.items())},
    )
