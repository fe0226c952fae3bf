"""Device telemetry during a profile run: NVML on a GPU, a null monitor otherwise.

NVML comes from ``nvidia-ml-py`` (``import pynvml``), imported lazily so the CPU install needs neither
the package nor a driver. A background thread samples power, energy, memory used, SM clock and
utilisation every ``interval_s``; energy over the run is the delta of
``nvmlDeviceGetTotalEnergyConsumption`` (docs/architecture.md, Measurement rules). Without a GPU, or
without the package, or when NVML fails to initialise, :func:`open_monitor` returns a
:class:`NullMonitor` that records nothing: telemetry is never a reason for a profile to fail.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from specdec_tune.db.records import TelemetryRow


@dataclass(frozen=True)
class DeviceInfo:
    """What the monitor knows about the device (``None`` fields are unknown)."""

    name: str | None = None
    driver_version: str | None = None
    memory_total_mb: float | None = None


@dataclass
class TelemetrySummary:
    """Samples of one run plus the energy used over it (joules, from the energy counter)."""

    samples: list[TelemetryRow] = field(default_factory=list)
    energy_j: float | None = None

    def to_json(self) -> dict[str, Any]:
        powers = [s.power_w for s in self.samples if s.power_w is not None]
        return {
            "samples": len(self.samples),
            "energy_j": self.energy_j,
            "mean_power_w": sum(powers) / len(powers) if powers else None,
        }


class Monitor(Protocol):
    """Something that samples device telemetry between ``start`` and ``stop``."""

    info: DeviceInfo

    def start(self) -> None: ...

    def stop(self) -> TelemetrySummary: ...


class NullMonitor:
    """No GPU or no NVML: records nothing."""

    def __init__(self, reason: str = "no GPU") -> None:
        self.reason = reason
        self.info = DeviceInfo()

    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> TelemetrySummary:
        return TelemetrySummary()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlMonitor:
    """Samples one GPU through NVML in a daemon thread."""

    def __init__(self, pynvml: Any, index: int = 0, interval_s: float = 0.1) -> None:
        self.nvml = pynvml
        self.interval_s = interval_s
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(self.handle)
        self.info = DeviceInfo(
            name=_text(pynvml.nvmlDeviceGetName(self.handle)),
            driver_version=_text(pynvml.nvmlSystemGetDriverVersion()),
            memory_total_mb=memory.total / 2**20,
        )
        self._samples: list[TelemetryRow] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._energy0: float | None = None

    def _read(self, what: str) -> float | None:
        """One NVML reading; a query the device does not support gives ``None``."""
        n, h = self.nvml, self.handle
        try:
            if what == "power_w":
                return n.nvmlDeviceGetPowerUsage(h) / 1000.0  # milliwatts
            if what == "energy_j":
                return n.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0  # millijoules
            if what == "memory_used_mb":
                return n.nvmlDeviceGetMemoryInfo(h).used / 2**20
            if what == "sm_clock_mhz":
                return float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
            if what == "utilization_pct":
                return float(n.nvmlDeviceGetUtilizationRates(h).gpu)
        except Exception:  # NVMLError_NotSupported and friends: a missing reading, not a failure
            return None
        raise ValueError(f"unknown telemetry field {what!r}")

    def _sample(self) -> TelemetryRow:
        fields = ("power_w", "energy_j", "memory_used_mb", "sm_clock_mhz", "utilization_pct")
        return TelemetryRow(t=time.perf_counter() - self._t0, **{f: self._read(f) for f in fields})

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._samples.append(self._sample())

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._energy0 = self._read("energy_j")
        self._samples = [self._sample()]
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="specdec-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> TelemetrySummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 1)
        self._samples.append(self._sample())
        end = self._read("energy_j")
        energy = end - self._energy0 if end is not None and self._energy0 is not None else None
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # shutting down twice or after a driver hiccup: nothing left to release
            pass
        return TelemetrySummary(list(self._samples), energy)


def open_monitor(device: torch.device | str, interval_s: float = 0.1) -> NvmlMonitor | NullMonitor:
    """An NVML monitor for a CUDA device, else (or if NVML is unavailable) a :class:`NullMonitor`."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return NullMonitor(f"device is {dev.type}")
    try:
        import pynvml
    except ImportError:
        return NullMonitor("nvidia-ml-py is not installed (pip install 'specdec-tune[gpu]')")
    try:
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return NvmlMonitor(pynvml, index, interval_s)
    except Exception as exc:  # no driver, no permission: profile without telemetry
        return NullMonitor(f"NVML unavailable: {exc}")
