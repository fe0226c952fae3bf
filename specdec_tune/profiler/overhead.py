"""Engine overhead: the part of a decode loop's wall time that is not a model forward.

A forward pre-hook and post-hook on the target and on the draft model record ``perf_counter``; the
speculative loop's ``on_cycle`` callback marks the end of each cycle. On a GPU every mark is a CUDA
event instead, recorded on the stream without waiting for it, and read after the decode: a forward's
time is then the GPU's time from reaching its first kernel to finishing its last, and the loop keeps
its natural overlap (the host enqueues the next draft step while the GPU runs the last one). Marks
that synchronised (this module's first GPU design) serialised host and GPU at every forward, so the
profile's hooked cycles cost more than unhooked ones and the model under-predicted every speculative
configuration on a GPU (plain decoding, which synchronises once per token anyway, was unaffected). The
overhead of cycle c is its wall time (from
the end of cycle c - 1 to the end of cycle c) minus the time of the forwards that ran inside it:
drafting bookkeeping, verification, cache rollback, Python. The first cycle of a sequence also holds
the prompt's prefill forwards and the loop's set-up, so it is reported apart (``first_cycle_s``).

The plain (autoregressive) loop's overhead per token is measured the same way: wall time minus
target forwards, over the tokens after the first.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from specdec_tune.engine import CycleStats
from specdec_tune.profiler.timers import synchronize
from specdec_tune.core.stats import robust_mean, trimmed_mean


@dataclass(frozen=True)
class ForwardRecord:
    """One hooked forward: which model, how many new tokens, its context, start and end times."""

    role: str  # "target" | "draft"
    tokens: int  # new tokens in the forward (k)
    context_len: int  # tokens in the KV cache before the forward
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class CycleOverhead:
    """Time split of one speculative cycle (seconds).

    Attributes:
        drafted: tokens proposed (L).
        accepted: tokens accepted.
        draft_forwards: draft forwards run (F).
        wall_s: cycle wall time.
        forward_s: time inside model forwards.
        context_len: tokens in the target's context when the cycle started.
    """

    drafted: int
    accepted: int
    draft_forwards: int
    wall_s: float
    forward_s: float
    context_len: int

    @property
    def overhead_s(self) -> float:
        return self.wall_s - self.forward_s

    @property
    def share(self) -> float:
        """Fraction of the cycle's wall time spent outside model forwards."""
        return self.overhead_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class SequenceTimeline:
    """Everything hooked during one decode call."""

    start: float = 0.0
    end: float = 0.0
    forwards: list[ForwardRecord] = field(default_factory=list)
    cycle_ends: list[float] = field(default_factory=list)
    cycles: list[CycleStats] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    def forward_seconds(self, t0: float, t1: float, role: str | None = None) -> float:
        """Time of the forwards that started in ``[t0, t1)`` (of one role, or all)."""
        return sum(f.seconds for f in self.forwards if t0 <= f.start < t1 and (role is None or f.role == role))

    def cycle_overheads(self) -> list[CycleOverhead]:
        """Per-cycle split for every cycle but the first (which holds prefill and set-up)."""
        out = []
        context = self.forwards[0].context_len if self.forwards else 0
        target = [f for f in self.forwards if f.role == "target"]
        for c in range(1, len(self.cycle_ends)):
            t0, t1 = self.cycle_ends[c - 1], self.cycle_ends[c]
            stats = self.cycles[c]
            verify = [f for f in target if t0 <= f.start < t1]
            context = verify[0].context_len if verify else context
            out.append(CycleOverhead(
                drafted=stats.drafted, accepted=stats.accepted, draft_forwards=stats.draft_forwards,
                wall_s=t1 - t0, forward_s=self.forward_seconds(t0, t1), context_len=context,
            ))
        return out

    def first_cycle_s(self) -> float:
        """Wall time from the call's start to the end of the first cycle, minus its forwards."""
        if not self.cycle_ends:
            return 0.0
        return (self.cycle_ends[0] - self.start) - self.forward_seconds(self.start, self.cycle_ends[0])

    def tail_s(self) -> float:
        """Wall time after the last cycle (returning the result), minus forwards (none expected)."""
        if not self.cycle_ends:
            return 0.0
        return (self.end - self.cycle_ends[-1]) - self.forward_seconds(self.cycle_ends[-1], self.end)

    def autoregressive_overhead(self) -> tuple[float, int]:
        """(overhead seconds, steps) of a plain decode after its prefill forward."""
        target = [f for f in self.forwards if f.role == "target"]
        if len(target) < 1:
            return 0.0, 0
        t0 = target[0].end  # after prefill: pick, feed, repeat
        wall = self.end - t0
        forwards = sum(f.seconds for f in target[1:])
        return wall - forwards, len(target)  # len(target) tokens were picked after t0 (one per forward)


