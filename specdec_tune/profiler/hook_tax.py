"""The hooks' own cost: each decoding-pass design run unhooked and hooked, whole calls only (issue 37, R7).

Every in-loop term the model calibrates on (T_ar, the in-loop forwards, o_c, o_f, the θ term) was measured
with the recorder's hooks attached: three marks per forward and cycle (a ``perf_counter`` read on a CPU, a
CUDA event recorded on a GPU) and the hook calls themselves. Where the host is the bottleneck that host work
lengthens the loop; where the GPU is, it hides behind the queue. Timing the same decode with and without the
hooks, nothing inside it, measures what they added wherever it lands; the model takes it off the terms
(``tuner.model``: hook tax). Unhooked and hooked take turns in both orders, so a machine warming up or
slowing down lands on both.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec_tune.db import TimingRow
from specdec_tune.profiler.overhead import ForwardRecorder
from specdec_tune.profiler.timers import Stopwatch, synchronize

REPEATS = 2  # unhooked/hooked pairs per design and prompt


@dataclass(frozen=True)
class HookTaxCall:
    """One decode of a pass design: ``call(on_cycle)`` runs it (the cycle callback is None unhooked).

    Attributes:
        draft: the draft's name (None: plain decoding).
        n: the design's N (0: plain decoding).
        threshold: the design's θ (> 0: the θ pass).
        call: runs the decode once.
    """

    draft: str | None
    n: int
    threshold: float
    call: Callable[[Callable | None], object]


def _bare(call: HookTaxCall, device) -> float:
    watch = Stopwatch(device)
    synchronize(device)
    watch.start()
    call.call(None)
    return watch.stop()


def _hooked(call: HookTaxCall, recorder: ForwardRecorder, models: Sequence[torch.nn.Module]) -> tuple[float, int]:
    with recorder.attach(*models):
        recorder.begin()
        call.call(recorder.on_cycle)
        timeline = recorder.finish()
    return timeline.wall_s, len(timeline.forwards)


def hook_tax_rows(recorder: ForwardRecorder, models: Sequence[torch.nn.Module], calls: Sequence[HookTaxCall],
                  device, repeats: int = REPEATS) -> list[TimingRow]:
    """Per call and repeat, its hooked and its unhooked wall, each per hooked forward, as a ``hooked_call`` and a
    ``bare_call`` row in that order (the θ pass's design as ``hooked_call_threshold`` / ``bare_call_threshold``;
    k = the design's N + 1, 1 for plain decoding): their difference is the hooks' tax. ``recorder`` must not be
    attached (its hooks are attached per call)."""
    rows = []
    with torch.inference_mode():
        for r in range(repeats):
            for c in calls:
                if r % 2 == 0:
                    bare = _bare(c, device)
                    wall, forwards = _hooked(c, recorder, models)
                else:
                    wall, forwards = _hooked(c, recorder, models)
                    bare = _bare(c, device)
                suffix, per = ("_threshold" if c.threshold > 0 else ""), max(forwards, 1)
                rows += [TimingRow(f"hooked_call{suffix}", c.n + 1, 1, 0, wall / per, draft=c.draft),
                         TimingRow(f"bare_call{suffix}", c.n + 1, 1, 0, bare / per, draft=c.draft)]
    return rows
