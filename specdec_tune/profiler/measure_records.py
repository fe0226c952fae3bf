"""What a measurement is: the configuration asked for (:class:`MeasureSpec`) and what was measured
(:class:`Measurement`), the record :mod:`profiler.measure` returns and ``tuner.search``'s
``measure_predicted`` puts beside its prediction.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from specdec_tune.core.costs import usd_per_million_tokens
from specdec_tune.core.speculative import NONE, SpeculativeConfig
from specdec_tune.core.latency import LatencySamples, latency_summary
from specdec_tune.profiler.energy import EnergySamples
from specdec_tune.core.stats import RateSamples

__all__ = ["PLAIN", "MeasureSpec", "Measurement"]

PLAIN = NONE  # the drafter of plain decoding


@dataclass(frozen=True)
class MeasureSpec:
    """One configuration to measure (batch size 1: the engine decodes one sequence).

    Attributes:
        spec: what to speculate (``spec.drafter``: one of the run's drafts, ``None`` for its first;
            plain decoding is :data:`~specdec_tune.core.speculative.PLAIN`).
        rank_accept: per-rank acceptance that shapes a ``sequoia`` tree (the tuner's, from the profile).
    """

    spec: SpeculativeConfig
    rank_accept: tuple[float, ...] = ()

    @property
    def is_plain(self) -> bool:
        return self.spec.is_plain


@dataclass
class Measurement:
    """A measured configuration (no prediction: see ``tuner.search``'s ``measure_predicted``)."""

    run_id: int
    draft: str
    config: MeasureSpec
    temperature: float
    tokens_per_s: float
    seconds: float
    new_tokens: int
    mean_tokens_per_cycle: float | None
    acceptance_per_position: list[float]
    prompts: int
    repeats: int
    per_repeat_tokens_per_s: list[float] = field(default_factory=list)
    measured_id: int | None = None
    samples: RateSamples | None = None  # per prompt, per repeat tokens and seconds
    ci95: tuple[float, float] | None = None  # 95% bootstrap CI of tokens_per_s (prompts, repeats)
    split: str | None = None  # the prompt split measured (None: the run's profiled prompts)
    prompt_ids: list[str] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # per prompt, its length in tokens
    profiled: list[bool] = field(default_factory=list)  # per prompt: did the profile run it?
    threads: dict = field(default_factory=dict)  # the thread choice (profiler.threads.ThreadChoice.to_dict())
    probe_seconds: list[float] = field(default_factory=list)  # the machine probe, read between the turns of the passes
    synthetic_acceptance: list[float] | None = None  # the rates the verify step accepted with (None: the target)
    latency: LatencySamples | None = None  # when every request's tokens arrived (TTFT, TPOT, gaps)
    energy: EnergySamples | None = None  # NVML joules per pass (None: no GPU energy counter)
    gpu_price: float | None = None  # --gpu-price, dollars per hour
    peak_memory: Any = None  # profiler.memory.PeakMemory (measure --memory), in a fresh process
    timed_regions: dict | None = None  # the timed decodes' check (profiler.clean.TimedRegions.report) and warm-up
    cuda_graphs: dict | None = None  # the target's and every draft's CUDA-graph state, read after the run
    decode_tokens_per_s: float | None = None  # after each request's first arrival (prefill left out)

    @property
    def latency_summary(self) -> dict | None:
        """p50/p90/p99 TTFT, TPOT and inter-token gaps with 95% CIs (``specdec_tune.core.latency``)."""
        return None if self.latency is None else latency_summary(self.latency)

    @property
    def usd_per_million_tokens(self) -> float | None:
        return None if self.gpu_price is None else usd_per_million_tokens(self.gpu_price, self.tokens_per_s)

    @property
    def machine_probe_s(self) -> float | None:
        """The machine probe's median seconds while this configuration was measured (None: not probed)."""
        return statistics.median(self.probe_seconds) if self.probe_seconds else None

    @property
    def in_sample(self) -> bool:
        """Every measured prompt was one the profile ran (its traces and timings are in the run)."""
        return bool(self.profiled) and all(self.profiled)
