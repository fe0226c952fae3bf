"""Sampling acceptance from the teacher-forced 1 - TV per position, and lossy acceptance from the
drafted tokens' p and q (private half of :mod:`tuner.model`; pure Python).

**From TV** (docs/model.md, Acceptance from TV). A profile with a temperature stores, for each tuning
prompt, a generation sampled from the target and, at every generated position t, a_t = 1 - TV(p_t, q_t):
the probability that speculative sampling accepts the draft's token there (Leviathan et al. 2023;
Yin et al. 2024, Theorem 1), and the draft's top probability c_t. A cycle that starts at t drafts
L_t = min(N, M - t) tokens, cut before the first c_{t+i} < θ; it accepts j tokens with probability
Π_{i<j} a_{t+i} · (1 - a_{t+j}) (all L_t: Π a) and the next cycle starts at t + j + 1. The visit
probability of each start position follows forward in t, so the expected cycles of a generation, and
every per-cycle expectation, come without running speculative decoding. Approximations, said where
the numbers are printed: a_t is read on the target's text, while the draft's own tokens shape the
context of later draft positions only after they are accepted (exactly the target's distribution in
exact sampling), and c_{t+i} is the draft's top probability on the target's text, not on its own
drafted prefix; the tuning prompts' generations stand for held-out ones.

**Lossy acceptance** (``engine.lossy``): a sampling trace records each drafted token's q(x_i) and
p(x_i); under over-acceptance ε it is accepted with probability min(1, (p(x_i) + ε)/q(x_i)), so a
recorded cycle's expected τ is 1 + Σ_k Π_{i≤k} b_i. The drafted tokens do not depend on the
acceptance rule, so this is the exact expectation given the recorded drafts. Decoding-OPT and
Decoding-UNO share b, hence their speed; they differ in bias only.
"""
from __future__ import annotations

from collections.abc import Sequence

from specdec_tune.core.errors import InputError
from specdec_tune.core.schedules import threshold_cut
from specdec_tune.tuner.model._replay import ReplayStats, Trace


class _Tally:
    """Weighted sums over cycles (weights: visit probabilities or 1 per recorded cycle)."""

    def __init__(self, n: int) -> None:
        self.weight = self.tau = self.length = self.forwards = self.grow = 0.0
        self.lengths: dict[int, float] = {}
        self.forward_counts: dict[int, float] = {}
        self.reached = [0.0] * n
        self.accepted = [0.0] * n

    def add(self, w: float, accept: Sequence[float], length: int, cut: bool) -> None:
        """One cycle of weight ``w`` drafting ``length`` tokens accepted with probabilities ``accept``."""
        survive = 1.0
        for i in range(length):
            self.reached[i] += w * survive
            survive *= accept[i]
            self.accepted[i] += w * survive
            self.tau += w * survive
        self.weight += w
        self.tau += w
        self.length += w * length
        forwards = length + 1 if cut else length
        self.forwards += w * forwards
        self.forward_counts[forwards] = self.forward_counts.get(forwards, 0.0) + w
        self.grow += w * survive  # P(A == L); a cycle with L = 0 grows (schedules.heuristic_grows)
        self.lengths[length] = self.lengths.get(length, 0.0) + w

    def stats(self) -> ReplayStats:
        if self.weight <= 0:
            raise InputError("no cycle to predict from (empty teacher-forced generations or traces)")
        w = self.weight
        return ReplayStats(mean_tau=self.tau / w, mean_draft_length=self.length / w, mean_draft_forwards=self.forwards / w,
                           draft_length_dist={k: v / w for k, v in sorted(self.lengths.items())},
                           all_accepted_rate=self.grow / w, reached=tuple(r / w for r in self.reached),
                           accepted=tuple(a / w for a in self.accepted),
                           draft_forwards_dist={f: v / w for f, v in sorted(self.forward_counts.items())})


def tv_stats(generations: Sequence[tuple[Sequence[float], Sequence[float]]], n: int, theta: float = 0.0) -> ReplayStats:
    """Per-cycle expectations at (N, per-token θ) from teacher-forced (1 - TV, top q) per position.

    Args:
        generations: per generation, (a_t, c_t) for t = 0..M-1.
        n: N, the most tokens drafted per cycle.
        theta: per-token θ (rule before) on the draft's top probability.
    """
    tally = _Tally(n)
    for accept, top in generations:
        size = len(accept)
        visit = [0.0] * (size + 1)
        visit[0] = 1.0 if size else 0.0
        for t in range(size):
            v = visit[t]
            if v <= 0:
                continue
            budget = min(n, size - t)  # the engine never drafts past the generation's last token
            length, cut = threshold_cut(top[t:t + budget], budget, theta)
            probs = accept[t:t + length]
            tally.add(v, probs, length, cut)
            survive = 1.0
            for j in range(length + 1):  # j tokens accepted, the next cycle starts at t + j + 1
                p_j = survive * (1.0 - probs[j]) if j < length else survive
                visit[min(t + j + 1, size)] += v * p_j
                survive *= probs[j] if j < length else 1.0
    return tally.stats()


def lossy_stats(traces: Sequence[Trace], n: int, theta: float, epsilon: float, kind: str = "per-token") -> ReplayStats:
    """Per-cycle expectations of sampling traces under over-acceptance ε (module docstring)."""
    tally = _Tally(n)
    for trace in traces:
        if trace.target_probs is None or trace.token_probs is None:
            raise InputError("lossy acceptance needs the drafted tokens' target and draft probabilities, which these "
                             "sampling traces lack (recorded before they were stored); profile again")
        cap = min(n, len(trace.confidences))
        length, cut = threshold_cut(trace.confidences, cap, theta, kind=kind, token_probs=trace.token_probs)
        accept = [min(1.0, (p + epsilon) / q) if q > 0 else 1.0
                  for p, q in zip(trace.target_probs[:length], trace.token_probs[:length])]
        tally.add(1.0, accept, length, cut)
    return tally.stats()
