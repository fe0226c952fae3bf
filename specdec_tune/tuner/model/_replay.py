"""Trace replay and the heuristic-schedule Markov chain (private half of :mod:`tuner.model`).

A *trace* is one speculative cycle recorded with threshold θ = 0 and N = N_max: the draft's
confidence in each drafted token and the length of the prefix the target accepted. Because the
acceptance of draft token i depends only on the context (not on N or θ), one set of traces predicts
every (N, θ) by replay (docs/architecture.md, The throughput model): the proposed length L is cut at the first confidence
below θ, the accepted count is cut at L. Pure Python on purpose: a few thousand traces times a few
dozen configurations is milliseconds, and this module must not import torch.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdec_tune.core.errors import InputError
from specdec_tune.core.schedules import AdaptiveThreshold, heuristic_grows, heuristic_transitions, threshold_cut


@dataclass(frozen=True)
class Trace:
    """One speculative cycle recorded with θ = 0 and N = N_max.

    Attributes:
        confidences: the draft's top probability at each drafted position (the number θ is compared
            with; in greedy mode the drafted token's probability), ``[N_max]`` (shorter when the
            sequence ended). Positions after the first rejection carry a confidence but no outcome.
        num_accepted: length of the accepted prefix, 0..len(confidences).
        token_probs: each drafted token's own draft probability (the cumulative kind's prefix
            product); ``None`` means the confidences, right for greedy traces (the argmax is drafted).
        target_probs: each drafted token's target probability (sampling traces; lossy acceptance).
    """

    confidences: tuple[float, ...]  # [N_max]
    num_accepted: int
    token_probs: tuple[float, ...] | None = None  # [N_max] q(x_i) of each drafted token; None: the confidences
    target_probs: tuple[float, ...] | None = None  # [N_max] p(x_i) of each drafted token (sampling traces)

    def __post_init__(self) -> None:
        object.__setattr__(self, "confidences", tuple(float(c) for c in self.confidences))
        for name in ("token_probs", "target_probs"):
            values = getattr(self, name)
            if values is None:
                continue
            object.__setattr__(self, name, tuple(float(c) for c in values))
            if len(values) != len(self.confidences):
                raise InputError(f"trace has {len(values)} {name} for {len(self.confidences)} confidences")
        for c in self.confidences:
            # 1e-6 slack: a softmax computed in low precision can round a hair above 1.
            if not (0.0 <= c <= 1.0 + 1e-6):
                raise InputError(f"trace confidence {c!r} is not a probability in [0, 1]")
        if isinstance(self.num_accepted, bool) or not isinstance(self.num_accepted, int):
            raise InputError(f"trace num_accepted={self.num_accepted!r} must be an int")
        if not 0 <= self.num_accepted <= len(self.confidences):
            raise InputError(
                f"trace num_accepted={self.num_accepted} must lie in 0..{len(self.confidences)} "
                "(the number of recorded confidences)"
            )


@dataclass(frozen=True)
class ReplayStats:
    """Per-cycle expectations of one (N, θ) replayed over a set of traces.

    All numbers are averages over cycles (so mixtures of states are weighted sums).

    Attributes:
        mean_tau: E[τ], tokens emitted per cycle (accepted + 1).
        mean_draft_length: E[L], tokens proposed per cycle.
        mean_draft_forwards: E[F], draft forwards run per cycle (L, or L + 1 when θ cut the draft:
            the forward that produced the refused token still ran).
        draft_length_dist: P(L = l) for each l, for E[T_v(L + 1)].
        all_accepted_rate: P(A == L), the heuristic schedule's "grow" event (L = 0 counts:
            ``schedules.heuristic_grows``).
        reached: ``[N]`` P(token i proposed and tokens before it accepted), i = 0..N-1.
        accepted: ``[N]`` P(token i accepted), vLLM's unconditional per-position rate β_i.
        draft_forwards_dist: P(F = f) for each f, for the draft's expected seconds (its forwards warm up
            within a cycle, so E[seconds] is not E[F]·T_s); empty: only the mean is known.
    """

    mean_tau: float
    mean_draft_length: float
    mean_draft_forwards: float
    draft_length_dist: dict[int, float]
    all_accepted_rate: float
    reached: tuple[float, ...]  # [N]
    accepted: tuple[float, ...]  # [N]
    draft_forwards_dist: dict[int, float] = field(default_factory=dict)

    @property
    def acceptance_per_position(self) -> tuple[float, ...]:
        """Conditional α_i = accepted_i / reached_i (NaN where position i is never reached)."""
        return tuple(a / r if r > 0 else math.nan for a, r in zip(self.accepted, self.reached))


def cut_cycle(trace: Trace, n: int, threshold: float, rule: str = "before", kind: str = "per-token") -> tuple[int, int, int]:
    """Replay one trace under (N, θ) exactly as the engine runs a cycle (``schedules.threshold_cut``).

    Rule ``before`` stops before the first position where ``schedules.stops_before`` holds (that
    position's forward still ran); rule ``hf`` proposes the first token below θ, then stops (no
    further forward). The trace's confidences are the top draft probability per position; for rule
    ``hf`` in sampling mode the engine compares the sampled token's probability instead, so there
    the replay is an approximation (exact when greedy). The cumulative kind multiplies the drafted
    tokens' own probabilities (``Trace.token_probs``), which the traces recorded, so it is exact.

    Returns:
        (L, A, F): proposed length, accepted count, draft forwards run.
    """
    cap = min(n, len(trace.confidences))
    length, cut = threshold_cut(trace.confidences, cap, threshold, rule, kind=kind, token_probs=trace.token_probs)
    forwards = length + 1 if cut and rule == "before" else length
    return length, min(length, trace.num_accepted), forwards


def _piece(t: Trace, start: int, stop: int, accepted: int) -> Trace:
    """Positions ``start:stop`` of a validated trace with ``accepted`` of them accepted (0..stop - start),
    built without :class:`Trace`'s checks: slices of checked values need none, and the search replays
    n-gram lookup's cycles at every N of every trial (the checks made it 2.5 times as slow)."""
    piece = object.__new__(Trace)
    for name, value in (("confidences", t.confidences[start:stop]), ("num_accepted", accepted),
                        ("token_probs", None if t.token_probs is None else t.token_probs[start:stop]),
                        ("target_probs", None if t.target_probs is None else t.target_probs[start:stop])):
        object.__setattr__(piece, name, value)
    return piece


