"""Timers: CUDA events on a GPU, ``time.perf_counter`` on a CPU; warm-up, repeats, percentiles.

Measurement rules (docs/architecture.md, Measurement rules): warm up before timing and report warm-up
separately; on a GPU record events around the work and synchronise once at the boundary; keep raw
samples.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class TimingSamples:
    """Raw timings (seconds) of repeated calls, with their summary."""

    samples: tuple[float, ...]
    warmup: tuple[float, ...] = field(default=())

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    def quantile(self, q: float) -> float:
        """Linear-interpolated quantile ``q`` in [0, 1] of the samples."""
        xs = sorted(self.samples)
        if len(xs) == 1:
            return xs[0]
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    @property
    def p10(self) -> float:
        return self.quantile(0.10)

    @property
    def p90(self) -> float:
        return self.quantile(0.90)


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued GPU work (no-op on a CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Measures one interval on ``device``: CUDA events on a GPU, perf_counter on a CPU.

    Use ``start()`` / ``stop()`` (returns seconds). On a GPU ``stop`` synchronises once, at the
    boundary, after recording the end event.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.device = device
        self._t0 = 0.0
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1000.0
        return time.perf_counter() - self._t0


def time_callable(
    fn: Callable[[], Any],
    *,
    warmup: int = 3,
    repeats: int = 10,
    device: torch.device | str | None = None,
    setup: Callable[[], Any] | None = None,
) -> TimingSamples:
    """Time ``fn()`` ``repeats`` times after ``warmup`` untimed-but-recorded calls.

    Args:
        fn: the work to time.
        warmup: calls before timing (allocation, kernel selection); their times are kept separately.
        repeats: timed calls.
        device: where the work runs (selects CUDA events or perf_counter).
        setup: called before every call, outside the timed interval (e.g. roll back a KV cache).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    watch = Stopwatch(device)

    def once() -> float:
        if setup is not None:
            setup()
        synchronize(device)
        watch.start()
        fn()
        return watch.stop()

    with torch.inference_mode():
        warm = tuple(once() for _ in range(warmup))
        samples = tuple(once() for _ in range(repeats))
    return TimingSamples(samples=samples, warmup=warm)
