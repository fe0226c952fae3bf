"""Pause bookkeeping shared by the fake vLLM workers of the tests (``VllmWorker.pause/resume/awake``)."""
from __future__ import annotations

from contextlib import contextmanager


class PausableFake:
    """A started engine runs (polls) until paused; ``running`` (each fake class defines its own set)
    holds the engines not paused, so a fake's ``generate`` can assert that no other engine runs."""

    running: set

    def mark_started(self) -> None:
        type(self).running.add(id(self))

    def pause(self):
        type(self).running.discard(id(self))

    def resume(self):
        type(self).running.add(id(self))

    @contextmanager
    def awake(self):
        self.resume()
        try:
            yield self
        finally:
            self.pause()

    def close(self):
        self.pause()
