"""Measure configurations end to end on a profiled run's prompts and store what was measured.

Throughput is what a user sees: new tokens / wall seconds of whole decode calls (prefill included), summed
over the prompts, after an untimed warm-up (the protocol: :mod:`profiler.measure_passes`). The profiler
measures and never predicts (docs/architecture.md, Rooms): the command that wants predicted next to measured
asks ``tuner`` for the prediction and stores it beside this measurement (``tuner.search``'s
``measure_predicted``).

Several configurations of one run are measured together: the models are loaded once, and each repeat
decodes every prompt with every configuration, the configurations taking turns prompt by prompt in a
rotated order (``profiler.measure_passes.run_cases``), so a slow minute of a shared machine is spread over all configurations
instead of landing on one: rankings and errors compare like with like (docs/architecture.md, Measurement
rules). Every timed decode is checked for graph captures and new KV slots inside it (re-run when any, and
the counts stored), with the garbage collector off. Each measurement stores its 95% CI, the raw per-prompt,
per-repeat samples, every request's token arrivals, the graph state of every model after the run and,
with NVML, the joules of separate metered passes.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from specdec_tune.db import Database, RunSettings, add_measured_run, get_run, load_tree_traces
from specdec_tune.engine import DecodeConfig, LoadedModel, acceptance_per_position, check_compatible, graph_counters
from specdec_tune.engine import load_model
from specdec_tune.core.costs import check_price
from specdec_tune.engine import load_workload
from specdec_tune.core.errors import InputError
from specdec_tune.core.latency import LatencySamples, RequestLatency
from specdec_tune.profiler.describe import tokenizer_hash
from specdec_tune.profiler.energy import EnergySamples, open_energy_meter, operator_columns
from specdec_tune.profiler.measure_passes import run_cases
from specdec_tune.profiler.memory import peak_for_run
from specdec_tune.profiler.runs import NGRAM, SUFFIX, DraftSpec, encode_prompt
from specdec_tune.profiler.suffix_history import SuffixHistory
from specdec_tune.profiler.settings import Progress
from specdec_tune.profiler.threads import ThreadChoice, apply_threads, choose_threads
from specdec_tune.core.splits import check_split, check_split_prompts
from specdec_tune.core.stats import RateSamples, tokens_per_s_ci

DEFAULT_REPEATS = 3  # passes over the prompts on a CPU ...
DEFAULT_REPEATS_CUDA = 5  # ... and on a GPU, where a request lasts ~60 ms and one disturbed pass weighs more

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


def _warn_if_graphs_changed(target: LoadedModel, profiled: str | None, drafts: dict[str, LoadedModel] | None = None,
                            profiled_drafts: dict[str, str] | None = None) -> None:
    """A CUDA-graph state, read after the run, that differs from the profile's (a capture failed in one of
    them) times another forward than the prediction describes: say so, for the target and each draft model
    (engine/cuda_graphs.py). A profile older than the drafts' record has none to compare."""
    pairs = [("the target", target.cuda_graphs, profiled)]
    then = profiled_drafts or {}
    pairs += [(f"draft {name!r}", d.cuda_graphs, then.get(name)) for name, d in (drafts or {}).items()]
    for who, now, then in pairs:
        if then is not None and now is not None and now != then:
            print(f"warning: {who} ran with CUDA graphs {now!r}, the profile with {then!r}; the prediction "
                  "describes the other forward", file=sys.stderr)


