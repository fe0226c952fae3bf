"""Progress on stderr: the profiler's progress sink drawn as rich bars, one per stage; plain lines where
stderr is not a terminal (a log file, a pipe, CI), where rich draws its bars only once the work ends."""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichBar


def progress_bar(console: Console) -> RichBar:
    """The bar every long command draws (stage name, bar, done/total, elapsed)."""
    return RichBar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=False)


STEP_SHARE = 0.10  # a line each time a stage passes another tenth of its steps
EVERY_S = 15.0  # or when this long has passed since the stage's last line


class Lines:
    """Progress as plain lines: each stage's start, then a line whenever it passes another
    :data:`STEP_SHARE` of its steps or :data:`EVERY_S` seconds after its last line (at a step), each with
    the time since the first stage began."""

    def __init__(self, console: Console, clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.clock = console, clock
        self.begun: float | None = None
        self.name, self.total, self.done, self.tenths, self.last = "", 1, 0, 0, 0.0

    def _print(self, text: str) -> None:
        seconds = int(self.clock() - (self.begun or 0.0))
        self.console.print(f"[{seconds // 60}:{seconds % 60:02d}] {text}", highlight=False, markup=False)

    def stage(self, name: str, total: int) -> None:
        now = self.clock()
        self.begun = now if self.begun is None else self.begun
        self.name, self.total, self.done, self.tenths, self.last = name, max(total, 1), 0, 0, now
        self._print(f"{name}: started, {self.total} steps")

    def advance(self, steps: int = 1) -> None:
        self.done += steps
        tenths = int(min(self.done, self.total) / self.total / STEP_SHARE + 1e-9)
        if tenths > self.tenths or self.clock() - self.last >= EVERY_S:
            self.tenths, self.last = max(tenths, self.tenths), self.clock()
            self._print(f"{self.name}: {min(self.done, self.total)}/{self.total} ({self.done / self.total:.0%})")


class Bar:
    """Adapts the profiler's progress sink to a rich progress bar on stderr (and to :class:`Lines` where
    stderr is not a terminal: rich would show nothing until the end)."""

    def __init__(self, bar: RichBar) -> None:
        self.bar = bar
        self.task = None
        self.lines: Lines | None = None

    def stage(self, name: str, total: int) -> None:
        if self.task is None:  # inputs are valid and the timing starts now
            _warn_if_busy(self.bar.console)
            self.lines = None if self.bar.console.is_terminal else Lines(self.bar.console)
        else:
            self.bar.update(self.task, completed=self.bar.tasks[self.task].total)
        self.task = self.bar.add_task(name, total=max(total, 1))
        if self.lines is not None:
            self.lines.stage(name, total)

    def advance(self, steps: int = 1) -> None:
        if self.task is not None:
            self.bar.advance(self.task, steps)
            if self.lines is not None:
                self.lines.advance(steps)


class LazyBar(Bar):
    """A progress bar that appears with the first stage, so an early error stays one line."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: RichBar | None = None
        super().__init__(None)  # type: ignore[arg-type]

    def stage(self, name: str, total: int) -> None:
        if self.live is None:
            self.live = progress_bar(self.console)
            self.bar = self.live.__enter__()
        super().stage(name, total)

    def __enter__(self) -> LazyBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)


def _warn_if_busy(console: Console) -> None:
    """Timings on a machine another process keeps busy are noisy; say so up front."""
    try:
        load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:  # not available on this platform
        return
    if load > 0.75 * cpus:
        console.print(f"warning: load average {load:.1f} on {cpus} CPUs: another process is busy, so timings "
                      "(and the model's error) will be noisy", highlight=False)
