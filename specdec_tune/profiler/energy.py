"""Energy a measured configuration used: deltas of NVML's total-energy counter, per measured pass.

Energy is the delta of ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since the driver loaded;
docs/architecture.md, Measurement rules), read before and after each pass of one configuration over
the prompts, so interleaved configurations are charged only for their own passes. Reading the
counter is one NVML call: no sampler thread or process is involved (those belong to
:mod:`profiler.telemetry`, which samples power for the profile's charts).

``nvidia-ml-py`` (``import pynvml``) is imported lazily. On a CPU, without the package, or where NVML
or the counter is unavailable (pre-Volta GPUs), :func:`open_energy_meter` returns ``None`` and every
energy column stays empty: an energy that was not measured is absent, never invented.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from specdec_tune.core.costs import usd_per_million_tokens
from specdec_tune.core.latency import LatencySamples, latency_summary


class EnergyMeter:
    """Reads one GPU's total-energy counter (joules)."""

    def __init__(self, pynvml: Any, index: int) -> None:
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.read()  # a device without the counter fails here, so the caller gets None instead

    def read(self) -> float:
        """Joules the device used since the driver loaded."""
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0  # millijoules

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # shutting down twice, or after a driver hiccup: nothing left to release
            pass


def open_energy_meter(device: torch.device | str) -> EnergyMeter | None:
    """An energy meter for a CUDA device, else ``None`` (CPU, no ``nvidia-ml-py``, no NVML, no counter)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    try:
        import pynvml
    except ImportError:
        return None
    try:
        return EnergyMeter(pynvml, dev.index if dev.index is not None else torch.cuda.current_device())
    except Exception:  # no driver, no permission, NVMLError_NotSupported: measure without energy
        return None


@dataclass(frozen=True)
class EnergySamples:
    """Joules and new tokens of each metered pass of one configuration (and its wall seconds, where the
    pass was metered apart from the timed ones: ``profiler.measure_passes``)."""

    joules: tuple[float, ...]
    tokens: tuple[float, ...]
    seconds: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"joules": list(self.joules), "tokens": list(self.tokens)}
        if self.seconds:
            out.update(seconds=list(self.seconds), watts=self.total_j / sum(self.seconds) if sum(self.seconds) else None)
        return out

    @property
    def total_j(self) -> float:
        return sum(self.joules)

    @property
    def joules_per_token(self) -> float | None:
        tokens = sum(self.tokens)
        return self.total_j / tokens if tokens > 0 else None

    def ci95(self) -> tuple[float, float] | None:
        """t interval of the per-pass joules per token (passes are few; None with fewer than two)."""
        from scipy import stats

        per = [j / t for j, t in zip(self.joules, self.tokens) if t > 0]
        if len(per) < 2:
            return None
        mean, sem = statistics.fmean(per), statistics.stdev(per) / math.sqrt(len(per))
        half = float(stats.t.ppf(0.975, len(per) - 1)) * sem
        return (mean - half, mean + half)



def operator_columns(latency: LatencySamples | None, energy: EnergySamples | None, gpu_price: float | None,
                     tokens_per_s: float) -> dict[str, Any]:
    """A measured run's latency, energy and cost columns (``db`` revision 0005), our engine and vLLM alike:
    TTFT/TPOT percentiles and the raw arrivals; joules (only where NVML measured them); $ per million
    tokens at ``gpu_price`` (its CI is the throughput's, inverted: ``costs.usd_ci``)."""
    out: dict[str, Any] = {}
    if latency is not None:
        summary = latency_summary(latency)
        pick = lambda metric, p: summary[metric][p]["value"]  # noqa: E731
        out.update(ttft_p50_s=pick("ttft_s", "p50"), tpot_p50_s=pick("tpot_s", "p50"),
                   tpot_p90_s=pick("tpot_s", "p90"), tpot_p99_s=pick("tpot_s", "p99"),
                   latency={"summary": summary, "requests": latency.to_json(), "label": "measured"})
    if energy is not None:
        ci = energy.ci95()
        out.update(energy_j=energy.total_j, joules_per_token=energy.joules_per_token,
                   energy={**energy.to_json(), "joules_per_token_ci": None if ci is None else list(ci),
                           "source": "NVML total-energy counter, delta per pass"})
    if gpu_price is not None:
        out.update(gpu_price_usd_per_hour=gpu_price, usd_per_million_tokens=usd_per_million_tokens(gpu_price, tokens_per_s))
    return out
