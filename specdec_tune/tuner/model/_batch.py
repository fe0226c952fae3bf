"""Batches as the engine decodes them (docs/model.md, item 7): ragged rows in lock-step cycles, a static batch
that shrinks. Private half of :mod:`tuner.model`; pure Python.

The lock-step model (``_throughput.predict`` at batch size B) assumes every row runs the same cycle: B·E[τ]
tokens for F·T_s(B) + T_v(B, L + 1). The batched engine (``engine.batch_decode``) differs in three ways,
each modelled here:

- **Ragged widths.** Rows draft their own L (θ cuts them where it will, the last cycle of a row is cut by
  its remaining tokens) and one target forward verifies all of them at the batch's widest:
  T_v(A, max_r L_r + 1). The draft model steps every row still drafting together: max_r F_r forwards.
- **Ragged ends.** Each row accepts its own prefix, so rows need different numbers of cycles; the batch
  keeps running until its longest row is done, with A_t, the rows still live at cycle t, falling (a row
  that finished leaves and nobody takes its place).
- **Prefill.** Row by row at each row's own length (the engine does not pad prompts: ``engine.ragged``), the
  target's and the draft's (its first proposal), then every cycle steps the whole batch.

A row's cycles are its own greedy simulation where the profile ran its prompt (exact: in the batch each
row drafts and accepts what it would alone), else, for a prompt the profile did not run, the simulated
cycles of a profiled prompt drawn at random (seeded; the prediction averages ``draws`` batches). Sampling
and n-gram lookup draw each row's cycles i.i.d. from the replayed traces until its tokens are out. On a
GPU with CUDA graphs the forwards are priced at the padded batch size (``ModelProfile.batch_graph_sizes``:
``_throughput.verify_time`` and ``draft_step_time`` are step functions of B there).
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model._greedy_sim import SimulatedCycle
from specdec_tune.tuner.model._prefill import prefill_fits, prompt_prefill
from specdec_tune.tuner.model._predict import PromptSpec, RunPrediction, _check_specs, simulate_config
from specdec_tune.tuner.model._profile import RunProfile
from specdec_tune.tuner.model._replay import cut_cycle, lookup_cycles
from specdec_tune.tuner.model._throughput import SpecConfig, draft_seconds, draft_step_time, verify_time

DRAWS = 64  # batches drawn per group with held-out rows (the prediction is their average)

RowCycles = Callable[[PromptSpec, random.Random], list[SimulatedCycle]]


def batch_groups(specs: Sequence[PromptSpec], batch_size: int) -> list[list[PromptSpec]]:
    """The batches a measurement at batch size B decodes: consecutive groups of B prompts (the last partial
    group is not decoded: it would be a batch of another size)."""
    if batch_size < 1 or len(specs) < batch_size:
        raise InputError(f"batch size {batch_size} needs at least {batch_size} prompts, got {len(specs)}")
    return [list(specs[i:i + batch_size]) for i in range(0, len(specs) - batch_size + 1, batch_size)]


def _emitted(cycles: Sequence[SimulatedCycle], new_tokens: int) -> int:
    return min(new_tokens, sum(c.accepted + 1 for c in cycles))


def _greedy_rows(rp: RunProfile, config: SpecConfig) -> RowCycles:
    """A row's cycles: its own exact simulation (profiled prompt), else a profiled prompt's, drawn."""
    exact = [simulate_config(rp, config, i) for i in range(len(rp.prompts))]

    def row(spec: PromptSpec, rng: random.Random) -> list[SimulatedCycle]:
        return exact[spec.profiled_index] if spec.profiled_index is not None else exact[rng.randrange(len(exact))]

    return row


def _replayed_rows(rp: RunProfile, config: SpecConfig) -> RowCycles:
    """A row's cycles drawn i.i.d. from the replayed traces (sampling, n-gram lookup) until its tokens are out."""
    c = config.spec
    if c.schedule != "constant" or c.threshold_kind == "adaptive":
        raise InputError("at batch size > 1 the model replays constant schedules with a fixed θ only "
                         "(the heuristic schedule and the adaptive θ are simulated in greedy mode)")
    traces = rp.model.sampling_traces if config.mode == "sampling" and rp.model.sampling_traces else rp.model.traces
    if rp.model.lookup:
        traces = lookup_cycles(traces, c.num_speculative_tokens)
    if not traces:
        raise InputError(f"run {rp.run.id} has no traces for draft {rp.draft!r} in {config.mode} mode")
    pool = [SimulatedCycle(*cut_cycle(t, c.num_speculative_tokens, c.threshold, c.threshold_rule, c.threshold_kind))
            for t in traces]

    def row(spec: PromptSpec, rng: random.Random) -> list[SimulatedCycle]:
        out: list[SimulatedCycle] = []
        while _emitted(out, spec.new_tokens) < spec.new_tokens:
            out.append(pool[rng.randrange(len(pool))])
        return out

    return row


def batch_cycles(rows: Sequence[Sequence[SimulatedCycle]]) -> list[tuple[int, int, int]]:
    """(live rows A, verify width W, draft forwards F) of each cycle of rows decoded together: cycle t runs the
    rows with more than t cycles, at the widest verify and the most draft forwards among them."""
    out, t = [], 0
    while True:
        live = [r[t] for r in rows if len(r) > t]
        if not live:
            return out
        out.append((len(live), max(c.proposed for c in live) + 1, max(c.forwards for c in live)))
        t += 1