def graph_states(target: LoadedModel, specs: dict[str | None, DraftSpec]) -> dict[str, Any]:
    """The CUDA-graph state of the target and of every draft model, read now (after the run: a capture can
    fail late), with their runners' counters; the stored ``cuda_graphs``."""
    drafts = {name: d.model for name, d in specs.items() if name is not None and d.model is not None}
    counters = {"target": target.model}
    counters.update({name: m.model for name, m in drafts.items()})
    return {"target": target.cuda_graphs, "drafts": {name: m.cuda_graphs for name, m in drafts.items()},
            "counters": {name: c.to_json() for name, m in counters.items() if (c := graph_counters(m)) is not None}}


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
    joules: list[float] = field(default_factory=list)  # [metered pass] energy (GPU with NVML only)
    joule_tokens: list[float] = field(default_factory=list)  # [metered pass] new tokens
    joule_seconds: list[float] = field(default_factory=list)  # [metered pass] wall seconds
    regions: Any = None  # profiler.clean.TimedRegions: its timed decodes' check


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
    repeats: int | None = None,
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
        repeats: decode the prompt set this many times; each prompt counts with its median time (None:
            :data:`DEFAULT_REPEATS`, :data:`DEFAULT_REPEATS_CUDA` for a run profiled on a GPU).
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
    settings = run.settings
    if repeats is None:
        repeats = DEFAULT_REPEATS_CUDA if settings.device == "cuda" else DEFAULT_REPEATS
    _check(run, items, repeats, temperature, gpu_price)
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
    warm = _metered(target, cases, wanted, ids, repeats, seed, progress or Progress())
    drafts = {name: d.model for name, d in specs.items() if name is not None and d.model is not None}
    _warn_if_graphs_changed(target, settings.cuda_graphs_used, drafts, settings.draft_cuda_graphs)
    _warn_if_unclean(cases)
    ctx = _Context(temperature, repeats, split, wanted, [pid in set(settings.prompt_ids) for pid in wanted],
                   [int(x.shape[0]) for x in ids], choice, gpu_price, warm, graph_states(target, specs))
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
             seed: int, progress: Progress) -> dict:
    """:func:`~specdec_tune.profiler.measure_passes.run_cases` with the device's energy meter open (none on a
    CPU); returns the warm-up's record."""
    meter = open_energy_meter(target.device)
    try:
        return run_cases(target, cases, wanted, ids, repeats, seed, progress, meter)
    finally:
        if meter is not None:
            meter.close()


def _warn_if_unclean(cases: list[_Case]) -> None:
    """Say so where a timed decode still captured a graph or allocated a slot after its re-runs."""
    unclean = sum(c.regions.unclean for c in cases if c.regions is not None)
    if unclean:
        print(f"warning: {unclean} timed decode(s) captured a CUDA graph or allocated a KV slot even after "
              "re-running; their times carry that one-off cost (timed_regions in the stored measurement)",
              file=sys.stderr)


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
    """The serving-history policy of suffix decoding for this measurement (:func:`measure_configs`): ``order`` on
    the run's own prompts (its split named or not: ``warm`` would hold each prompt's own response, which it
    would then draft), ``warm`` on any other split."""
    policy = policy or ("order" if split is None or split == run.settings.split else "warm")
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
    warm_up: dict | None = None  # what the warm-up did and cost (profiler.measure_passes.warm_cases)
    graphs: dict | None = None  # every model's CUDA-graph state after the run (graph_states)


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
    energy = EnergySamples(tuple(case.joules), tuple(case.joule_tokens), tuple(case.joule_seconds)) \
        if case.joules else None
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
        timed_regions={**case.regions.report(), "warm_up": ctx.warm_up} if case.regions is not None else None,
        cuda_graphs=ctx.graphs, decode_tokens_per_s=decode_only_rate(case.arrivals),
    )


def decode_only_rate(arrivals: list[list[RequestLatency]]) -> float | None:
    """Tokens/s after each request's first arrival (prefill and the first cycle left out): Σ_p median tokens
    ÷ Σ_p median seconds over the tokens that arrived after the first (None: no arrivals)."""
    if not arrivals or not all(arrivals):
        return None
    tokens = [[float(sum(a.tokens[1:])) for a in row] for row in arrivals]
    seconds = [[a.times[-1] - a.times[0] for a in row] for row in arrivals]
    sec = sum(statistics.median(s) for s in seconds)
    return sum(statistics.median(t) for t in tokens) / sec if sec > 0 else None


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
                "synthetic_acceptance": list(case.decode.synthetic_acceptance or []) or None,
                "timed_regions": result.timed_regions, "cuda_graphs": result.cuda_graphs,
                "decode_tokens_per_s": result.decode_tokens_per_s},
        measured_tokens_per_s=result.tokens_per_s, seconds=result.seconds, new_tokens=result.new_tokens,
        measured_tau=result.mean_tokens_per_cycle, ci=result.ci95, samples=result.samples.to_json(),
        operator=operator,
    )
    return result
