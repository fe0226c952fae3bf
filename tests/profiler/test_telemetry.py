"""NVML telemetry with a fake NVML library (tests/support/fake_nvml.py): the null monitor, energy as the delta
of the energy counter, and samples taken by a separate process, never by a thread of the decoding one
(docs/architecture.md, Measurement rules). Whether that keeps the decode loop's speed is a timing:
``benchmarks/telemetry_overhead.py`` measures it (docs/results.md, Telemetry overhead)."""
from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from specdec_tune.profiler.telemetry import NullMonitor, NvmlMonitor, open_monitor
from tests.support import fake_nvml


def test_null_monitor_without_gpu_or_nvml(monkeypatch):
    assert isinstance(open_monitor("cpu"), NullMonitor)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    mon = open_monitor(torch.device("cuda"))
    assert isinstance(mon, NullMonitor) and "nvidia-ml-py" in mon.reason
    mon.start()
    summary = mon.stop()
    assert summary.samples == [] and summary.energy_j is None


def test_null_monitor_when_nvml_fails_to_initialise(monkeypatch):
    monkeypatch.setenv("FAKE_NVML_FAIL_INIT", "1")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    mon = open_monitor("cuda:0")  # an explicit index: CUDA itself is never asked
    assert isinstance(mon, NullMonitor) and "Driver Not Loaded" in mon.reason


@pytest.fixture
def samples(monkeypatch):
    """Where the fake NVML announces each sample it serves (the pid that took it)."""
    listener = fake_nvml.SampleListener()
    monkeypatch.setenv("FAKE_NVML_NOTIFY", listener.path)
    yield listener
    listener.close()


def test_energy_is_the_counter_delta_and_samples_come_from_the_sampler(monkeypatch, samples):
    monkeypatch.setenv("FAKE_NVML_CALL_MS", "0")
    # The energy counter on a fake clock: read at start and at stop, in this process (millijoules).
    counter = iter([5_000_000, 5_042_000])
    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetTotalEnergyConsumption", lambda handle: next(counter))
    mon = NvmlMonitor(fake_nvml, interval_s=0.02)
    assert mon.info.name == "Fake H100" and mon.info.driver_version == "550.54.15"
    assert mon.info.memory_total_mb == 80 * 1024 and mon.device.startswith("GPU-")
    t0 = time.monotonic()
    mon.start()
    samples.wait(5)  # the sampler has taken five samples
    summary = mon.stop()
    elapsed = time.monotonic() - t0
    assert summary.energy_j == 42.0  # the counter's delta, not a sum over samples (100 W × their spacing)
    assert len(summary.samples) >= 5
    first, last = summary.samples[0], summary.samples[-1]
    assert first.power_w == 100.0 and first.memory_used_mb == 1024.0 and first.sm_clock_mhz == 1980.0
    assert first.utilization_pct == 87.0 and first.energy_j is None  # energy: the run's delta only
    assert 0.0 <= first.t < last.t <= elapsed
    assert [s.t for s in summary.samples] == sorted(s.t for s in summary.samples)
    assert summary.to_json()["mean_power_w"] == 100.0


def test_a_missing_reading_is_none_not_a_crash(monkeypatch, tmp_path):
    fake = tmp_path / "nvml_no_util.py"
    fake.write_text("from tests.support.fake_nvml import *\n"
                    "def nvmlDeviceGetUtilizationRates(handle):\n    raise NVMLError('Not Supported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import nvml_no_util

    mon = NvmlMonitor(nvml_no_util, interval_s=0.02)
    mon.start()
    summary = mon.stop()
    assert summary.samples and all(s.utilization_pct is None and s.power_w == 100.0 for s in summary.samples)


@pytest.mark.parametrize("design", ["sampling process", "PLANTED: sampler thread in the decoding process"])
def test_samples_are_taken_outside_the_decoding_process(samples, design):
    """A sampler thread in the decoding process would hold its GIL through every slow NVML call while the
    decode loop, which launches every kernel from Python, waits; so every sample is taken by another
    process (one for the whole run). The planted earlier design, a thread of this process, is caught."""
    if design == "sampling process":
        mon = NvmlMonitor(fake_nvml, interval_s=0.01)
    else:
        mon = fake_nvml.InThreadMonitor(fake_nvml, interval_s=0.01)
    mon.start()
    try:
        pids = samples.wait(3)
    finally:
        mon.stop()
    in_process = os.getpid() in pids
    if design == "sampling process":
        assert not in_process and len(set(pids)) == 1, pids
    else:
        assert in_process, f"the planted in-thread sampler went unnoticed: samples taken by {pids}"
