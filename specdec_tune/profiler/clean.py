"""Clean timed regions: no CUDA-graph capture, no new key/value slot and no garbage collection inside.

A timed decode or forward that captures a graph, allocates a slot or runs the garbage collector pays a
one-off cost (tens of milliseconds against a 60 ms request on a GPU) that the configuration does not pay
in steady state. Warm-ups make every graph and slot first (``engine.prepare_graphs``); this module proves
they did, and keeps the collector out (docs/architecture.md, Measurement rules):

- :class:`TimedRegions` snapshots the graph counters of every model of a run (``engine.graph_counters``:
  graphs made, slots allocated, a capture that failed) before and after each timed region. A region
  where they moved is **re-run** (the one-off is paid by then) up to :data:`MAX_RERUNS` times, its first
  samples discarded; one still moving after that is kept and counted ``unclean``. Every command says how
  many regions it checked, re-ran and left unclean, in its output and its JSON.
- :func:`quiet_gc` runs a timed stage with the collector frozen and disabled (``gc.collect(); gc.freeze();
  gc.disable()``), restored after; between regions :meth:`TimedRegions.run` collects what the last one left,
  outside the timer.

Eager models (a CPU, ``--cuda-graphs off``) have no counters: their regions are only counted.
"""
from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from specdec_tune.engine import graph_counters

T = TypeVar("T")

MAX_RERUNS = 2  # re-runs of a region whose counters moved (a one-off is paid once: the first re-run is clean)
MAX_MOVES_KEPT = 20  # moves listed in the report (the counts cover all)
POLICY = "a timed region in which a graph was captured or a KV slot allocated is re-run and its sample discarded"


@contextmanager
def quiet_gc() -> Iterator[None]:
    """The block runs with the garbage collector frozen and off; the collector's state is restored after."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


class TimedRegions:
    """The graph counters of a run's models, checked around every timed region (the module docstring).

    Args:
        models: name -> the module the engine runs (``LoadedModel.model``); eager ones are left out.
    """

    def __init__(self, models: Mapping[str, Any]) -> None:
        self.models = {name: m for name, m in models.items() if m is not None and graph_counters(m) is not None}
        self.regions = 0  # regions kept
        self.reruns = 0  # regions run again because the counters moved
        self.unclean = 0  # regions kept although the counters still moved
        self.moves: list[dict[str, Any]] = []

    def snapshot(self) -> dict[str, Any]:
        return {name: graph_counters(m) for name, m in self.models.items()}

    def run(self, fn: Callable[[], T], label: str = "") -> T:
        """``fn()`` (one timed region, which times itself) until the counters stay still, at most
        1 + :data:`MAX_RERUNS` times; returns the last result (the one kept)."""
        for attempt in range(MAX_RERUNS + 1):
            if not gc.isenabled():
                gc.collect()  # the last region's garbage, outside any timer (quiet_gc turned the collector off)
            before = self.snapshot()
            out = fn()
            moved = {name: c.moved_since(before[name]) for name, c in self.snapshot().items()}
            moved = {name: change for name, change in moved.items() if change}
            if not moved:
                break
            if len(self.moves) < MAX_MOVES_KEPT:
                self.moves.append({"region": label, "attempt": attempt + 1, "moved": moved})
            if attempt == MAX_RERUNS:
                self.unclean += 1
            else:
                self.reruns += 1
        self.regions += 1
        return out

    def merge(self, other: TimedRegions) -> None:
        """Add ``other``'s counts (regions of one run checked by several watchers)."""
        self.regions += other.regions
        self.reruns += other.reruns
        self.unclean += other.unclean
        self.moves += other.moves[:max(0, MAX_MOVES_KEPT - len(self.moves))]

    def report(self) -> dict[str, Any]:
        """What was checked, for the JSON output and the database."""
        return {"regions": self.regions, "reruns": self.reruns, "unclean": self.unclean, "clean": self.unclean == 0,
                "policy": POLICY, "watched": sorted(self.models),
                "counters": {name: c.to_json() for name, c in self.snapshot().items()}, "moves": list(self.moves)}

    def line(self) -> str:
        """One line for the output."""
        return describe(self.report())


def describe(report: Mapping[str, Any] | None) -> str:
    """One line for a stored :meth:`TimedRegions.report` (``None``: not checked, a run older than the check)."""
    if not report:
        return "timed regions: not checked"
    n, reruns, unclean = report["regions"], report["reruns"], report["unclean"]
    if not report.get("watched"):
        return f"timed regions: {n} timed with the garbage collector off (eager models: no CUDA graphs to watch)"
    head = f"timed regions: {n} checked"
    if not reruns and not unclean:
        return head + ", no graph capture or new KV slot inside any"
    tail = f", {reruns} re-run after a graph capture or new KV slot inside (first samples discarded)"
    if unclean:
        tail += f"; {unclean} still not clean after {MAX_RERUNS} re-runs (kept, flagged: warning)"
    return head + tail
