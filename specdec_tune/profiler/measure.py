"""Measure configurations end to end on a profiled run's prompts and store what was measured.

Throughput is what a user sees: new tokens / wall seconds of whole decode calls (prefill included),
summed over the prompts, after one untimed warm-up decode. The profiler measures and never predicts
(docs/architecture.md, Rooms): the command that wants predicted next to measured asks ``tuner`` for the
prediction and stores it beside this measurement (``tuner.search``'s ``measure_predicted``).

Several configurations of one run are measured together: the models are loaded once, and each repeat
decodes every prompt with every configuration, the configurations taking turns prompt by prompt in a
rotated order (:func:`_run_cases`), so a slow minute of a shared machine is spread over all configurations
instead of landing on one: rankings and errors compare like with like (docs/architecture.md, Measurement
rules). Each measurement stores its 95% CI, the raw per-prompt, per-repeat samples, every request's token
arrivals and, with NVML, each pass's joules.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from specdec_tune.db import Database, RunSettings, add_measured_run, get_run, load_tree_traces
from specdec_tune.engine import DecodeConfig, LoadedModel, acceptance_per_position, check_compatible, load_model
from specdec_tune.core.costs import check_price
from specdec_tune.engine import load_workload
from specdec_tune.core.errors import InputError
from specdec_tune.core.latency import LatencySamples, RequestLatency
from specdec_tune.profiler.describe import tokenizer_hash
from specdec_tune.profiler.energy import EnergyMeter, EnergySamples, open_energy_meter, operator_columns
from specdec_tune.profiler.machine_probe import MachineProbe
from specdec_tune.profiler.memory import peak_for_run
from specdec_tune.profiler.runs import NGRAM, SUFFIX, DraftSpec, after_request, encode_prompt, measure_prompt
from specdec_tune.profiler.runs import new_pass, warm_up
from specdec_tune.profiler.suffix_history import SuffixHistory
from specdec_tune.profiler.settings import Progress
from specdec_tune.profiler.threads import ThreadChoice, apply_threads, choose_threads
from specdec_tune.core.splits import check_split, check_split_prompts
from specdec_tune.core.stats import RateSamples, tokens_per_s_ci

from specdec_tune.profiler.measure_records import PLAIN, Measurement, MeasureSpec


def _load(name: str, source: str | None, device: str, dtype: str, forward: str, graphs: str = "auto") -> LoadedModel:
    """Load a model of the run by the name given then; its resolved folder if the name no longer resolves
    (a relative path from another directory)."""
    if source and not Path(name).expanduser().exists() and Path(source).is_dir():
        loaded = load_model(source, device, dtype, forward, graphs)
        loaded.name = name
        return loaded
    return load_model(name, device, dtype, forward, graphs)


def _warn_if_changed(loaded: LoadedModel, stored_hash: str | None, stored_params: int | None) -> None:
    if stored_hash and tokenizer_hash(loaded.tokenizer) != stored_hash:
        print(f"warning: the tokenizer of {loaded.name!r} changed since the profile run", file=sys.stderr)
    if stored_params and loaded.num_parameters != stored_params:
        print(f"warning: {loaded.name!r} has {loaded.num_parameters} parameters, the profile run had {stored_params}; "
              "the prediction describes the old model", file=sys.stderr)


def _warn_if_graphs_changed(target: LoadedModel, profiled: str | None) -> None:
    """A CUDA-graph state that differs from the profile's (a capture failed in one of them) times another
    forward than the prediction describes: say so (engine/cuda_graphs.py)."""
    now = target.cuda_graphs
    if profiled is not None and now is not None and now != profiled:
        print(f"warning: the target ran with CUDA graphs {now!r}, the profile with {profiled!r}; the prediction "
              "describes the other forward", file=sys.stderr)


@dataclass
class _Case:
    """One configuration being measured: what to run and what it has measured so far."""

    draft: str | None
    config: MeasureSpec
    spec: DraftSpec
    decode: DecodeConfig
    times: list[list[float]]  # [prompt][repeat] seconds
    tokens: list[list[int]]  # [prompt][repeat] new tokens
    cycles: list = field(default_factory=list)
    probes: list[float] = field(default_factory=list)  # the machine probe's seconds, read between turns
    arrivals: list[list[RequestLatency]] = field(default_factory=list)  # [prompt][repeat]
    joules: list[float] = field(default_factory=list)  # [repeat] energy of this pass (GPU with NVML only)


def default_split(settings: RunSettings) -> str | None:
    """``holdout`` for a run profiled on the ``tune`` split, else ``None`` (the run's own prompts)."""
    return "holdout" if settings.split == "tune" else None


def chosen_prompts(run, split: str | None, max_prompts: int | None):
    """The prompts a measurement of ``run`` decodes: ``(split, prompts)``; ``split`` None = the run's own."""
    settings = run.settings
    if max_prompts is not None and max_prompts < 1:
        raise InputError(f"--max-prompts must be >= 1, got {max_prompts}")
    if split is not None:
        split = check_split(split)
    name = settings.workload or (run.workload.name if run.workload else "")
    workload = load_workload(name)
    if split is None:
        by_id = {p.id: p for p in workload}
        wanted = list(settings.prompt_ids)
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise InputError(f"workload {settings.workload!r} no longer has prompt(s) {missing[:3]} of run {run.id}")
        prompts = [by_id[i] for i in wanted]
    else:
        prompts = check_split_prompts(workload, split, name)  # none (holdout of one prompt): refused, with counts
    if max_prompts is not None:
        prompts = prompts[:max_prompts]
    if not prompts:
        raise InputError(f"run {run.id}: no prompts to measure (split {split or 'of the run'})")
    return split, prompts


def measure_configs(
    db: Database,
    run_id: int,
    items: list[MeasureSpec],
    *,
    split: str | None = None,
    temperature: float = 0.0,
    max_prompts: int | None = None,
    repeats: int = 3,
    seed: int = 0,
    progress: Progress | None = None,
    threads: int | None = None,
    gpu_price: float | None = None,
    peak_memory: bool = False,
    suffix_history: str | None = None,
) -> list[Measurement]:
    """Measure several configurations of one run, interleaved (the module docstring), and store each measurement.

    Plain decoding (``MeasureSpec(PLAIN)``) can be one of them (a speedup and its paired CI from the
    same passes).

    Args:
        db: the results database holding the run.
        run_id: the profile run (its workload, max_new_tokens, device and dtype are reused).
        items: the configurations: draft, N, θ and schedule (batch size 1: the engine decodes one sequence).
        split: which prompts (:func:`default_split`: ``holdout`` for a run profiled on ``tune``).
        temperature: 0 = greedy; otherwise the run must have a sampling profile at this temperature.
        max_prompts: measure only the first prompts of the split.
        repeats: decode the prompt set this many times; each prompt counts with its median time.
        seed: sampling seed.
        progress: progress sink.
        threads: intra-op threads (None: the profile's, lowered to the CPUs idle now; :mod:`profiler.threads`).
        gpu_price: the device's dollars per hour (stored as $ per million tokens).
        peak_memory: also measure each configuration's peak memory in a fresh process (:mod:`profiler.memory`).
        suffix_history: which earlier responses suffix decoding's global tree holds (``profiler.suffix_history``):
            ``order``, ``warm`` (the profiled prompts' responses) or ``cold``; default ``order`` on the run's own
            prompts (as profiled) and ``warm`` on any other split. Each repeat starts the history again.

    Raises:
        NotFoundError: unknown run or draft.
        InputError: a configuration the engine cannot run, or a bad split.
    """
    run = get_run(db, run_id)
    _check(run, items, repeats, temperature, gpu_price)
    settings = run.settings
    planned = [(None if item.is_plain else run.resolve_draft(item.spec.drafter), item) for item in items]
    inners = [item.spec.staged if item.spec.staged == NGRAM else run.resolve_draft(item.spec.staged)
              for _, item in planned if item.spec.staged]
    split, prompts = chosen_prompts(run, split, max_prompts)
    history = _suffix_history(db, run, split, suffix_history)
    target, specs, choice = _load_models(run, [name for name, _ in planned] + inners, threads, history)
    wanted, ids = [p.id for p in prompts], [encode_prompt(target, p.prompt, p.id) for p in prompts]
    max_new = settings.max_new_tokens
    synthetic = settings.synthetic_acceptance
    cases = [_Case(name, config, _drafter(specs, name, config),
                   _decode_config(config, max_new, temperature, target, synthetic, seed), [[] for _ in ids],
                   [[] for _ in ids], arrivals=[[] for _ in ids]) for name, config in planned]
    _metered(target, cases, wanted, ids, repeats, seed, progress or Progress())
    _warn_if_graphs_changed(target, settings.cuda_graphs_used)
    ctx = _Context(temperature, repeats, split, wanted, [pid in set(settings.prompt_ids) for pid in wanted],
                   [int(x.shape[0]) for x in ids], choice, gpu_price)
    return [_store(db, run_id, case, ctx, peak_for_run(run, _source(case), case.config.spec.num_speculative_tokens,
                                                      prompts[0].prompt, max_new, choice.threads) if peak_memory else None)
            for case in cases]


def _drafter(specs: dict[str | None, DraftSpec], name: str | None, config: MeasureSpec) -> DraftSpec:
    """The loaded drafter of ``name``, drafting ``config``'s tree or staged by its inner drafter."""
    spec, tree, staged = specs[name], config.spec.tree, config.spec.staged
    if not (tree or staged):
        return spec
    if spec.model is None:
        raise InputError(f"{tree and 'token trees' or 'staged drafting'} need a draft model, not {name!r}")
    return replace(spec, tree=tree, rank_accept=tuple(config.rank_accept), inner=specs[staged] if staged else None)


def _metered(target: LoadedModel, cases: list[_Case], wanted: list[str], ids: list[torch.Tensor], repeats: int,
             seed: int, progress: Progress) -> None:
    """:func:`_run_cases` with the device's energy meter open (none on a CPU)."""
    meter = open_energy_meter(target.device)
    try:
        _run_cases(target, cases, wanted, ids, repeats, seed, progress, meter)
    finally:
        if meter is not None:
            meter.close()


def _source(case: _Case) -> str:
    return case.spec.model.source if case.spec.model is not None else case.spec.kind


def _check(run, items: list[MeasureSpec], repeats: int, temperature: float, gpu_price: float | None = None) -> None:
    check_price(gpu_price)
    if not items:
        raise InputError("no configuration to measure")
    if repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {repeats}")
    profiled = run.settings.temperature
    if temperature > 0 and abs(profiled - temperature) > 1e-9:
        raise InputError(f"run {run.id} was profiled at --temperature {profiled}; "
                         f"measure at that temperature or 0 (greedy), not {temperature}")


def measure_config(db: Database, run_id: int, config: MeasureSpec, **options: Any) -> Measurement:
    """Measure one configuration: :func:`measure_configs` with ``[config]`` and the same keyword options."""
    return measure_configs(db, run_id, [config], **options)[0]


def _suffix_history(db: Database, run, split: str | None, policy: str | None) -> SuffixHistory:
    """The serving-history policy of suffix decoding for this measurement (:func:`measure_configs`)."""
    policy = policy or ("order" if split is None else "warm")
    if policy != "warm":
        return SuffixHistory(policy)
    rows = load_tree_traces(db, run.id, SUFFIX, "sequences")
    if not rows:
        if SUFFIX in run.draft_names:
            raise InputError(f"run {run.id} stores no sequences to warm suffix decoding with; profile it again")
        return SuffixHistory("order")  # no suffix draft measured here
    return SuffixHistory("warm", warm=[(r.data["prompt"], r.data["output"]) for r in rows])


def _load_models(run, drafts: list[str | None], threads: int | None,
                 history: SuffixHistory | None = None) -> tuple[LoadedModel, dict[str | None, DraftSpec], ThreadChoice]:
    """The run's target, loaded as profiled, a drafter spec per draft (``None``: plain decoding), and the
    thread count set (the profile's timings hold for its count: ``auto`` keeps it unless CPUs are busy)."""
    settings = run.settings
    device, dtype, forward = settings.device, settings.dtype, settings.forward
    graphs = settings.cuda_graphs  # as profiled: the timings are the graphs' (or eager ones)
    target = _load(run.target.name, run.target.extra.get("source"), device, dtype, forward, graphs)
    _warn_if_changed(target, run.target.tokenizer_hash, run.target.num_parameters)
    specs: dict[str | None, DraftSpec] = {None: DraftSpec("none")}
    for name in dict.fromkeys(n for n in drafts if n is not None):
        if name in (NGRAM, SUFFIX):
            specs[name] = DraftSpec(name, history=history if name == SUFFIX else None)
            continue
        draft_forward = settings.draft_forwards.get(name, forward)
        loaded = load_model(name, target.device, target.dtype, draft_forward, graphs if draft_forward != "hf" else "auto")
        check_compatible(target, loaded)
        specs[name] = DraftSpec("model", loaded)
    first = next((d.model for d in specs.values() if d.model is not None), None)
    choice = choose_threads(threads, target, first, profiled=settings.threads or None)
    return target, specs, apply_threads(choice)


def _decode_config(config: MeasureSpec, max_new: int, temperature: float, target: LoadedModel,
                   synthetic: tuple[float, ...] | None, seed: int) -> DecodeConfig:
    """The engine's settings for one configuration (plain decoding: the engine's default, which
    ``autoregressive`` does not read); a run profiled with synthetic acceptance is measured with the same
    rates (its models' weights are random)."""
    return DecodeConfig(max_new, None if config.is_plain else config.spec, temperature=temperature,
                        eos_token_id=target.eos_token_id, synthetic_acceptance=tuple(synthetic) if synthetic else None,
                        synthetic_seed=seed)


PROBES_PER_REPEAT = 4  # machine probes (20-40 ms each) spread over one repeat of the prompt set


def _run_cases(target: LoadedModel, cases: list[_Case], wanted: list[str], ids: list[torch.Tensor], repeats: int,
               seed: int, progress: Progress, meter: EnergyMeter | None = None) -> None:
    """Warm every case up once, then decode every prompt ``repeats`` times per case, into the cases.

    The configurations take turns prompt by prompt (the order rotated at each prompt and repeat), so a
    slow stretch of a shared machine lands on all of them alike and their ratios compare like with like
    (docs/architecture.md, Measurement rules). With an energy meter the turn is a whole pass over the
    prompts instead: NVML's counter advances in steps of about 13 J (0.1 s), which a read around one
    short decode would not resolve. The machine probe runs :data:`PROBES_PER_REPEAT` times a repeat,
    between turns, and every configuration keeps each reading.
    """
    label = (f"measure {cases[0].draft or 'plain'} N={cases[0].config.spec.num_speculative_tokens} "
             f"θ={cases[0].config.spec.threshold}"
             if len(cases) == 1 else f"measure {len(cases)} configurations")
    progress.stage(label, len(cases) * (len(ids) * repeats + 1))
    probe = MachineProbe(target.device)
    probe.run()  # warm-up
    longest = max(ids, key=len)  # its KV cache is the largest: a CUDA-graph slot every other prompt fits in
    for case in cases:
        warm_up(target, case.spec, longest, case.decode)
        progress.advance()
    turn = len(ids) if meter is not None else 1
    blocks = [range(i, min(i + turn, len(ids))) for i in range(0, len(ids), turn)]
    probe_every = max(1, -(-len(blocks) // PROBES_PER_REPEAT))
    for r in range(repeats):
        for case in cases:  # each repeat is a pass of its own: suffix decoding's history starts again
            new_pass(case.spec)
        for b, block in enumerate(blocks):
            shift = (r + b) % len(cases)  # each configuration takes every place in the order in turn
            for case in cases[shift:] + cases[:shift]:
                joules0 = meter.read() if meter is not None else None
                for i in block:
                    m = measure_prompt(target, case.spec, ids[i], case.decode, prompt_id=wanted[i], seed=seed + i)
                    after_request(case.spec, case.decode)
                    case.times[i].append(m.seconds)
                    case.tokens[i].append(m.new_tokens)
                    if m.latency is not None:
                        case.arrivals[i].append(m.latency)
                    if r == 0 and m.result is not None:
                        case.cycles += m.result.cycles
                    progress.advance()
                if meter is not None and joules0 is not None:  # this configuration's turn only (before the probe)
                    case.joules.append(meter.read() - joules0)
            if (b + 1) % probe_every == 0 or b == len(blocks) - 1:
                seconds = probe.run()  # how fast the machine was: every configuration ran in this stretch
                for case in cases:
                    case.probes.append(seconds)


@dataclass(frozen=True)
class _Context:
    """What every configuration of one ``measure_configs`` call shares."""

    temperature: float
    repeats: int
    split: str | None
    prompt_ids: list[str]
    profiled: list[bool]
    lengths: list[int]
    choice: ThreadChoice
    gpu_price: float | None


def _measurement(run_id: int, case: _Case, ctx: _Context) -> Measurement:
    """The measurement of one case from its raw samples (throughput, CI, acceptance, latency, energy)."""
    samples = RateSamples(tuple(ctx.prompt_ids), tuple(tuple(float(t) for t in row) for row in case.tokens),
                          tuple(tuple(row) for row in case.times))
    per_repeat = [sum(t[r] for t in case.tokens) / sum(t[r] for t in case.times) for r in range(ctx.repeats)]
    cycles = case.cycles
    tau = sum(c.accepted + 1 for c in cycles) / len(cycles) if cycles else (1.0 if case.config.is_plain else None)
    alpha, _ = acceptance_per_position(cycles) if cycles else ([], [])
    latency = LatencySamples(tuple(ctx.prompt_ids), tuple(tuple(row) for row in case.arrivals)) \
        if all(case.arrivals) else None
    energy = EnergySamples(tuple(case.joules), tuple(float(sum(t[r] for t in case.tokens))
                                                     for r in range(len(case.joules)))) if case.joules else None
    return Measurement(
        run_id=run_id, draft=case.draft or PLAIN, config=case.config, temperature=ctx.temperature,
        tokens_per_s=samples.tokens_per_s, seconds=sum(statistics.median(t) for t in case.times),
        new_tokens=int(round(sum(statistics.median(t) for t in case.tokens))), mean_tokens_per_cycle=tau,
        acceptance_per_position=alpha, prompts=len(case.times), repeats=ctx.repeats,
        per_repeat_tokens_per_s=per_repeat, samples=samples, ci95=tokens_per_s_ci(samples), split=ctx.split,
        prompt_ids=list(ctx.prompt_ids), prompt_tokens=list(ctx.lengths), profiled=list(ctx.profiled),
        threads=ctx.choice.to_dict(), probe_seconds=list(case.probes), latency=latency, energy=energy,
        gpu_price=ctx.gpu_price,
        synthetic_acceptance=list(case.decode.synthetic_acceptance) if case.decode.synthetic_acceptance else None,
    )


def _store(db: Database, run_id: int, case: _Case, ctx: _Context, peak=None) -> Measurement:
    result = _measurement(run_id, case, ctx)
    result.peak_memory = peak
    operator = operator_columns(result.latency, result.energy, result.gpu_price, result.tokens_per_s)
    if peak is not None:
        operator["peak_memory_bytes"] = peak.bytes
    result.measured_id = add_measured_run(
        db, run_id, draft=case.draft,
        config={**case.config.spec.to_row(), "batch_size": 1, "temperature": ctx.temperature,
                "max_new_tokens": case.decode.max_new_tokens, "prompts": len(case.times), "repeats": ctx.repeats,
                "split": ctx.split or "profiled prompts", "prompt_ids": list(ctx.prompt_ids),
                "prompt_tokens": list(ctx.lengths),
                "in_sample": result.in_sample, "profiled_prompts": sum(ctx.profiled),
                "measured_acceptance_per_position": result.acceptance_per_position,
                "throughput": "end to end, prefill included", "threads": ctx.choice.threads,
                "thread_choice": ctx.choice.to_dict(), "machine_probe_s": result.machine_probe_s,
                "probe_seconds": list(case.probes),
                "acceptance_rates": "synthetic" if case.decode.synthetic_acceptance else "measured",
                "synthetic_acceptance": list(case.decode.synthetic_acceptance or []) or None},
        measured_tokens_per_s=result.tokens_per_s, seconds=result.seconds, new_tokens=result.new_tokens,
        measured_tau=result.mean_tokens_per_cycle, ci=result.ci95, samples=result.samples.to_json(),
        operator=operator,
    )
    return result