def _cache_len(kwargs: dict) -> int:
    """Tokens in the forward's KV cache (after the forward: it has appended its own tokens)."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    return int(cache.get_seq_length()) if cache is not None else 0


EVENTS_AHEAD = 1024  # CUDA events a recorder makes before its first decode


class ForwardRecorder:
    """Hooks that time every forward of the registered models into the current timeline.

    Use as ``with recorder.attach(target=..., draft=...)``; then ``recorder.begin()`` before a decode
    call, pass ``recorder.on_cycle`` as the loop's callback, and ``recorder.finish()`` after it.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = device
        self.timeline = SequenceTimeline()
        # Hooks run on every forward, so they do the least possible: a timestamp and a tuple; the
        # records are built in finish(), outside the timed forwards.
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self._now = self._cuda_mark if self.cuda else time.perf_counter
        self._starts: list = []  # perf_counter seconds, or CUDA events (converted in finish)
        self._raw: list[tuple] = []
        # CUDA events made before a decode (begin) and recorded again in every one: creating an event per
        # mark was host work inside the timed loop, 3 marks per forward and cycle (issue 37, R7).
        self._events: list = []
        self._used = 0

    def _cuda_mark(self):
        """The next pre-made CUDA event, recorded on the current stream now (no synchronisation)."""
        if self._used == len(self._events):  # more marks than begin() made: one more, made now
            self._events.append(torch.cuda.Event(enable_timing=True))
        event = self._events[self._used]
        self._used += 1
        event.record()
        return event

    def _ready(self) -> None:
        """Events for the next decode, made before it starts: as many as the last one marked, twice over."""
        want = max(EVENTS_AHEAD, 2 * self._used)
        self._events.extend(torch.cuda.Event(enable_timing=True) for _ in range(want - len(self._events)))
        self._used = 0

    def _pre(self, role: str):
        def hook(module, args, kwargs):
            self._starts.append(self._now())
        return hook

    def _post(self, role: str):
        def hook(module, args, kwargs, output):
            end = self._now()
            ids = kwargs.get("input_ids", args[0] if args else None)
            tokens = int(ids.shape[-1]) if ids is not None else 0
            self._raw.append((role, tokens, _cache_len(kwargs) - tokens, self._starts.pop(), end))
        return hook

    @contextmanager
    def attach(self, target: torch.nn.Module, *drafts: torch.nn.Module | None) -> Iterator[ForwardRecorder]:
        """Register the hooks on the target and the draft models for the block (removed even on error)."""
        handles = []
        for role, model in (("target", target), *(("draft", d) for d in drafts)):
            if model is None:
                continue
            handles.append(model.register_forward_pre_hook(self._pre(role), with_kwargs=True))
            handles.append(model.register_forward_hook(self._post(role), with_kwargs=True))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def begin(self) -> None:
        """Start a new timeline (one decode call)."""
        self._starts.clear()
        self._raw.clear()
        if self.cuda:
            self._ready()
        self.timeline = SequenceTimeline(start=self._now())

    def on_cycle(self, stats: CycleStats) -> None:
        """The speculative loop's callback: marks the end of a cycle."""
        self.timeline.cycle_ends.append(self._now())
        self.timeline.cycles.append(stats)

    def finish(self) -> SequenceTimeline:
        """Close the current timeline and return it (on a GPU: wait for it, then read every event as
        seconds since the timeline's start event)."""
        tl = self.timeline
        tl.end = self._now()
        raw, self._raw = self._raw, []
        if self.cuda:
            synchronize(self.device)
            origin = tl.start

            def at(event) -> float:
                return origin.elapsed_time(event) / 1e3

            raw = [(role, k, ctx, at(a), at(b)) for role, k, ctx, a, b in raw]
            tl.cycle_ends = [at(e) for e in tl.cycle_ends]
            tl.start, tl.end = 0.0, at(tl.end)
        tl.forwards = [ForwardRecord(*r) for r in raw]
        return tl


Prefills = list[tuple[int, float]]  # (tokens, seconds) per timeline