def lockstep_seconds(rp: RunProfile, rows: Sequence[Sequence[SimulatedCycle]]) -> tuple[float, int]:
    """(decode seconds, batch cycles) of rows decoded together (:func:`batch_cycles`), each cycle
    F·T_s(A) + T_v(A, W) + the engine's per-cycle overhead."""
    cycles = batch_cycles(rows)
    seconds = sum(draft_seconds(rp.model, a, f) + verify_time(rp.model, a, w) + rp.cycle_overhead_s
                  for a, w, f in cycles)
    return seconds, len(cycles)


def plain_seconds(rp: RunProfile, rows: Sequence[int]) -> float:
    """Decode seconds of plain decoding of rows emitting ``rows[r]`` tokens each (the first from the prefill)."""
    seconds, steps = 0.0, sorted(rows)
    for t in range(1, max(steps, default=0)):
        a = sum(n > t for n in steps)
        seconds += verify_time(rp.model, a, 1) + rp.model.ar_overhead_s
    return seconds


def _prefill_s(rp: RunProfile, group: Sequence[PromptSpec], draft: bool) -> float:
    """The batch's prefills: each row's own, as the engine runs them row by row (target; the draft's first
    proposal): a profiled prompt's measured prefill, another's from the line in the prompt length."""
    fits = prefill_fits(rp)
    rows = [prompt_prefill(rp, s.profiled_index, s.prompt_tokens, fits) for s in group]
    return sum(t + (d if draft else 0.0) for t, d in rows)


def predict_batches(rp: RunProfile, config: SpecConfig, groups: Sequence[Sequence[PromptSpec]], *,
                    draws: int = DRAWS, seed: int = 0) -> RunPrediction:
    """Predicted end-to-end throughput of decoding ``groups`` (each one batch) with the batched engine
    (module docstring); N = 0: plain decoding. ``config.batch_size`` is ignored: a group's size is its B.

    Raises:
        InputError: no groups, a batch size the profile did not time (T_v(B, k)), or a configuration the
            batch model does not replay.
    """
    if not groups or any(not g for g in groups):
        raise InputError("no batches to predict")
    groups = [_check_specs(rp, g) for g in groups]
    n = config.spec.num_speculative_tokens
    if n == 0 or rp.draft is None:
        return _plain(rp, groups)
    greedy = config.mode == "greedy" and rp.positions is not None and not rp.model.synthetic_acceptance
    row = _greedy_rows(rp, config) if greedy else _replayed_rows(rp, config)
    rng = random.Random(seed)
    seconds = tokens = cycles = batch_cycles = drafted = 0.0
    for g in groups:
        exact = all(s.profiled_index is not None for s in g) and greedy
        for _ in range(1 if exact else draws):
            rows = [row(s, rng) for s in g]
            decode, count = lockstep_seconds(rp, rows)
            weight = 1.0 if exact else 1.0 / draws
            seconds += weight * decode
            tokens += weight * sum(_emitted(r, s.new_tokens) for r, s in zip(rows, g))
            cycles += weight * sum(len(r) for r in rows)
            drafted += weight * sum(c.proposed for r in rows for c in r)
            batch_cycles += weight * count
        first = 0.0 if rp.is_ngram else draft_step_time(rp.model, len(g))  # the prefill is the first draft forward
        seconds += _prefill_s(rp, g, True) - first + rp.sequence_overhead_s
    base = _plain(rp, groups)
    return _prediction(rp, groups, tokens, seconds, base, cycles, batch_cycles, drafted)


def _plain(rp: RunProfile, groups: Sequence[Sequence[PromptSpec]]) -> RunPrediction:
    tokens = sum(s.new_tokens for g in groups for s in g)
    seconds = sum(plain_seconds(rp, [s.new_tokens for s in g]) + _prefill_s(rp, g, False) for g in groups)
    steps = sum(max(s.new_tokens for s in g) - 1 for g in groups)
    return RunPrediction(tokens_per_s=tokens / seconds, decode_tokens_per_s=tokens / seconds, speedup=1.0,
                         baseline_tokens_per_s=tokens / seconds, expected_tokens_per_cycle=1.0,
                         expected_draft_length=0.0, expected_draft_forwards=0.0,
                         cycle_time_s=seconds / max(steps, 1), seconds=seconds, new_tokens=tokens,
                         source=f"batch model, B={len(groups[0])}", in_sample=_in_sample(groups),
                         prompts=sum(len(g) for g in groups), cycles=float(steps))


def _prediction(rp: RunProfile, groups, tokens: float, seconds: float, base: RunPrediction, cycles: float,
                batch_cycles: float, drafted: float) -> RunPrediction:
    tps = tokens / seconds
    return RunPrediction(tokens_per_s=tps, decode_tokens_per_s=tps, speedup=tps / base.tokens_per_s,
                         baseline_tokens_per_s=base.tokens_per_s, expected_tokens_per_cycle=tokens / cycles,
                         expected_draft_length=drafted / cycles, expected_draft_forwards=0.0,
                         cycle_time_s=seconds / max(batch_cycles, 1.0), seconds=seconds, new_tokens=round(tokens),
                         source=f"batch model (ragged rows, lock-step cycles), B={len(groups[0])}",
                         in_sample=_in_sample(groups), prompts=sum(len(g) for g in groups), cycles=batch_cycles)


def _in_sample(groups) -> bool:
    return all(s.profiled_index is not None for g in groups for s in g)


def predict_batch_size(rp: RunProfile, config: SpecConfig, specs: Sequence[PromptSpec], batch_size: int,
                       **kwargs) -> RunPrediction:
    """:func:`predict_batches` on ``specs`` cut into batches of ``batch_size`` (:func:`batch_groups`)."""
    return predict_batches(rp, config, batch_groups(specs, batch_size), **kwargs)
