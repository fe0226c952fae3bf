"""Micro-benchmarks of the forwards a speculative cycle runs: T_s, T_v(B, k) and prefill.

Each forward is timed the way the engine calls the model (docs/architecture.md, Engine contracts): the
draft step is a one-token forward with ``logits_to_keep=1`` on a KV cache holding ``context_len`` tokens
(what ``ModelDrafter`` runs per drafted token); the verify forward feeds k tokens with
``logits_to_keep=k`` (what ``speculative`` runs over ``[last, d_1 .. d_L]``, k = L + 1); prefill is one
forward over a whole prompt with ``logits_to_keep=1``. The cache is the engine's preallocated cache,
prefilled once with the longest context a model needs and rolled back in ``setup`` (outside the timed
interval), so every repeat starts at its context length. Batch size B > 1 uses B copies of the context.

Interleaved rounds: every round times each shape once, in a shuffled order, target and draft shapes
mixed. A burst of load from another process then costs every shape a few samples instead of wiping
out the shapes that happened to run during it (the median shrugs it off), slow drift hits all
shapes alike, and the models' weights compete for the CPU caches as they do inside the decode loop.
The warm-up rounds make each shape's CUDA graph; every timed call is a timed region checked for a graph
or slot made inside (re-timed when one was, :mod:`profiler.clean`), with the garbage collector off.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec_tune.db import TimingRow
from specdec_tune.engine import forward_with_cache, make_cache
from specdec_tune.profiler.clean import TimedRegions, quiet_gc
from specdec_tune.profiler.timers import Stopwatch, TimingSamples, synchronize


@dataclass(frozen=True)
class ForwardTiming:
    """Timed repeats of one forward shape.

    Attributes:
        kind: ``draft_step``, ``verify`` or ``prefill`` (see ``db.TIMING_KINDS``).
        k: new tokens per forward (1 for a draft step, N + 1 for a verify, prompt length for prefill).
        batch_size: sequences in the forward.
        context_len: tokens already in the KV cache before the forward.
        samples: the raw timings (seconds) with warm-up kept apart.
        draft: the draft's name for draft forwards, ``None`` for the target.
    """

    kind: str
    k: int
    batch_size: int
    context_len: int
    samples: TimingSamples
    draft: str | None = None

    def rows(self) -> list[TimingRow]:
        """Every sample (warm-up flagged) as database rows."""
        common = dict(kind=self.kind, k=self.k, batch_size=self.batch_size, context_len=self.context_len, draft=self.draft)
        warm = [TimingRow(seconds=s, warmup=True, **common) for s in self.samples.warmup]
        return warm + [TimingRow(seconds=s, **common) for s in self.samples.samples]


@dataclass(frozen=True)
class Case:
    """One forward shape to time: ``setup`` (untimed) then ``fn`` (timed)."""

    kind: str
    k: int
    batch_size: int
    context_len: int
    draft: str | None
    fn: Callable[[], object]
    setup: Callable[[], object]


def context_tokens(source: torch.Tensor | None, length: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """``[length]`` token ids: ``source`` (real prompt tokens) repeated to fill, else seeded random ids.

    Forward cost does not depend on token values, but real tokens keep any data-dependent path honest.
    """
    if length < 1:
        raise ValueError(f"context length must be >= 1, got {length}")
    if source is None or source.numel() == 0:
        gen = torch.Generator().manual_seed(0)
        return torch.randint(0, vocab_size, (length,), generator=gen).to(device)
    reps = -(-length // source.numel())
    return source.to(device).repeat(reps)[:length]


def _forward(model: torch.nn.Module, ids: torch.Tensor, cache, keep: int) -> torch.Tensor:
    return forward_with_cache(model, ids, cache, logits_to_keep=keep).logits


def _vocab(model: torch.nn.Module) -> int:
    return int(model.config.get_text_config(decoder=True).vocab_size)


def cached_cases(
    model: torch.nn.Module,
    kind: str,
    shapes: Sequence[tuple[int, int]],
    *,
    batch_size: int = 1,
    source: torch.Tensor | None = None,
    draft: str | None = None,
    device: torch.device | None = None,
) -> list[Case]:
    """Cases for forwards of k new tokens on a cache holding ``context_len`` tokens, B copies.

    Args:
        model: a causal LM.
        kind: ``verify`` or ``draft_step`` (the stored kind).
        shapes: (context_len, k) pairs; one cache per distinct context length, prefilled once and
            rolled back to it before every timed forward.
        batch_size: B copies of the sequence.
        source: real tokens for the context (else random ids).
        draft: the draft's name for draft forwards.
        device: where the model runs.
    """
    if not shapes or any(c < 1 or k < 1 for c, k in shapes) or batch_size < 1:
        raise ValueError(f"need context_len >= 1, k >= 1 and batch_size >= 1, got {list(shapes)}, B={batch_size}")
    device = device or (source.device if source is not None else torch.device("cpu"))
    longest = max(c for c, _ in shapes)
    ctx = context_tokens(source, longest, _vocab(model), device)
    caches = {}
    for c in sorted({c for c, _ in shapes}):
        caches[c] = make_cache(model, c + max(k for cc, k in shapes if cc == c))
        with torch.inference_mode():
            _forward(model, ctx[None, :c].expand(batch_size, c).contiguous(), caches[c], 1)
    cases = []
    for c, k in shapes:
        new = ctx[torch.arange(k, device=device) % longest][None].expand(batch_size, k).contiguous()  # [B, k]
        cases.append(Case(kind, k, batch_size, c, draft,
                          fn=lambda new=new, k=k, cache=caches[c]: _forward(model, new, cache, k),
                          setup=lambda c=c, cache=caches[c]: cache.truncate(c)))
    return cases


def prefill_cases(
    model: torch.nn.Module, prompts: Sequence[torch.Tensor], *, drop_last: bool, draft: str | None = None
) -> list[Case]:
    """Prefill of each prompt into an empty cache, as the speculative loop runs it.

    The target prefills all but the last prompt token (``drop_last``; the first cycle feeds the last
    one); the draft's first ``propose`` feeds the whole prompt.
    """
    cases = []
    for ids in prompts:
        ids = ids[:-1] if drop_last else ids
        if ids.numel() == 0:
            continue
        cache = make_cache(model, ids.shape[0])
        cases.append(Case("prefill", int(ids.numel()), 1, 0, draft,
                          fn=lambda ids=ids[None], cache=cache: _forward(model, ids, cache, 1),
                          setup=lambda cache=cache: cache.truncate(0)))
    return cases


def run_interleaved(
    cases: Sequence[Case],
    *,
    warmup: int,
    repeats: int,
    device: torch.device | str | None = None,
    seed: int = 0,
    advance: Callable[[], None] | None = None,
    regions: TimedRegions | None = None,
) -> list[ForwardTiming]:
    """Time every case once per round, ``warmup`` + ``repeats`` rounds, shuffled order per round.

    Args:
        cases: the shapes to time.
        warmup: rounds whose samples are kept apart (allocation, kernel selection).
        repeats: timed rounds.
        device: selects CUDA events or perf_counter; synchronised before each timed call.
        seed: shuffling seed (reproducible order).
        advance: called after every round (progress).
        regions: checks every timed call (a call that made a graph or slot is timed again).

    Returns:
        One :class:`ForwardTiming` per case, in the order given.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    watch = Stopwatch(device)
    rng = random.Random(seed)
    warm: list[list[float]] = [[] for _ in cases]
    timed: list[list[float]] = [[] for _ in cases]
    order = list(range(len(cases)))
    regions = regions or TimedRegions({})

    def once(case: Case) -> float:
        case.setup()
        synchronize(device)
        watch.start()
        case.fn()
        return watch.stop()

    with torch.inference_mode(), quiet_gc():
        for r in range(warmup + repeats):
            rng.shuffle(order)
            for i in order:
                case = cases[i]
                if r < warmup:
                    warm[i].append(once(case))
                else:
                    timed[i].append(regions.run(lambda: once(case), f"{case.kind} k={case.k} c={case.context_len}"))
            if advance is not None:
                advance()
    return [
        ForwardTiming(c.kind, c.k, c.batch_size, c.context_len, TimingSamples(tuple(t), tuple(w)), c.draft)
        for c, t, w in zip(cases, timed, warm)
    ]


def time_cached_forward(
    model: torch.nn.Module,
    context: torch.Tensor,
    k: int,
    *,
    batch_size: int = 1,
    warmup: int = 3,
    repeats: int = 20,
    device: torch.device | None = None,
) -> TimingSamples:
    """Time one forward of ``k`` new tokens on a KV cache holding ``context`` (``[T]``), B copies."""
    cases = cached_cases(model, "verify", [(context.shape[0], k)], batch_size=batch_size, source=context,
                         device=device or context.device)
    return run_interleaved(cases, warmup=warmup, repeats=repeats, device=device)[0].samples
