"""Progress on stderr: the profiler's progress sink drawn as rich bars, one per stage."""
from __future__ import annotations

import os

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichBar


def progress_bar(console: Console) -> RichBar:
    """The bar every long command draws (stage name, bar, done/total, elapsed)."""
    return RichBar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=False)


class Bar:
    """Adapts the profiler's progress sink to a rich progress bar on stderr."""

    def __init__(self, bar: RichBar) -> None:
        self.bar = bar
        self.task = None

    def stage(self, name: str, total: int) -> None:
        if self.task is None:  # inputs are valid and the timing starts now
            _warn_if_busy(self.bar.console)
        else:
            self.bar.update(self.task, completed=self.bar.tasks[self.task].total)
        self.task = self.bar.add_task(name, total=max(total, 1))

    def advance(self, steps: int = 1) -> None:
        if self.task is not None:
            self.bar.advance(self.task, steps)


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