def _sorted_forwards(timelines: list[SequenceTimeline]) -> tuple[dict[int, list[float]], Prefills, Prefills,
                                                                    dict[int, list[float]]]:
    """Every timed forward of ``timelines`` in seconds, by what it was: (verifies by width k, target prefills,
    draft prefills (with their tokens), one-token draft forwards by their position j in the cycle: 1 is right
    after a verify). The first cycle's draft forwards and verify are left out, as its overhead is
    (``SequenceTimeline.cycle_overheads``): they run while the prefills' work drains (on a GPU, a long prefill's
    kernels are still queued), so they are not what a steady cycle pays."""
    verify: dict[int, list[float]] = {}
    target_prefill: Prefills = []
    draft_prefill: Prefills = []
    position: dict[int, list[float]] = {}
    for tl in timelines:
        forwards = sorted(tl.forwards, key=lambda f: f.start)
        targets = 0  # target forwards so far: the prefill, then one verify per cycle
        seen_draft = False
        previous = None
        j = 0
        for f in forwards:
            if f.role == "target":
                if targets == 0:
                    target_prefill.append((f.tokens, f.seconds))
                elif targets > 1:  # the first cycle's verify overlaps the prefill's work: not a steady one
                    verify.setdefault(f.tokens, []).append(f.seconds)
                targets += 1
            elif not seen_draft:
                draft_prefill.append((f.tokens, f.seconds))
                seen_draft = True
            elif targets > 1 and (previous == "target" or f.tokens == 1):  # the first cycle's are not steady
                j = 1 if previous == "target" else j + 1
                position.setdefault(j, []).append(f.seconds)
            previous = f.role
    return verify, target_prefill, draft_prefill, position


def in_loop_medians(timelines: list[SequenceTimeline]) -> dict:
    """In-loop forward times (seconds), to which the micro-benchmarks are calibrated.

    Throughput pays the *mean* forward time, and inside the loop forwards have a right tail (a few
    are much slower than the median), so the trimmed means (:func:`trimmed_mean`) are kept next to
    the medians.

    Inside the loop the draft's first forward of a cycle runs right after a target forward (its
    weights are cold in the CPU caches) and the following ones back to back (warming up), so the two
    are kept apart, and so is each position j in the cycle: on a CPU a draft's j-th forward gets
    cheaper with j for several positions, so the mean of the later forwards of an N_max pass
    undercounts a short cycle (docs/model.md, "The draft's forwards warm up within a cycle").

    Returns:
        ``{"verify_s": {k: median}, "verify_mean_s": {k: trimmed mean}, "verify_n": {k: count},
        "draft_first_s" / "draft_first_mean_s": each cycle's first draft forward, "draft_rest_s" /
        "draft_rest_mean_s": the other one-token draft forwards, "draft_first_n", "draft_rest_n",
        "target_prefill_s": [...], "draft_prefill_s": [...] and their "..._tokens", "draft_position_mean_s" /
        "draft_position_n": {j: trimmed mean / count of the j-th draft forward of a cycle},
        "verify_robust_s", "draft_first_robust_s", "draft_rest_robust_s", "draft_position_robust_s": the
        same as robust means
        (:func:`robust_mean`: one-off costs left out)}`` (prefills per timeline, in order).
    """
    import statistics

    verify, target_prefill, draft_prefill, position = _sorted_forwards(timelines)
    first = position.get(1, [])
    rest = [t for j in sorted(position) if j > 1 for t in position[j]]  # every later one-token forward
    med = statistics.median
    return {
        "verify_s": {k: med(v) for k, v in sorted(verify.items())},
        "verify_mean_s": {k: trimmed_mean(v) for k, v in sorted(verify.items())},
        "verify_n": {k: len(v) for k, v in sorted(verify.items())},
        "draft_first_s": med(first) if first else None,
        "draft_rest_s": med(rest) if rest else None,
        "draft_first_mean_s": trimmed_mean(first) if first else None,
        "draft_rest_mean_s": trimmed_mean(rest) if rest else None,
        "draft_first_n": len(first),
        "draft_rest_n": len(rest),
        "draft_position_mean_s": {j: trimmed_mean(v) for j, v in sorted(position.items())},
        # robust means (one-off costs such as a graph capture left out): what the calibration reads
        "verify_robust_s": {k: robust_mean(v) for k, v in sorted(verify.items())},
        "draft_first_robust_s": robust_mean(first) if first else None,
        "draft_rest_robust_s": robust_mean(rest) if rest else None,
        "draft_position_robust_s": {j: robust_mean(v) for j, v in sorted(position.items())},
        "draft_position_n": {j: len(v) for j, v in sorted(position.items())},
        "target_prefill_s": [t for _, t in target_prefill],
        "draft_prefill_s": [t for _, t in draft_prefill],
        # the prefills' lengths, so each is compared with the micro-benchmark of its own prompt
        "target_prefill_tokens": [k for k, _ in target_prefill],
        "draft_prefill_tokens": [k for k, _ in draft_prefill],
    }