def lookup_cycles(traces: Sequence[Trace], n: int) -> tuple[Trace, ...]:
    """N-gram lookup's cycles recorded at N_max, as a loop drafting at most ``n`` would run them.

    A lookup cycle that proposed L tokens and had A of them accepted covers a stretch of A + 1 output
    tokens along which the lookup keeps matching the same earlier text. A loop with N = n < L runs
    that stretch as several cycles: each full one accepts n tokens and takes the target's bonus token,
    which the lookup had proposed too, and the next one continues the match after it. The last one
    stops where the recorded cycle stopped (a rejection, or the end of its proposal). Cutting each
    recorded cycle at n instead, as :func:`replay` does, drops the rest of the stretch. Weighting the
    recorded cycles equally then undercounts the cycles inside long matches, so τ comes out low at
    small n. At n ≥ L a cycle is unchanged. Confidences, and the
    token and target probabilities where recorded, are sliced with the cycle.

    Raises:
        InputError: ``n`` < 1.
    """
    if n < 1:
        raise InputError(f"N={n}: lookup cycles need N >= 1")

    out: list[Trace] = []
    for t in traces:
        proposed, right = len(t.confidences), t.num_accepted
        if proposed <= n:
            out.append(t)
            continue
        start = 0
        while True:
            length = min(n, proposed - start)
            accepted = min(length, right - start)
            out.append(_piece(t, start, start + length, accepted))
            # Go on only after a full cycle whose bonus token the lookup also had right, while it proposed more.
            if accepted < length or right - start == length or start + length + 1 >= proposed:
                break
            start += length + 1
    return tuple(out)


def replay_reach(traces: Sequence[Trace]) -> int:
    """The largest N the traces can replay: their longest recorded draft (0 without traces). Replay cannot
    invent outcomes that were never recorded (:func:`replay`)."""
    return max((len(t.confidences) for t in traces), default=0)


