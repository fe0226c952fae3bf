"""Micro-benchmarks of the forwards a speculative cycle runs: T_s, T_v(B, k) and prefill.

Each forward is timed the way the engine calls the model (ARCHITECTURE §5): the draft step is a
one-token forward with ``logits_to_keep=1`` on a KV cache holding ``context_len`` tokens (what
``ModelDrafter`` runs per drafted token); the verify forward feeds k tokens with ``logits_to_keep=k``
(what ``speculative`` runs over ``[last, d_1 .. d_L]``, k = L + 1); prefill is one forward over a
whole prompt with ``logits_to_keep=1``. The cache is the engine's preallocated cache, rolled back in
the timer's ``setup`` (outside the timed interval) so every repeat starts at the same context length.
Batch size B > 1 uses B copies of the context (lock-step decoding of B sequences).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec_tune.db.records import TimingRow
from specdec_tune.engine import make_cache
from specdec_tune.profiler.timers import TimingSamples, time_callable


@dataclass(frozen=True)
class ForwardTiming:
    """Timed repeats of one forward shape.

    Attributes:
        kind: ``draft_step``, ``verify`` or ``prefill`` (see ``db.records.TIMING_KINDS``).
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
    return model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=keep).logits


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
    """Time one forward of ``k`` new tokens on a KV cache holding ``context`` (``[T]``), B copies.

    Args:
        model: a causal LM.
        context: ``[T]`` token ids already in the cache (prefilled once, untimed).
        k: new tokens per timed forward; all k positions' logits are kept, as in a verify.
        batch_size: B copies of the sequence.
        warmup: untimed-but-recorded repeats.
        repeats: timed repeats.
        device: where the model runs.
    """
    if k < 1 or batch_size < 1:
        raise ValueError(f"need k >= 1 and batch_size >= 1, got k={k}, batch_size={batch_size}")
    device = device or context.device
    length = context.shape[0]
    ctx = context[None].expand(batch_size, length).contiguous()  # [B, T]
    new = context[torch.arange(k, device=context.device) % length][None].expand(batch_size, k).contiguous()  # [B, k]
    cache = make_cache(model, length + k)
    with torch.inference_mode():
        _forward(model, ctx, cache, 1)
    return time_callable(
        lambda: _forward(model, new, cache, k),
        warmup=warmup,
        repeats=repeats,
        device=device,
        setup=lambda: cache.truncate(length),
    )


def time_prefill(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    *,
    warmup: int = 1,
    repeats: int = 3,
    device: torch.device | None = None,
) -> TimingSamples:
    """Time the forward over a whole prompt ``[T]`` into an empty cache (``logits_to_keep=1``)."""
    device = device or prompt.device
    ids = prompt[None]
    cache = make_cache(model, prompt.shape[0])
    return time_callable(
        lambda: _forward(model, ids, cache, 1),
        warmup=warmup,
        repeats=repeats,
        device=device,
        setup=lambda: cache.truncate(0),
    )


Progress = Callable[[], None]


def bench_draft_steps(
    model: torch.nn.Module,
    draft: str,
    source: torch.Tensor | None,
    context_lens: Sequence[int],
    batch_sizes: Sequence[int],
    *,
    typical_context: int,
    warmup: int,
    repeats: int,
    device: torch.device,
    advance: Progress | None = None,
) -> list[ForwardTiming]:
    """T_s: one-token draft forwards at each context length (B = 1) and at ``typical_context`` for every B."""
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    shapes = [(c, 1) for c in context_lens] + [(typical_context, b) for b in batch_sizes]
    out: list[ForwardTiming] = []
    for c, b in dict.fromkeys(shapes):  # keep order, drop duplicates
        ctx = context_tokens(source, c, vocab, device)
        samples = time_cached_forward(model, ctx, 1, batch_size=b, warmup=warmup, repeats=repeats, device=device)
        out.append(ForwardTiming("draft_step", 1, b, c, samples, draft))
        if advance is not None:
            advance()
    return out


def bench_verify(
    model: torch.nn.Module,
    source: torch.Tensor | None,
    ks: Sequence[int],
    batch_sizes: Sequence[int],
    *,
    context_len: int,
    warmup: int,
    repeats: int,
    device: torch.device,
    advance: Progress | None = None,
) -> list[ForwardTiming]:
    """T_v(B, k): target forwards over k new tokens on a cache of ``context_len`` tokens."""
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    ctx = context_tokens(source, context_len, vocab, device)
    out: list[ForwardTiming] = []
    for b in batch_sizes:
        for k in ks:
            samples = time_cached_forward(model, ctx, k, batch_size=b, warmup=warmup, repeats=repeats, device=device)
            out.append(ForwardTiming("verify", k, b, context_len, samples))
            if advance is not None:
                advance()
    return out


def bench_prefill(
    model: torch.nn.Module,
    draft: str | None,
    prompts: Sequence[torch.Tensor],
    *,
    drop_last: bool,
    warmup: int,
    repeats: int,
    device: torch.device,
    advance: Progress | None = None,
) -> list[ForwardTiming]:
    """Prefill time of each prompt, as the speculative loop runs it.

    The target prefills all but the last prompt token (``drop_last``; the first cycle feeds the last
    one); the draft's first ``propose`` feeds the whole prompt.
    """
    out: list[ForwardTiming] = []
    for ids in prompts:
        ids = ids[:-1] if drop_last else ids
        if ids.numel() == 0:
            continue
        samples = time_prefill(model, ids, warmup=warmup, repeats=repeats, device=device)
        out.append(ForwardTiming("prefill", int(ids.numel()), 1, 0, samples, draft))
        if advance is not None:
            advance()
    return out
