"""What a model's CUDA-graph runner (:mod:`engine.cuda_graphs`) has made, and what a decode replays.

A measurement snapshots :class:`GraphCounters` before and after every timed region: two equal snapshots
prove that no graph was captured and no key/value slot allocated while it timed (on the CPU too, where
the runner's static-cache stand-ins are counted alike). :func:`decode_keys` names the graphs a decode at
N can replay, so a warm-up makes all of them first (:func:`prepare_graphs`). Eager models (no runner)
have no counters: ``None``.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec_tune.core.limits import MAX_GRAPH_TOKENS


@dataclass(frozen=True)
class GraphCounters:
    """What a runner (:class:`~specdec_tune.engine.cuda_graphs.GraphRunner`) has made so far (a snapshot):
    a timed region between two equal snapshots ran no capture and allocated no key/value slot.

    Attributes:
        made: graphs made (captured on CUDA, their static inputs on the CPU) or attempted.
        captured: CUDA graphs captured.
        slots: slots held now; ``slots_made``: slots ever allocated; ``evicted``: idle slots dropped.
        failed: why capture failed (then every forward runs eagerly), or None.
    """

    made: int = 0
    captured: int = 0
    slots: int = 0
    slots_made: int = 0
    evicted: int = 0
    failed: str | None = None

    def moved_since(self, before: GraphCounters) -> dict[str, int | str]:
        """What changed since ``before`` that costs a timed region time: graphs made, slots allocated, a
        capture that failed (empty: nothing)."""
        out: dict[str, int | str] = {k: getattr(self, k) - getattr(before, k) for k in ("made", "slots_made")
                                     if getattr(self, k) != getattr(before, k)}
        if self.failed != before.failed:
            out["failed"] = str(self.failed)
        return out

    def to_json(self) -> dict:
        return dict(self.__dict__)


def decode_keys(n: int, draft: bool) -> tuple[tuple[int, int], ...]:
    """The graphs (``(new tokens, logits kept)``) a decode drafting up to ``n`` tokens can replay: the
    target's verify widths 1..n + 1 (a plain decoding step is width 1); a draft model's step (1, 1) and its
    catch-up (2, 1) after a fully accepted cycle (``ModelDrafter.propose`` feeds the bonus token and the
    last drafted one, keeping one row), which no narrower-width capture makes."""
    if draft:
        return ((1, 1), (2, 1))
    return tuple((k, k) for k in range(1, min(n + 1, MAX_GRAPH_TOKENS) + 1))


def graph_counters(model) -> GraphCounters | None:
    """The counters of ``model``'s runner (:class:`GraphCounters`), or None: it has none (eager)."""
    runner = getattr(model, "cuda_graph_runner", None)
    return runner.counters() if runner is not None else None


def prepare_graphs(model, keys) -> int:
    """:meth:`~specdec_tune.engine.cuda_graphs.GraphRunner.prepare` on ``model``'s runner (0 without one)."""
    runner = getattr(model, "cuda_graph_runner", None)
    return runner.prepare(keys) if runner is not None else 0
