"""Device telemetry during a profile run: NVML on a GPU, a null monitor otherwise.

NVML comes from ``nvidia-ml-py`` (``import pynvml``), imported lazily so the CPU install needs neither
the package nor a driver. Energy over the run is the delta of ``nvmlDeviceGetTotalEnergyConsumption``,
read twice in this process, at ``start`` and at ``stop`` (docs/architecture.md, Measurement rules).
Power, memory used, SM clock and utilisation are sampled every ``interval_s`` by a separate process
(``profiler/_nvml_sampler.py``, run by path, standard library only): a sampler thread here would take
the GIL for its Python work on every sample, and the decode loop, which launches every kernel from
Python, would wait for it. Without a GPU, or without the package, or when NVML fails to initialise,
:func:`open_monitor` returns a :class:`NullMonitor` that records nothing: telemetry is never a
reason for a profile to fail.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from specdec_tune.db import TelemetryRow


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


SAMPLER = Path(__file__).with_name("_nvml_sampler.py")
START_TIMEOUT_S = 5.0  # the longest start waits for the sampler's first sample


class NvmlMonitor:
    """One GPU through NVML: energy read here at the boundaries, samples taken by another process.

    Args:
        pynvml: the NVML binding (``pynvml``; tests pass a fake module). The sampling process
            imports it again by its ``__name__``, with this process's ``sys.path``.
        index: the device index NVML knows it by.
        interval_s: seconds between samples.
    """

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
        self.device = str(index)
        try:  # the UUID names the same device in the sampling process whatever its index order
            self.device = _text(pynvml.nvmlDeviceGetUUID(self.handle))
        except Exception:  # an old driver or binding without UUIDs: the index will do
            pass
        self._proc: subprocess.Popen | None = None
        self._out: Path | None = None
        self._energy0: float | None = None

    def _energy_j(self) -> float | None:
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0  # millijoules
        except Exception:  # no energy counter (pre-Volta): energy unknown, not a failure
            return None

    def start(self) -> None:
        """Read the energy counter and start the sampling process; return after its first sample."""
        t0 = time.monotonic()
        self._energy0 = self._energy_j()
        fd, name = tempfile.mkstemp(prefix="specdec-nvml-", suffix=".jsonl")
        os.close(fd)
        self._out = Path(name)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        args = [sys.executable, str(SAMPLER), self.nvml.__name__, self.device, repr(self.interval_s), repr(t0), name]
        self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env=env)
        # Return once the sampler has taken its first sample, so that its start-up (an interpreter,
        # tens of milliseconds of CPU) is over before anything is measured.
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._out.stat().st_size == 0 and self._proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)

    def stop(self) -> TelemetrySummary:
        """Stop the sampling process (it takes one last sample), read the energy counter again."""
        end = self._energy_j()
        energy = end - self._energy0 if end is not None and self._energy0 is not None else None
        samples = self._collect()
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # shutting down twice or after a driver hiccup: nothing left to release
            pass
        return TelemetrySummary(samples, energy)

    def _collect(self) -> list[TelemetryRow]:
        proc, out = self._proc, self._out
        self._proc = self._out = None
        if proc is None or out is None:
            return []
        try:
            proc.stdin.close()  # end of file: the sampler takes its last sample and exits
            proc.wait(timeout=5 * self.interval_s + 5)
        except subprocess.TimeoutExpired:  # a hung driver call: the samples so far still count
            proc.kill()
            proc.wait()
        try:
            lines = out.read_text(encoding="utf-8").splitlines()
        finally:
            out.unlink(missing_ok=True)
        rows = []
        for line in lines:
            try:
                rows.append(TelemetryRow(**json.loads(line)))
            except (ValueError, TypeError):  # a line cut short by a killed sampler
                continue
        return rows


def open_monitor(device: torch.device | str, interval_s: float = 0.1) -> NvmlMonitor | NullMonitor:
    """An NVML monitor for a CUDA device, else (or if NVML is unavailable) a :class:`NullMonitor`.

    The monitor costs nothing until ``start``; ``environment_fingerprint`` opens one for the driver
    version only.
    """
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
