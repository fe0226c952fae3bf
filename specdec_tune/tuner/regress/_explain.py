"""Explain a throughput change with the throughput model (tuner.model): acceptance or time?

Each side of a comparison (baseline, current) becomes a :class:`~specdec_tune.tuner.model.ModelProfile`
built from what that side measured end to end: its recorded cycles as traces (acceptance: E[τ], α_i),
T_s = seconds inside the drafter per drafted token, and the rest of the wall time per cycle (target
verify forward, prefill and engine overhead: end-to-end samples cannot separate them) as a flat
"verify + overhead" term. ``tuner.model.predict`` then gives the throughput of every mix of the three
factors, and a Shapley split of log(throughput ratio) over (acceptance, draft time, verify+overhead)
says how much of the change each factor explains. The model's formulas are not re-implemented here.
"""
from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from specdec_tune.tuner.model import ModelProfile, SpecConfig, Trace, predict

FACTORS = ("acceptance", "draft", "verify")
_LABEL = {
    "acceptance": "acceptance fell",
    "draft": "the draft got slower",
    "verify": "the target's verify step / engine overhead got slower",
}


@dataclass(frozen=True)
class SideTerms:
    """Model terms measured on one side: traces, T_s and verify+overhead seconds per cycle."""

    traces: tuple[Trace, ...]
    draft_step_s: float
    verify_overhead_s: float
    alphas: tuple[float, ...]
    mean_tau: float
    draft_timed: bool = True  # False: a server backend (vLLM), whose draft time cannot be told from its step


def side_terms(samples: Sequence[dict], positions: int) -> SideTerms | None:
    """Terms from stored per-prompt samples (PromptSample JSON); None when no cycle was recorded."""
    traces = [Trace(tuple(min(1.0, max(0.0, c)) for c in conf), int(acc)) for s in samples for conf, acc in s.get("traces", [])]
    cycles = sum(int(s.get("cycles", 0)) for s in samples)
    if not traces or cycles == 0:
        return None
    wall = sum(statistics.median(s["seconds"]) for s in samples if s.get("seconds"))
    draft = sum(statistics.median(s["draft_seconds"]) for s in samples if s.get("draft_seconds"))
    drafted = sum(int(s.get("drafted", 0)) for s in samples)
    reached = [sum(s["reached"][i] for s in samples if len(s.get("reached", [])) > i) for i in range(positions)]
    accepted = [sum(s["accepted"][i] for s in samples if len(s.get("accepted", [])) > i) for i in range(positions)]
    alphas = tuple(a / r if r else math.nan for a, r in zip(accepted, reached))
    tau = sum(t.num_accepted + 1 for t in traces) / len(traces)
    return SideTerms(tuple(traces), draft / drafted if drafted else 0.0, max((wall - draft) / cycles, 1e-9), alphas, tau,
                     draft_timed=any(s.get("draft_seconds") for s in samples))


def _throughput(acc: SideTerms, draft: SideTerms, verify: SideTerms, n: int) -> float:
    k_max = max(n + 1, 2)
    profile = ModelProfile(
        draft_step_s={1: draft.draft_step_s} if draft.draft_step_s > 0 else {},
        verify_s={1: {1: verify.verify_overhead_s, k_max: verify.verify_overhead_s}},
        traces=acc.traces,
    )
    # θ = 0 and a constant schedule: the recorded cycles already carry the lengths θ and the
    # schedule produced, and replay cuts each at its own length.
    return predict(profile, SpecConfig(num_speculative_tokens=n)).tokens_per_s


@dataclass(frozen=True)
class Explanation:
    """Shapley shares of log(throughput ratio) per factor, and the sentence for the report."""

    shares: dict[str, float]  # factor -> contribution to log(current / baseline)
    model_ratio: float  # the model's current/baseline throughput (should be close to the measured)
    text: str


def explain(base: SideTerms, cur: SideTerms, n: int, fallen_positions: Sequence[int] = ()) -> Explanation:
    """Split the change current vs baseline into acceptance, draft time and verify+overhead time."""
    sides = {"b": base, "c": cur}
    cache: dict[tuple[str, ...], float] = {}

    def value(choice: tuple[str, ...]) -> float:
        if choice not in cache:
            cache[choice] = math.log(_throughput(sides[choice[0]], sides[choice[1]], sides[choice[2]], n))
        return cache[choice]

    shares = dict.fromkeys(FACTORS, 0.0)
    orders = list(itertools.permutations(range(3)))
    for order in orders:
        state = ["b", "b", "b"]
        for f in order:
            before = value(tuple(state))
            state[f] = "c"
            shares[FACTORS[f]] += (value(tuple(state)) - before) / len(orders)
    total = value(("c", "c", "c")) - value(("b", "b", "b"))
    worst = min(shares, key=shares.get)  # most negative = explains most of a slowdown
    if shares[worst] >= 0:
        worst = max(shares, key=shares.get)
    text = _sentence(worst, shares, base, cur, total, fallen_positions)
    return Explanation(shares, math.exp(total), text)


def _positions(ps: Sequence[int]) -> str:
    ps = sorted(ps)
    if not ps:
        return ""
    if ps == list(range(ps[0], ps[-1] + 1)) and len(ps) > 1:
        return f"positions {ps[0]}-{ps[-1]}"
    return ("position " if len(ps) == 1 else "positions ") + ", ".join(str(p) for p in ps)


def _sentence(factor: str, shares: dict[str, float], base: SideTerms, cur: SideTerms, total: float,
              fallen: Sequence[int]) -> str:
    pct = {f: 100 * (math.exp(v) - 1) for f, v in shares.items()}
    parts = ", ".join(f"{f} {pct[f]:+.1f}%" for f in FACTORS)
    direction = "slower" if total < 0 else "faster"
    if factor == "acceptance":
        where = _positions(fallen) or _positions(
            [i + 1 for i, (a, b) in enumerate(zip(base.alphas, cur.alphas))
             if not (math.isnan(a) or math.isnan(b)) and b < a - 0.02])
        alphas = "; ".join(f"α_{i} {base.alphas[i - 1]:.2f} → {cur.alphas[i - 1]:.2f}" for i in sorted(fallen)[:4]
                           if i - 1 < min(len(base.alphas), len(cur.alphas)))
        why = f"acceptance fell{' at ' + where if where else ''} (E[τ] {base.mean_tau:.2f} → {cur.mean_tau:.2f}" \
              f"{'; ' + alphas if alphas else ''})"
        if total > 0:
            why = f"acceptance rose (E[τ] {base.mean_tau:.2f} → {cur.mean_tau:.2f})"
    elif factor == "draft":
        why = f"the draft got {'slower' if total < 0 else 'faster'} (T_s {1e3 * base.draft_step_s:.3f} → " \
              f"{1e3 * cur.draft_step_s:.3f} ms per drafted token)"
    elif not (base.draft_timed or cur.draft_timed):
        why = f"the server's decode step (draft + verify + overhead: not separable from outside the server) got " \
              f"{'slower' if total < 0 else 'faster'} ({1e3 * base.verify_overhead_s:.3f} → " \
              f"{1e3 * cur.verify_overhead_s:.3f} ms per step)"
    else:
        why = f"the target's verify step / engine overhead got {'slower' if total < 0 else 'faster'} " \
              f"(T_v + overhead {1e3 * base.verify_overhead_s:.3f} → {1e3 * cur.verify_overhead_s:.3f} ms per cycle)"
    return f"{direction} because {why}; model split of the throughput change: {parts} (predicted from measured terms)"
