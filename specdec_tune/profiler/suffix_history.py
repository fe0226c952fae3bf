"""Suffix decoding's serving histories in a measurement: which earlier responses a request's global tree holds.

Suffix decoding drafts from the responses of earlier requests (``specdec_tune.core.suffix``), so what one
request accepts depends on what ran before it. The profiler fixes that order explicitly, by one of three
policies (docs/suffix.md, Order matters):

- ``order``: the requests of a pass accumulate in the order they run, from an empty history: a server that
  started with the workload's first request. The profile runs its prompts this way (workload order).
- ``warm``: every request sees the warm sequences (the profiled prompts' responses, as a server that served
  the tuning traffic) and nothing else: its own response is forgotten after it, so a held-out measurement
  does not depend on the held-out prompts' order.
- ``cold``: every request sees no earlier response (the global tree is emptied after each).

A history holds one cache per decode configuration (a configuration's pass never sees another's outputs),
and :meth:`SuffixHistory.new_pass` starts every cache again (each repeat of a measurement is one pass;
without that a second repeat would draft the first repeat's identical outputs).
"""
from __future__ import annotations

from collections.abc import Sequence

from specdec_tune.core.suffix_cache import SuffixCache
from specdec_tune.engine import DecodeConfig

POLICIES = ("order", "warm", "cold")


class SuffixHistory:
    """The caches of one measurement under one policy (module docstring).

    Args:
        policy: ``order``, ``warm`` or ``cold``.
        warm: ``(prompt ids, response ids)`` of the earlier traffic a ``warm`` history starts from.
    """

    def __init__(self, policy: str = "order", warm: Sequence[tuple[Sequence[int], Sequence[int]]] = ()) -> None:
        if policy not in POLICIES:
            raise ValueError(f"suffix history policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if policy == "warm" and not warm:
            raise ValueError("a warm suffix history needs the earlier traffic's sequences")
        self.policy = policy
        self.warm = tuple((list(p), list(r)) for p, r in warm)
        self._caches: dict[DecodeConfig, SuffixCache] = {}

    def cache(self, config: DecodeConfig) -> SuffixCache:
        """The serving history of ``config``'s pass (created, and warmed, on first use)."""
        cache = self._caches.get(config)
        if cache is None:
            spec = config.spec
            cache = self._caches[config] = SuffixCache(spec.suffix_max_tree_depth, spec.suffix_max_cached_requests)
            if self.policy == "warm":
                for prompt, response in self.warm:
                    cache.add_finished(prompt, response)
        return cache

    def new_pass(self) -> None:
        """Every configuration starts its history again (the next use re-warms a ``warm`` one)."""
        self._caches.clear()

    def after_request(self, config: DecodeConfig) -> None:
        """A request of ``config`` ended: ``warm`` forgets its response, ``cold`` empties the history."""
        cache = self._caches.get(config)
        if cache is None or self.policy == "order":
            return
        if self.policy == "cold":
            cache.reset()
            return
        last = cache.last_request()
        if last is not None:
            cache.forget(last)
