"""The intra-op thread count a CPU measurement runs with: chosen by the tool, stored with the run, shown.

Why the tool decides: every small operator of a decode step is split across torch's intra-op threads.
For models of the bundled size (a few milliseconds a forward) two threads on two cores help a quiet
machine a little and stall on every operator once another process takes one of the cores, enough to
make speculative decoding slower than plain decoding (docs/engine.md, Threads; the measurement:
docs/results.md, Measuring on a shared 2-core VM).

The rule (``--threads auto``, the default), on a CPU:

1. **Calibrated once per machine and model pair**: the target's one-token forward, its verify
   forward and the draft's one-token forward (the shapes of a speculative cycle) are timed with 1,
   2, 4, ... threads up to the CPUs this process may use, interleaved; the count is the fewest
   threads whose cycle is within :data:`WORTH` of the fastest. More threads only where they clearly
   pay, because they are what a busy machine takes away. Cached in the user's cache folder
   (:func:`specdec_tune.core.cache.cache_dir`), keyed by host, CPU, torch version and the models.
2. **Never more threads than idle CPUs, now**: before measuring, the CPUs other processes keep busy
   are counted from ``/proc/stat`` over :data:`WINDOW_S`; a CPU counts as idle when at least
   :data:`IDLE_SHARE` of it is. The count is lowered to the idle CPUs (at least one).

``--threads N`` is used as given, with a warning when more threads are asked than CPUs are idle (the
setting measured above). On a GPU the thread count is torch's default: the forwards do not run on it.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from specdec_tune.core.cache import cache_dir
from specdec_tune.engine import LoadedModel, forward_with_cache, make_cache
from specdec_tune.profiler.timers import Stopwatch

WORTH = 0.10  # more threads must make the cycle at least 10 % faster
IDLE_SHARE = 0.8  # a CPU at least 80 % idle over the window counts as free
WINDOW_S = 0.25
CACHE_FILE = "threads.json"
log = logging.getLogger(__name__)

__all__ = ["ThreadChoice", "apply_threads", "busy_warning", "calibrate", "choose_threads", "idle_cpus", "usable_cpus"]


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count a command runs with, and why.

    Attributes:
        threads: intra-op threads (``torch.set_num_threads``).
        source: ``--threads``, ``calibrated``, ``calibrated, lowered to the idle CPUs`` or ``device``.
        calibrated: the calibration's count (None: not calibrated).
        idle_cpus: CPUs idle when the command started (None: unknown on this system).
        cpus: CPUs this process may use.
        warning: a known-pathological setting, in one line (None: none).
    """

    threads: int
    source: str
    calibrated: int | None
    idle_cpus: float | None
    cpus: int
    warning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """One line for a report: ``threads: 1 (calibrated 2, lowered to the 1 idle CPU of 2)``."""
        idle = "" if self.idle_cpus is None else f"; {self.idle_cpus:.1f} of {self.cpus} CPUs idle at start"
        calib = f", calibrated {self.calibrated}" if self.calibrated is not None and self.source != "calibrated" else ""
        return f"threads: {self.threads} ({self.source}{calib}{idle})"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_times(cpus: set[int]) -> dict[int, tuple[int, int]] | None:
    """CPU -> (idle jiffies incl. iowait, total jiffies) from /proc/stat (None off Linux)."""
    try:
        lines = open("/proc/stat", encoding="ascii").read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = [int(v) for v in fields[:8]]
            out[int(name[3:])] = (values[3] + values[4], sum(values))
    return out


def idle_cpus(window_s: float = WINDOW_S) -> float | None:
    """CPUs of this process's affinity left idle by every process over ``window_s`` (None off Linux)."""
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = set(range(os.cpu_count() or 1))
    before = _cpu_times(cpus)
    if not before:
        return None
    time.sleep(window_s)
    after = _cpu_times(cpus) or {}
    share = 0.0
    for cpu, (idle0, total0) in before.items():
        idle1, total1 = after.get(cpu, (idle0, total0))
        share += (idle1 - idle0) / (total1 - total0) if total1 > total0 else 1.0
    return share


def _free(idle: float | None, cpus: int) -> int:
    """CPUs counted as free: each at least :data:`IDLE_SHARE` idle (all of them when unknown)."""
    if idle is None:
        return cpus
    return max(1, min(cpus, int(idle + (1.0 - IDLE_SHARE))))


def busy_warning(threads: int, idle: float | None, cpus: int) -> str | None:
    """A warning when ``threads`` exceed the CPUs other processes leave free (None: no warning)."""
    free = _free(idle, cpus)
    if idle is None or threads <= free:
        return None
    return (f"{threads} threads with {idle:.1f} of {cpus} CPUs idle: other processes use the rest, and threads "
            f"that wait for a busy CPU stall every small operator (speculative decoding measured 0.58x plain "
            f"this way); use --threads {free} or --threads auto")


def _positions(loaded: LoadedModel) -> int:
    config = loaded.model.config.get_text_config(decoder=True)
    return int(getattr(config, "max_position_embeddings", 0) or getattr(config, "n_positions", 0) or 4096)