def replay(traces: Sequence[Trace], n: int, threshold: float = 0.0, rule: str = "before",
           kind: str = "per-token") -> ReplayStats:
    """Replay recorded θ = 0 traces under any N and threshold θ (docs/architecture.md, The throughput model).

    Args:
        traces: cycles recorded with θ = 0 and N = N_max.
        n: most tokens drafted per cycle, 0 <= n <= N_max of the traces.
        threshold: θ in [0, 1); drafting stops at the first token whose confidence is below θ.
        rule: 'before' (that token is not proposed) or 'hf' (it is proposed, then drafting stops).
        kind: 'per-token' or 'cumulative' (the drafted prefix's probability times the confidence);
            the adaptive kind replays per level (``tuner.model.predict``).

    Returns:
        The per-cycle expectations (see :class:`ReplayStats`).

    Raises:
        InputError: no traces, or ``n`` larger than the longest trace (replay cannot invent
            outcomes that were never recorded).
    """
    if not traces:
        raise InputError("replay needs at least one trace; the profile has none")
    n_max = replay_reach(traces)
    if n > n_max:
        raise InputError(f"N={n} exceeds the traces' N_max={n_max}; record traces with a larger N")
    if n < 0:
        raise InputError(f"N={n} must be >= 0")
    count = len(traces)
    tau = length_sum = forwards_sum = all_ok = 0
    lengths: dict[int, int] = {}
    forward_counts: dict[int, int] = {}
    reached = [0] * n
    accepted = [0] * n
    for trace in traces:
        length, acc, forwards = cut_cycle(trace, n, threshold, rule, kind)
        tau += acc + 1
        length_sum += length
        forwards_sum += forwards
        lengths[length] = lengths.get(length, 0) + 1
        forward_counts[forwards] = forward_counts.get(forwards, 0) + 1
        all_ok += heuristic_grows(length, acc)
        for i in range(min(length, acc + 1)):
            reached[i] += 1
        for i in range(acc):
            accepted[i] += 1
    return ReplayStats(
        mean_tau=tau / count,
        mean_draft_length=length_sum / count,
        mean_draft_forwards=forwards_sum / count,
        draft_length_dist={k: v / count for k, v in sorted(lengths.items())},
        all_accepted_rate=all_ok / count,
        reached=tuple(r / count for r in reached),
        accepted=tuple(a / count for a in accepted),
        draft_forwards_dist={k: v / count for k, v in sorted(forward_counts.items())},
    )


def constant_alpha_stats(alpha: float, n: int) -> ReplayStats:
    """The same expectations for constant acceptance α and no threshold (L = N always)."""
    return alpha_stats([alpha] * n)


def alpha_stats(alphas: Sequence[float]) -> ReplayStats:
    """Expectations for conditional per-position acceptance α_1..α_N and no threshold (L = N always):
    position i is reached with probability Π_{j<i} α_j and accepted with Π_{j<=i} α_j."""
    reached, accepted, survive = [], [], 1.0
    for a in alphas:
        if not 0.0 <= a <= 1.0:
            raise InputError(f"per-position acceptance {a!r} must lie in [0, 1]")
        reached.append(survive)
        survive *= a
        accepted.append(survive)
    n = len(alphas)
    return ReplayStats(
        mean_tau=1.0 + sum(accepted),
        mean_draft_length=float(n),
        mean_draft_forwards=float(n),
        draft_length_dist={n: 1.0},
        all_accepted_rate=survive,
        reached=tuple(reached),
        accepted=tuple(accepted),
        draft_forwards_dist={n: 1.0},
    )


