"""How many tokens each cycle may draft: a budget, chosen once per decode before the loop.

The speculative loop asks ``limit(cycle)`` before drafting and tells ``observe(drafted, accepted)`` after
verifying; it never asks which schedule runs. :class:`ScheduleBudget` is the configuration's schedule
(constant, or HF's heuristic, through the one rule of ``specdec_tune.core.schedules``);
:class:`LoadBudget` caps it by a server's N for each cycle as its load changes (0: a plain step).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from specdec_tune.core.schedules import next_num_speculative
from specdec_tune.core.speculative import SpeculativeConfig


class DraftBudget(Protocol):
    def limit(self, cycle: int) -> int:
        """The most tokens cycle ``cycle`` (0, 1, ...) may draft (0: verify only the last token)."""
        ...

    def observe(self, drafted: int, accepted: int) -> None:
        """The cycle just run proposed ``drafted`` tokens and had ``accepted`` of them accepted."""
        ...


class ScheduleBudget:
    """N_cur of the ``constant`` or ``heuristic`` schedule, capped at N (HF's heuristic: +2 after a fully
    accepted draft, else -1; ``core.schedules.next_num_speculative``)."""

    def __init__(self, schedule: str, n: int) -> None:
        self.schedule = schedule
        self.n = n
        self.current = n

    def limit(self, cycle: int) -> int:
        return self.current

    def observe(self, drafted: int, accepted: int) -> None:
        self.current = next_num_speculative(self.schedule, self.current, self.n, drafted, accepted)


class LoadBudget:
    """An inner budget capped by ``n_for_cycle`` (cycle index -> a server's N at that moment; 0: a plain step)."""

    def __init__(self, inner: DraftBudget, n_for_cycle: Callable[[int], int]) -> None:
        self.inner = inner
        self.n_for_cycle = n_for_cycle

    def limit(self, cycle: int) -> int:
        return min(self.inner.limit(cycle), self.n_for_cycle(cycle))

    def observe(self, drafted: int, accepted: int) -> None:
        self.inner.observe(drafted, accepted)


def choose_budget(spec: SpeculativeConfig, n_for_cycle: Callable[[int], int] | None = None) -> DraftBudget:
    """The configuration's schedule, under a server's per-cycle N where one is given."""
    budget: DraftBudget = ScheduleBudget(spec.schedule, spec.num_speculative_tokens)
    return budget if n_for_cycle is None else LoadBudget(budget, n_for_cycle)