def _cycle(target: LoadedModel, draft: LoadedModel | None, k: int) -> Callable[[], None]:
    """One cycle's shapes on a fixed context (64 tokens, fewer for a short model): draft steps, then a
    k-token target forward."""
    context = max(1, min(64, min(_positions(m) for m in (target, draft) if m is not None) - k - 1))

    def prepared(loaded: LoadedModel, tokens: int):  # noqa: ANN202 - a (model, cache, input) triple
        vocab = int(loaded.model.config.get_text_config(decoder=True).vocab_size)
        g = torch.Generator().manual_seed(0)
        cache = make_cache(loaded.model, context + tokens)
        forward_with_cache(loaded.model, torch.randint(0, vocab, (1, context), generator=g).to(loaded.device), cache)
        return loaded.model, cache, torch.randint(0, vocab, (1, tokens), generator=g).to(loaded.device)

    t_model, t_cache, t_in = prepared(target, k)
    d = prepared(draft, 1) if draft is not None else None

    def run() -> None:
        with torch.inference_mode():
            if d is not None:
                for _ in range(k - 1):
                    forward_with_cache(d[0], d[2], d[1])
                    d[1].crop(-1)
            forward_with_cache(t_model, t_in, t_cache)
            t_cache.crop(-k)

    return run


def calibrate(target: LoadedModel, draft: LoadedModel | None, counts: Sequence[int], *, k: int = 5,
              repeats: int = 7) -> dict[int, float]:
    """Median seconds of one cycle at each thread count (interleaved rounds; torch's setting restored)."""
    run = _cycle(target, draft, k)
    before = torch.get_num_threads()
    samples: dict[int, list[float]] = {n: [] for n in counts}
    watch = Stopwatch()
    try:
        for round_ in range(repeats + 1):
            for n in counts:
                torch.set_num_threads(n)
                watch.start()
                run()
                seconds = watch.stop()
                if round_:  # the first round warms every count up
                    samples[n].append(seconds)
    finally:
        torch.set_num_threads(before)
    return {n: sorted(xs)[len(xs) // 2] for n, xs in samples.items()}


def _counts(cpus: int) -> list[int]:
    counts, n = [], 1
    while n < cpus:
        counts.append(n)
        n *= 2
    return counts + [cpus]


def _key(target: LoadedModel, draft: LoadedModel | None) -> str:
    def model(m: LoadedModel | None) -> str:
        if m is None:
            return "-"
        params = sum(p.numel() for p in m.hf.parameters())
        return f"{m.source}:{params}:{str(m.dtype).replace('torch.', '')}:{m.forward}"

    cpu = platform.processor() or platform.machine()
    return "|".join([platform.node(), cpu, str(usable_cpus()), torch.__version__, model(target), model(draft)])


def _calibrated(target: LoadedModel, draft: LoadedModel | None) -> int:
    """The cached calibration of this machine and model pair, measured now if there is none."""
    path = cache_dir() / CACHE_FILE
    key = _key(target, draft)
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return int(cache[key]["threads"])
    try:
        times = calibrate(target, draft, _counts(usable_cpus()))
    except Exception as exc:  # noqa: BLE001 - a model the cycle cannot be timed on keeps torch's default
        log.warning("thread calibration failed (%s); keeping torch's %d threads", exc, torch.get_num_threads())
        return torch.get_num_threads()
    best = min(times.values())
    threads = min(n for n, s in times.items() if s <= best * (1 + WORTH))
    cache[key] = {"threads": threads, "cycle_ms": {str(n): s * 1e3 for n, s in times.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1, sort_keys=True))
    except OSError:
        pass  # an unwritable cache costs one calibration per command, nothing else
    return threads


def choose_threads(requested: int | None, target: LoadedModel, draft: LoadedModel | None = None, *,
                   profiled: int | None = None) -> ThreadChoice:
    """The thread count for measuring ``target`` (with ``draft``) now (module docstring).

    Args:
        requested: ``--threads`` (None: ``auto``).
        target: the loaded target (its device decides whether threads matter).
        draft: the loaded draft model, if any.
        profiled: the thread count of the profile this measurement is compared with: ``auto`` then
            starts from it instead of the calibration (its timings hold for that count).
    """
    cpus = usable_cpus()
    if target.device.type != "cpu":
        return ThreadChoice(requested or torch.get_num_threads(), "--threads" if requested else "device", None, None,
                            cpus)
    idle = idle_cpus()
    if requested is not None:
        return ThreadChoice(requested, "--threads", None, idle, cpus, busy_warning(requested, idle, cpus))
    base, what = (profiled, "the profile's") if profiled else (_calibrated(target, draft), "calibrated")
    threads = min(base, _free(idle, cpus))
    source = what if threads == base else f"{what}, lowered to the idle CPUs"
    return ThreadChoice(threads, source, base, idle, cpus)


def apply_threads(choice: ThreadChoice) -> ThreadChoice:
    """Set torch's intra-op threads to the choice; return it."""
    torch.set_num_threads(choice.threads)
    return choice
