"""A profile run's timing samples grouped by what they measured (used by :mod:`._profile`). Pure."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from specdec_tune.db import TimingRow
from specdec_tune.tuner.model._calibration import interp


@dataclass(frozen=True)
class TimingKey:
    """What one group of timing samples measured (every sample of a group is one forward of this shape)."""

    kind: str
    draft: str | None
    k: int
    batch_size: int
    context_len: int


_ANY = object()  # a filter that matches every draft, target forwards included


def _median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else math.nan


class Timings:
    """A run's timing samples grouped by :class:`TimingKey`, in recording order."""

    def __init__(self, rows: Iterable[TimingRow]) -> None:
        self.groups: dict[TimingKey, list[float]] = defaultdict(list)
        for r in rows:
            self.groups[TimingKey(r.kind, r.draft, r.k, r.batch_size, r.context_len)].append(r.seconds)

    def select(self, kind: str, draft: object = _ANY,
               batch_size: int | None = None) -> Iterator[tuple[TimingKey, list[float]]]:
        for key, xs in self.groups.items():
            if key.kind == kind and (draft is _ANY or key.draft == draft) and batch_size in (None, key.batch_size):
                yield key, xs

    def verify_medians(self) -> dict[int, dict[int, float]]:
        """B -> k -> median T_v(B, k)."""
        out: dict[int, dict[int, float]] = defaultdict(dict)
        for key, xs in self.select("verify"):
            out[key.batch_size][key.k] = _median(xs)
        return out

    def prefills(self, draft: str | None, infos: Sequence, drop_last: bool) -> tuple[float, ...]:
        """Each prompt's prefill (its T_p, or T_p - 1 tokens with ``drop_last``), interpolated in length."""
        by_len = {key.k: _median(xs) for key, xs in self.select("prefill", draft)}
        if not by_len:
            return tuple(0.0 for _ in infos)
        return tuple(interp(by_len, p.prompt_tokens - (1 if drop_last else 0)) for p in infos)

    def overheads(self, draft: str | None) -> tuple[list[tuple[int, float]], list[float], list[float]]:
        """(per-cycle (draft forwards, seconds), per-sequence set-up seconds, plain loop's per-token seconds)."""
        cycles = [(key.k - 1, s) for key, xs in self.select("overhead", draft) if key.context_len > 0 for s in xs]
        sequence = [s for key, xs in self.select("overhead", draft) if key.context_len == 0 for s in xs]
        plain = [s for _, xs in self.select("overhead", None) for s in xs]
        return cycles, sequence, plain

    def draft_steps(self, draft: str, batch_sizes: Sequence[int], context: int) -> dict[int, float]:
        """B -> the draft-step micro-benchmark interpolated at ``context`` (batch sizes without samples left out)."""
        out = {}
        for b in batch_sizes:
            points = {key.context_len: _median(xs) for key, xs in self.select("draft_step", draft, b)}
            if points:
                out[b] = interp(points, context)
        return out

    def context_slopes(self, typical: int) -> dict[int, float]:
        """k -> seconds a B = 1 verify of k tokens gains per context token: the least-squares line through
        its medians at the typical context (kind verify) and the others (kind verify_context), at least 0
        (attending over more positions costs no less; a tiny model's timing noise can tilt the line the
        other way, as the prefill line is kept >= 0) and at most the slope that keeps the verify's cost at
        context 0 from going negative (its time at the typical context ÷ that context: a verify over no
        context still costs something; a noisy, steep line would otherwise predict a short request's
        cycles in negative seconds); k without another context left out."""
        by_k: dict[int, dict[int, float]] = defaultdict(dict)  # k -> context -> median
        for key, xs in self.select("verify_context", batch_size=1):
            by_k[key.k][key.context_len] = _median(xs)
        out = {}
        for k, points in sorted(by_k.items()):
            typical_xs = self.groups.get(TimingKey("verify", None, k, 1, typical))
            if typical_xs:
                points[typical] = _median(typical_xs)
            if len(points) >= 2:  # distinct context lengths (dict keys): the line is defined
                slope = statistics.linear_regression(list(points), list(points.values())).slope
                at_typical = points[typical] if typical in points else interp(points, typical)
                out[k] = min(max(0.0, slope), max(0.0, at_typical) / typical if typical > 0 else slope)
        return out

    def probe(self) -> float | None:
        """The machine probe's median seconds over the run (None: not recorded)."""
        xs = [x for _, samples in self.select("machine_probe") for x in samples]
        return statistics.median(xs) if xs else None

    def probe_cv(self) -> float | None:
        """The machine probe's coefficient of variation over the run (None: fewer than 2 samples)."""
        xs = [x for _, samples in self.select("machine_probe") for x in samples]
        return statistics.stdev(xs) / statistics.fmean(xs) if len(xs) >= 2 and statistics.fmean(xs) > 0 else None

    def plain_loop(self) -> list[float]:
        """The plain decoding loop's in-loop target forwards at B = 1."""
        return [x for _, xs in self.select("autoregressive", batch_size=1) for x in xs]

    def hook_taxes(self, draft: str | None) -> tuple[list[float], list[float], list[float]]:
        """The hooks' cost per hooked forward, hooked minus unhooked call of each pair (``profiler.hook_tax``):
        plain decoding's, the θ = 0 pass designs' of ``draft`` and its θ > 0 pass's."""
        def of(suffix: str, name: str | None) -> list[float]:
            return [h - b for key, xs in self.select(f"hooked_call{suffix}", name)
                    for h, b in zip(xs, self.groups.get(replace(key, kind=f"bare_call{suffix}"), []))]

        return of("", None), of("", draft), of("_threshold", draft)

    def first_cycles(self, draft: str | None) -> list[tuple[int, int, float, int]]:
        """``(F, L, seconds, prompt tokens)`` of every hooked decode's first cycle and tail (``first_cycle`` rows:
        θ = 0 passes, F = L = k - 1; plain decoding's have k = 1)."""
        return [(key.k - 1, key.k - 1, x, key.context_len) for key, xs in self.select("first_cycle", draft) for x in xs]
