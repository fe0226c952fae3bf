"""Measured batched decode runs: B prompts through the batched engine together, timed as one call.

The engine never times itself: this wraps a whole batched decode (``engine.batch_decode``: prefill included,
until the batch's last sequence finishes) in one stopwatch, and notes when each cycle's tokens reached the
host for every request of the batch (:class:`BatchClock`), so TTFT and TPOT are per request as a server
reports them. Plain decoding at B > 1 is the batched target-only loop (the baseline a schedule's band is
measured against); B = 1 stays on the one-sequence engine (``profiler.runs``).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec_tune.core.errors import InputError
from specdec_tune.core.latency import RequestLatency
from specdec_tune.engine import BatchCycle, DecodeConfig, GenerationResult, LoadedModel, batch_autoregressive
from specdec_tune.engine import batch_speculative, build_batch_drafter
from specdec_tune.profiler.runs import DraftSpec
from specdec_tune.profiler.timers import Stopwatch, synchronize


class BatchClock:
    """The batched engine's ``on_cycle`` hook: when each request's tokens of each cycle reached the host.

    Every cycle ends in the engine's host read of the verdicts (or picked tokens), so ``perf_counter`` here
    is when the batch's tokens are on the host, on a CPU and a GPU alike; each request of the cycle got its
    own emitted count. The batch's cycles are kept too (its width, draft forwards, live rows).
    """

    def __init__(self, rows: int) -> None:
        self.t0 = time.perf_counter()
        self.times: list[list[float]] = [[] for _ in range(rows)]
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.cycles: list[BatchCycle] = []

    def __call__(self, cycle: BatchCycle) -> None:
        now = time.perf_counter() - self.t0
        for row, stats in zip(cycle.rows, cycle.stats):
            self.times[row].append(now)
            self.tokens[row].append(int(stats.emitted))
        self.cycles.append(cycle)

    def requests(self) -> list[RequestLatency]:
        return [RequestLatency(tuple(t), tuple(n)) for t, n in zip(self.times, self.tokens)]


@dataclass
class MeasuredBatch:
    """One batch decoded and timed (seconds measured; everything else counted)."""

    results: list[GenerationResult]
    seconds: float
    latency: list[RequestLatency] = field(default_factory=list)
    cycles: list[BatchCycle] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.results)


def decode_batch(target: LoadedModel, draft: DraftSpec, prompts: Sequence[torch.Tensor], config: DecodeConfig,
                 seed: int | None = None, on_cycle=None) -> list[GenerationResult]:
    """Decode ``prompts`` together (untimed) with a fresh batch drafter and generator.

    Raises:
        InputError: a token tree or staged drafting (batch size 1 only), or a model the batched engine cannot
            run (its forward cannot take per-row cache lengths).
    """
    if draft.tree or draft.inner is not None:
        raise InputError("token trees and staged drafting decode one sequence at a time: measure them at "
                         "--batch-sizes 1")
    generator = None
    if seed is not None:
        generator = torch.Generator(device=target.device)
        generator.manual_seed(seed)
    try:
        with torch.inference_mode():
            if draft.kind == "none":
                return batch_autoregressive(target.model, prompts, config, generator, on_cycle=on_cycle)
            drafter = build_batch_drafter(draft.model.model if draft.model is not None else None, len(prompts),
                                          config.spec, max_len=max(p.shape[0] for p in prompts) + config.room,
                                          temperature=config.temperature, generator=generator, device=target.device)
            return batch_speculative(target.model, drafter, prompts, config, generator, on_cycle=on_cycle)
    except ValueError as exc:  # the engine's refusals (a model without the lean forward) are the user's input
        raise InputError(str(exc)) from None


def measure_batch(target: LoadedModel, draft: DraftSpec, prompts: Sequence[torch.Tensor], config: DecodeConfig, *,
                  seed: int | None = None) -> MeasuredBatch:
    """Decode one batch and time the whole call (wall clock, one synchronisation at the end)."""
    watch = Stopwatch(target.device)
    clock = BatchClock(len(prompts))
    synchronize(target.device)
    watch.start()
    clock.t0 = time.perf_counter()
    results = decode_batch(target, draft, prompts, config, seed, on_cycle=clock)
    seconds = watch.stop()
    return MeasuredBatch(results, seconds, clock.requests(), clock.cycles)


def warm_up_batch(target: LoadedModel, draft: DraftSpec, prompts: Sequence[torch.Tensor], config: DecodeConfig) -> None:
    """One short untimed batched decode (allocation, kernel selection, CUDA-graph capture at this batch size)."""
    short = DecodeConfig(min(8, config.max_new_tokens), config.spec, temperature=config.temperature)
    decode_batch(target, draft, prompts, short, seed=0)
