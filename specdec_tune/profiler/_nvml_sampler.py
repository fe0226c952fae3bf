"""The NVML sampling process: run by :mod:`profiler.telemetry`, never imported by it.

Run as ``python _nvml_sampler.py MODULE DEVICE INTERVAL_S T0 OUT``: it imports the NVML binding
``MODULE`` (``pynvml``, from ``nvidia-ml-py``), opens device ``DEVICE`` (an NVML UUID ``GPU-...`` or an
index), and appends one JSON line per sample to the file ``OUT`` every ``INTERVAL_S`` seconds, with
``t`` in seconds since ``T0`` (``time.monotonic()`` of the parent: CLOCK_MONOTONIC, one clock for
every process on Linux). It stops when its standard input reaches end of file (the parent closed
it, or died), after one last sample.

Why a process of its own (docs/architecture.md, Measurement rules): a sampler thread inside the
decoding process takes the GIL for every Python-level step of every NVML call, and the decode loop,
which launches its kernels from Python, waits for it. Here the sampler shares no interpreter with
the loop. It imports the standard library and the binding only, so it starts in tens of
milliseconds and costs the loop's CPU next to nothing while it sleeps between samples.
"""
from __future__ import annotations

import importlib
import json
import select
import sys
import time
from typing import Any

FIELDS = ("power_w", "memory_used_mb", "sm_clock_mhz", "utilization_pct")


def read(nvml: Any, handle: Any, what: str) -> float | None:
    """One reading in the units the telemetry table stores; ``None`` when the device lacks it."""
    try:
        if what == "power_w":
            return nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
        if what == "memory_used_mb":
            return nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        if what == "sm_clock_mhz":
            return float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        if what == "utilization_pct":
            return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:  # NVMLError_NotSupported and friends: a missing reading, not a failure
        return None
    raise ValueError(f"unknown telemetry field {what!r}")


def open_handle(nvml: Any, device: str) -> Any:
    """The NVML handle of ``device``: a UUID (what the parent resolved) or an index."""
    if device.startswith("GPU-") or device.startswith("MIG-"):
        return nvml.nvmlDeviceGetHandleByUUID(device)
    return nvml.nvmlDeviceGetHandleByIndex(int(device))


def main(argv: list[str]) -> int:
    """Sample until standard input closes; return the exit code."""
    module, device, interval_s, t0, out = argv[0], argv[1], float(argv[2]), float(argv[3]), argv[4]
    nvml = importlib.import_module(module)
    nvml.nvmlInit()
    try:
        handle = open_handle(nvml, device)
        with open(out, "a", encoding="utf-8") as sink:
            while True:
                row = {"t": time.monotonic() - t0, **{f: read(nvml, handle, f) for f in FIELDS}}
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                # Wait one interval, or less when the parent closes our stdin (EOF is "readable").
                ready, _, _ = select.select([sys.stdin], [], [], interval_s)
                if ready:
                    row = {"t": time.monotonic() - t0, **{f: read(nvml, handle, f) for f in FIELDS}}
                    sink.write(json.dumps(row) + "\n")
                    return 0
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # already shut down or a driver hiccup: nothing left to release
            pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
