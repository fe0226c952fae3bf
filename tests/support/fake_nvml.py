"""A fake NVML binding with the names and units of ``pynvml`` (nvidia-ml-py), for CPU tests.

Importable by name (``tests.support.fake_nvml``), so the telemetry's sampling process imports it too. Its
behaviour comes from environment variables, which that process inherits:

- ``FAKE_NVML_CALL_MS``: every device query takes this long *holding the GIL* (libc ``usleep``
  through ``ctypes.PyDLL``, which does not release it): the worst case of a binding whose Python
  wrapper or driver lock keeps the interpreter during a slow query. It burns no CPU, so a sampler
  in another process costs a loaded machine nothing, while a sampler thread stalls its own
  process's other threads.
- ``FAKE_NVML_FAIL_INIT``: ``nvmlInit`` raises, as it does without a driver.
- ``FAKE_NVML_NOTIFY``: the path of a Unix datagram socket (:class:`SampleListener`); every power
  reading, the first reading of each sample, sends it the id of the process that took it, so a test
  waits for samples by receiving them, not by sleeping.

Power is a constant 100 W and the energy counter is 100 W × ``time.monotonic()`` (millijoules), so
the energy of an interval is known exactly in every process.

Also here: :class:`InThreadMonitor`, the earlier design (a sampler thread in the decoding process),
kept as a planted bug that the speed test must catch, and :func:`paired_loop_seconds`, the
interleaved measurement that test and ``benchmarks/telemetry_overhead.py`` share.
"""
from __future__ import annotations

import ctypes
import os
import socket
import tempfile
import threading
import time
import types
from collections.abc import Callable
from typing import Any

NVML_CLOCK_SM = 1
POWER_MW = 100_000
_LIBC = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL


class NVMLError(Exception):
    """What pynvml raises."""


def _slow() -> None:
    ms = float(os.environ.get("FAKE_NVML_CALL_MS", "0") or 0)
    if ms > 0:
        _LIBC.usleep(int(ms * 1000))


def _notify() -> None:
    path = os.environ.get("FAKE_NVML_NOTIFY")
    if not path:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(str(os.getpid()).encode(), path)
        except OSError:  # the listener is gone: a sample nobody waits for
            pass


class SampleListener:
    """Receives one datagram per fake power reading (``FAKE_NVML_NOTIFY``): the pid that took it."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="nvml-")  # short: a socket path has at most 107 bytes
        self.path = os.path.join(self._dir, "samples.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)

    def wait(self, n: int, timeout_s: float = 30.0) -> list[int]:
        """The pids of the next ``n`` samples, blocking until they are taken (``TimeoutError`` after
        ``timeout_s`` without one)."""
        self._sock.settimeout(timeout_s)
        return [int(self._sock.recv(64)) for _ in range(n)]

    def close(self) -> None:
        self._sock.close()
        os.unlink(self.path)
        os.rmdir(self._dir)


def nvmlInit() -> None:
    if os.environ.get("FAKE_NVML_FAIL_INIT"):
        raise NVMLError("Driver Not Loaded")


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return "550.54.15"


def nvmlDeviceGetHandleByIndex(index: int) -> str:
    return f"handle-{index}"


def nvmlDeviceGetHandleByUUID(uuid: str) -> str:
    return f"handle-{uuid}"


def nvmlDeviceGetUUID(handle: str) -> str:
    return "GPU-00000000-fake-0000-0000-000000000000"


def nvmlDeviceGetName(handle: str) -> bytes:
    return b"Fake H100"


def nvmlDeviceGetMemoryInfo(handle: str) -> Any:
    _slow()
    return types.SimpleNamespace(total=80 * 2**30, used=2**30, free=79 * 2**30)


def nvmlDeviceGetPowerUsage(handle: str) -> int:
    _notify()
    _slow()
    return POWER_MW


def nvmlDeviceGetTotalEnergyConsumption(handle: str) -> int:
    _slow()
    return int(POWER_MW * time.monotonic())


def nvmlDeviceGetClockInfo(handle: str, kind: int) -> int:
    _slow()
    return 1980


def nvmlDeviceGetUtilizationRates(handle: str) -> Any:
    _slow()
    return types.SimpleNamespace(gpu=87, memory=40)


class InThreadMonitor:
    """PLANTED BUG: the earlier design, a daemon thread of the decoding process polling NVML."""

    def __init__(self, nvml: Any, interval_s: float) -> None:
        self.nvml, self.interval_s = nvml, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0

    def _loop(self) -> None:
        h = self.nvml.nvmlDeviceGetHandleByIndex(0)
        while not self._stop.wait(self.interval_s):
            self.nvml.nvmlDeviceGetPowerUsage(h)
            self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)
            self.nvml.nvmlDeviceGetMemoryInfo(h)
            self.nvml.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)
            self.nvml.nvmlDeviceGetUtilizationRates(h)
            self.samples += 1

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def decode_like_loop(steps: int) -> float:
    """A decode loop's shape on the calling thread: per step some Python work (which needs the GIL,
    as launching kernels and bookkeeping do) and a short wait that releases it (as a kernel, a
    synchronisation or a C++ operator does). Returns its wall seconds."""
    start = time.perf_counter()
    acc = 0
    for step in range(steps):
        for i in range(300):
            acc = (acc * 31 + i + step) % 1_000_003
        time.sleep(0.0002)
    return time.perf_counter() - start


def paired_loop_seconds(make_monitor: Callable[[], Any], pairs: int, steps: int) -> list[tuple[float, float]]:
    """(seconds without, seconds with a running monitor) of the same :func:`decode_like_loop`, interleaved pair by pair
    (the order inside a pair alternates, so drift of a busy machine hits both sides alike)."""
    out = []
    for i in range(pairs):
        row = {}
        for with_monitor in ((False, True) if i % 2 == 0 else (True, False)):
            monitor = make_monitor() if with_monitor else None
            if monitor is not None:
                monitor.start()
                time.sleep(0.05)  # the sampler is running (and the process sampler has started)
            row[with_monitor] = decode_like_loop(steps)
            if monitor is not None:
                monitor.stop()
        out.append((row[False], row[True]))
    return out