def mix(stats: Sequence[ReplayStats], weights: Sequence[float]) -> ReplayStats:
    """Per-cycle expectations of a mixture of states (weights sum to 1)."""
    width = max(len(s.reached) for s in stats)
    dist: dict[int, float] = {}
    forwards: dict[int, float] = {}
    reached = [0.0] * width
    accepted = [0.0] * width
    for s, w in zip(stats, weights):
        for k, p in s.draft_length_dist.items():
            dist[k] = dist.get(k, 0.0) + w * p
        for f, p in s.draft_forwards_dist.items():
            forwards[f] = forwards.get(f, 0.0) + w * p
        for i, (r, a) in enumerate(zip(s.reached, s.accepted)):
            reached[i] += w * r
            accepted[i] += w * a
    return ReplayStats(
        mean_tau=sum(w * s.mean_tau for s, w in zip(stats, weights)),
        mean_draft_length=sum(w * s.mean_draft_length for s, w in zip(stats, weights)),
        mean_draft_forwards=sum(w * s.mean_draft_forwards for s, w in zip(stats, weights)),
        draft_length_dist=dict(sorted(dist.items())),
        all_accepted_rate=sum(w * s.all_accepted_rate for s, w in zip(stats, weights)),
        reached=tuple(reached),
        accepted=tuple(accepted),
        # a component that knows only its mean leaves the mixture with its mean only
        draft_forwards_dist=dict(sorted(forwards.items())) if all(s.draft_forwards_dist for s in stats) else {},
    )


def heuristic_stationary(grow: Sequence[float]) -> list[float]:
    """Stationary distribution of the heuristic schedule's N_cur over states 1..N.

    The schedule is ``schedules.next_num_speculative`` (HF "heuristic", capped): after a cycle whose
    proposed tokens were all accepted (L = 0 included), N_cur = min(N, N_cur + 2); otherwise
    N_cur = max(1, N_cur - 1). ``grow[n - 1]`` is P(all
    accepted | N_cur = n). When ``grow`` is non-increasing in n (it always is when it comes from
    replay or from α^n, since L only grows with n) the chain has one closed class, so the
    distribution is unique; the start state N only affects a transient we ignore.

    Returns:
        π, ``[N]``, with π[n - 1] the long-run fraction of cycles run at N_cur = n.
    """
    size = len(grow)
    if size == 0:
        raise InputError("the heuristic schedule needs N >= 1")
    moves = [tuple(m - 1 for m in heuristic_transitions(size, n + 1)) for n in range(size)]
    return chain_stationary(grow, moves)


def adaptive_stationary(grow: Sequence[float], policy: AdaptiveThreshold) -> list[float]:
    """Stationary distribution of the adaptive kind's θ over ``policy.levels()``.

    ``grow[k]`` is P(all proposed tokens accepted | θ = level k), from a replay at that level; after
    such a cycle θ steps down, otherwise up (``AdaptiveThreshold.next_index``, the engine's rule).
    Higher θ drafts less, so ``grow`` rises with k and the chain has one closed class.
    """
    moves = [(policy.next_index(k, 0, 0), policy.next_index(k, 1, 0)) for k in range(len(grow))]
    return chain_stationary(grow, moves)


def chain_stationary(grow: Sequence[float], moves: Sequence[tuple[int, int]]) -> list[float]:
    """Stationary distribution of a chain that moves from state s to ``moves[s][0]`` with probability
    ``grow[s]`` and to ``moves[s][1]`` otherwise (the heuristic schedule, the adaptive θ).

    Raises:
        InputError: the chain has no unique stationary distribution.
    """
    size = len(grow)
    # Balance equations sum_n π_n P[n][m] = π_m, one replaced by sum π = 1; solved by Gaussian
    # elimination with partial pivoting (the chains are small, and numpy is not worth the import here).
    rows = [[0.0] * (size + 1) for _ in range(size)]
    for n, (up, down) in enumerate(moves):
        rows[up][n] += grow[n]
        rows[down][n] += 1.0 - grow[n]
        rows[n][n] -= 1.0
    rows[-1] = [1.0] * size + [1.0]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-12:
            raise InputError(f"the chain has no unique stationary state (grow={list(grow)})")
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(size):
            if r != col and rows[r][col] != 0.0:
                f = rows[r][col] / rows[col][col]
                rows[r] = [x - f * y for x, y in zip(rows[r], rows[col])]
    pi = [max(0.0, rows[i][size] / rows[i][i]) for i in range(size)]
    total = sum(pi)
    return [p / total for p in pi]
