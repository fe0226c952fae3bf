"""Measure configurations at batch sizes B > 1 with the batched engine, and store what was measured.

``profiler.measure`` measures at B = 1 (one sequence at a time, unchanged); here each batch size B cuts the
chosen prompts into consecutive batches of B (the last partial batch is not decoded: it would be a batch of
another size; fewer prompts than B is refused) and decodes each batch as one call of the batched engine
(``profiler.batch_runs``). Throughput is what a server at that concurrency delivers: the batch's new tokens
over the wall seconds of the whole call, prefill included, until its last sequence finishes; summed over
the batches. The unit of the 95% CI is the batch (``RateSamples`` rows are batches, each batch's time the
median of its repeats), so a CI needs two batches: 2·B prompts. Every request's token arrivals are kept
per prompt (TTFT and TPOT as a server counts them per request).

The configurations (plain decoding among them: the baseline a schedule's band is measured against at this
batch size) take turns batch by batch in a rotated order, as at B = 1, so a slow stretch of a shared machine
lands on all of them alike and their ratio at each B compares like with like.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec_tune.core.errors import InputError
from specdec_tune.core.latency import LatencySamples, RequestLatency
from specdec_tune.core.stats import RateSamples, tokens_per_s_ci
from specdec_tune.db import Database, add_measured_run, get_run
from specdec_tune.engine import DecodeConfig, LoadedModel, acceptance_per_position
from specdec_tune.profiler.batch_runs import measure_batch, warm_up_batch
from specdec_tune.profiler.machine_probe import MachineProbe
from specdec_tune.profiler.measure import _check, _decode_config, _drafter, _load_models
from specdec_tune.profiler.measure_passes import PROBES_PER_REPEAT
from specdec_tune.profiler.measure import _warn_if_graphs_changed, chosen_prompts
from specdec_tune.profiler.measure_records import Measurement, MeasureSpec
from specdec_tune.profiler.runs import DraftSpec, encode_prompt
from specdec_tune.profiler.settings import Progress
from specdec_tune.profiler.threads import ThreadChoice


@dataclass
class _Case:
    """One configuration at one batch size: what to run and what it has measured."""

    draft: str | None
    config: MeasureSpec
    spec: DraftSpec
    decode: DecodeConfig
    times: list[list[float]]  # [batch][repeat] seconds
    tokens: list[list[int]]  # [batch][repeat] new tokens
    arrivals: dict[int, list[RequestLatency]]  # prompt index -> [repeat]
    rows: list = field(default_factory=list)  # every request's cycles, first repeat
    probes: list[float] = field(default_factory=list)


def batches_of(count: int, batch_size: int) -> list[list[int]]:
    """Consecutive batches of ``batch_size`` prompt indices out of ``count`` (the partial rest dropped).

    Raises:
        InputError: fewer prompts than the batch size.
    """
    if batch_size < 1:
        raise InputError(f"--batch-sizes must be integers >= 1, got {batch_size}")
    if count < batch_size:
        raise InputError(f"batch size {batch_size} needs at least {batch_size} prompts, this split has {count} "
                         "(more prompts: --max-prompts or --split; or a smaller batch size)")
    return [list(range(i, i + batch_size)) for i in range(0, count - batch_size + 1, batch_size)]


def measure_batches(db: Database, run_id: int, items: list[MeasureSpec], batch_sizes: Sequence[int], *,
                    split: str | None = None, temperature: float = 0.0, max_prompts: int | None = None,
                    repeats: int = 3, seed: int = 0, progress: Progress | None = None,
                    threads: int | None = None, gpu_price: float | None = None) -> dict[int, list[Measurement]]:
    """Measure every configuration at every batch size B > 1 (module docstring) and store each measurement.

    Returns:
        batch size -> the measurements of ``items``, in order.

    Raises:
        NotFoundError: unknown run or draft.
        InputError: B = 1 asked (``profiler.measure``), fewer prompts than a batch size, a configuration the
            batched engine cannot run (trees, staged drafting, a model without the lean forward).
    """
    run = get_run(db, run_id)
    _check(run, items, repeats, temperature, gpu_price)
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 2:
        raise InputError(f"the batched measurement takes batch sizes >= 2, got {list(batch_sizes)}")
    settings = run.settings
    planned = [(None if item.is_plain else run.resolve_draft(item.spec.drafter), item) for item in items]
    split, prompts = chosen_prompts(run, split, max_prompts)
    plans = {b: batches_of(len(prompts), b) for b in sizes}  # refused before any model loads
    target, specs, choice = _load_models(run, [name for name, _ in planned], threads)
    ids = [encode_prompt(target, p.prompt, p.id) for p in prompts]
    progress = progress or Progress()
    out = {}
    for b in sizes:
        cases = [_Case(name, config, _drafter(specs, name, config),
                       _decode_config(config, settings.max_new_tokens, temperature, target,
                                      settings.synthetic_acceptance, seed), [[] for _ in plans[b]],
                       [[] for _ in plans[b]], {i: [] for g in plans[b] for i in g}) for name, config in planned]
        _run(target, cases, plans[b], ids, repeats, seed, progress, b)
        ctx = _Context(run_id, temperature, repeats, split, [p.id for p in prompts], [int(x.shape[0]) for x in ids],
                       set(settings.prompt_ids), choice, gpu_price, b, plans[b])
        out[b] = [_store(db, case, ctx) for case in cases]
    _warn_if_graphs_changed(target, settings.cuda_graphs_used)
    return out


def _run(target: LoadedModel, cases: list[_Case], batches: list[list[int]], ids: list[torch.Tensor], repeats: int,
         seed: int, progress: Progress, b: int) -> None:
    """Warm every case up on the first batch, then decode every batch ``repeats`` times per case, the cases
    taking turns batch by batch in a rotated order, the machine probe read between turns."""
    progress.stage(f"measure {len(cases)} configuration{'s' * (len(cases) > 1)} at batch size {b}",
                   len(cases) * (len(batches) * repeats + 1))
    probe = MachineProbe(target.device)
    probe.run()
    full = target.device.type == "cuda"  # a whole warm-up decode captures every graph the batch meets as it shrinks
    for case in cases:
        decode = case.decode if full else DecodeConfig(min(8, case.decode.max_new_tokens), case.decode.spec,
                                                       temperature=case.decode.temperature)
        warm_up_batch(target, case.spec, [ids[i] for i in batches[0]], decode)
        progress.advance()
    probe_every = max(1, -(-len(batches) // PROBES_PER_REPEAT))
    for r in range(repeats):
        for g, batch in enumerate(batches):
            shift = (r + g) % len(cases)
            for case in cases[shift:] + cases[:shift]:
                m = measure_batch(target, case.spec, [ids[i] for i in batch], case.decode, seed=seed + batch[0])
                case.times[g].append(m.seconds)
                case.tokens[g].append(m.new_tokens)
                for i, request in zip(batch, m.latency):
                    case.arrivals[i].append(request)
                if r == 0:
                    case.rows += [c for res in m.results for c in res.cycles]
                progress.advance()
            if (g + 1) % probe_every == 0 or g == len(batches) - 1:
                seconds = probe.run()
                for case in cases:
                    case.probes.append(seconds)


@dataclass(frozen=True)
class _Context:
    run_id: int
    temperature: float
    repeats: int
    split: str | None
    prompt_ids: list[str]
    lengths: list[int]
    profiled: set[str]
    choice: ThreadChoice
    gpu_price: float | None
    batch_size: int
    batches: list[list[int]]


def _measurement(case: _Case, ctx: _Context) -> Measurement:
    """The measurement of one case: per-batch samples and CI, per-request latency, acceptance."""
    labels = tuple("+".join(ctx.prompt_ids[i] for i in g) for g in ctx.batches)
    samples = RateSamples(labels, tuple(tuple(float(t) for t in row) for row in case.tokens),
                          tuple(tuple(row) for row in case.times))
    measured = [i for g in ctx.batches for i in g]
    per_repeat = [sum(t[r] for t in case.tokens) / sum(t[r] for t in case.times) for r in range(ctx.repeats)]
    rows = case.rows
    tau = sum(c.accepted + 1 for c in rows) / len(rows) if rows else None
    latency = LatencySamples(tuple(ctx.prompt_ids[i] for i in measured), tuple(tuple(case.arrivals[i]) for i in measured))
    return Measurement(
        run_id=ctx.run_id, draft=case.draft or "none", config=case.config, temperature=ctx.temperature,
        tokens_per_s=samples.tokens_per_s, seconds=sum(statistics.median(t) for t in case.times),
        new_tokens=int(round(sum(statistics.median(t) for t in case.tokens))), mean_tokens_per_cycle=tau,
        acceptance_per_position=acceptance_per_position(rows)[0] if rows and any(c.drafted for c in rows) else [],
        prompts=len(measured), repeats=ctx.repeats, per_repeat_tokens_per_s=per_repeat, samples=samples,
        ci95=tokens_per_s_ci(samples), split=ctx.split, prompt_ids=[ctx.prompt_ids[i] for i in measured],
        prompt_tokens=[ctx.lengths[i] for i in measured], profiled=[ctx.prompt_ids[i] in ctx.profiled for i in measured],
        threads=ctx.choice.to_dict(), probe_seconds=list(case.probes), latency=latency, gpu_price=ctx.gpu_price,
        synthetic_acceptance=list(case.decode.synthetic_acceptance) if case.decode.synthetic_acceptance else None,
        batch_size=ctx.batch_size, groups=[[ctx.prompt_ids[i] for i in g] for g in ctx.batches],
    )


def _store(db: Database, case: _Case, ctx: _Context) -> Measurement:
    from specdec_tune.profiler.energy import operator_columns

    m = _measurement(case, ctx)
    m.measured_id = add_measured_run(
        db, ctx.run_id, draft=case.draft,
        config={**case.config.spec.to_row(), "batch_size": ctx.batch_size, "batches": m.groups,
                "temperature": ctx.temperature, "max_new_tokens": case.decode.max_new_tokens,
                "prompts": m.prompts, "repeats": ctx.repeats, "split": ctx.split or "profiled prompts",
                "prompt_ids": m.prompt_ids, "prompt_tokens": m.prompt_tokens, "in_sample": m.in_sample,
                "profiled_prompts": sum(m.profiled), "measured_acceptance_per_position": m.acceptance_per_position,
                "throughput": "end to end per batch (prefill included, until its last sequence finished)",
                "ci_unit": "batch", "threads": ctx.choice.threads, "thread_choice": ctx.choice.to_dict(),
                "machine_probe_s": m.machine_probe_s, "probe_seconds": list(case.probes),
                "acceptance_rates": "synthetic" if case.decode.synthetic_acceptance else "measured",
                "synthetic_acceptance": list(case.decode.synthetic_acceptance or []) or None},
        measured_tokens_per_s=m.tokens_per_s, seconds=m.seconds, new_tokens=m.new_tokens,
        measured_tau=m.mean_tokens_per_cycle, ci=m.ci95, samples=m.samples.to_json(),
        operator=operator_columns(m.latency, None, m.gpu_price, m.tokens_per_s))
    return m
