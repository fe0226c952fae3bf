"""The profile's decoding stage: the plain baseline and every draft's passes, interleaved prompt by prompt.

A stage of :class:`~specdec_tune.profiler.session.ProfileSession` (as ``tree_profile`` is). Per prompt:
plain greedy decoding with the forwards hooked (in-loop T_ar, per-token overhead, the greedy output), then
per draft the greedy θ = 0, N = N_max pass (traces, per-cycle overhead, in-loop forward times), on the first
``overhead_prompts`` prompts the small-N overhead passes (they separate per-cycle from per-forward
overhead), on the first ``threshold_prompts`` the θ > 0 pass (a checked draft forward synchronises the host:
the model's θ term), and with a temperature the sampling pass. Interleaving puts every in-loop statistic (T_ar,
in-loop forwards, overhead) in the same stretch of time, so a slow minute of a shared machine does not skew
one draft. Samples and traces are stored after every prompt; what the per-draft summaries need comes back
as :class:`DecodePasses`.

Every decode is a timed region (its hooks time its forwards, and its wall time is the baseline's): with CUDA
graphs, an untimed warm-up first decodes the longest prompt of every slot length with every pass's settings
and makes every graph those decodes can replay (:func:`warm_classes`); each decode is then checked for a
graph or slot made inside and re-run when one was (:mod:`profiler.clean`), with the garbage collector off.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specdec_tune.core.limits import slot_length
from specdec_tune.core.pass_design import small_ns
from specdec_tune.db import TimingRow, TreeTraceRecord, add_timing_samples, add_traces, add_tree_traces
from specdec_tune.engine import DecodeConfig, decode_keys, graph_counters, prepare_graphs
from specdec_tune.profiler import acceptance as acc
from specdec_tune.profiler.clean import TimedRegions, quiet_gc
from specdec_tune.profiler.hook_tax import HookTaxCall, hook_tax_rows
from specdec_tune.profiler.overhead import ForwardRecorder, SequenceTimeline
from specdec_tune.profiler.runs import SUFFIX, DraftSpec, decode_once, new_pass, rerunnable


@dataclass
class DecodePasses:
    """What the decoding stage recorded, for the summaries stored after it.

    Attributes:
        outputs: per prompt, ``[prompt + greedy output]`` token ids of plain decoding.
        infos: per prompt, its id, prompt tokens, new tokens and whether EOS ended it.
        base_seconds: wall seconds of the hooked plain baseline, all prompts.
        greedy, sampled: draft name -> per prompt, the greedy (θ = 0, N = N_max) and sampling traces.
        timelines: draft name -> every pass's timeline (greedy and small-N), for the in-loop medians.
        threshold_timelines: draft name -> the θ > 0 pass's timelines (:func:`threshold_cycles`).
    """

    outputs: list[torch.Tensor] = field(default_factory=list)
    infos: list[dict] = field(default_factory=list)
    base_seconds: float = 0.0
    greedy: dict[str, list] = field(default_factory=dict)
    sampled: dict[str, list] = field(default_factory=dict)
    timelines: dict[str, list] = field(default_factory=dict)
    threshold_timelines: dict[str, list] = field(default_factory=dict)


def _model_draft(spec: DraftSpec) -> torch.nn.Module | None:
    return spec.model.model if spec.model is not None else None


def overhead_rows(name: str | None, timeline: SequenceTimeline) -> list[TimingRow]:
    """Per-cycle overhead rows (k = L + 1), one per-sequence row (context_len = 0) and the first cycle whole."""
    rows = [
        TimingRow("overhead", k=c.drafted + 1, batch_size=1, context_len=max(c.context_len, 1),
                  seconds=max(c.overhead_s, 0.0), draft=name)
        for c in timeline.cycle_overheads()
    ]
    setup = max(timeline.first_cycle_s() + timeline.tail_s(), 0.0)
    rows.append(TimingRow("overhead", k=1, batch_size=1, context_len=0, seconds=setup, draft=name))
    prefill = next((f for f in timeline.forwards if f.role == "target"), None)
    if timeline.cycles and prefill is not None:
        # The model charges the first cycle its own terms and this row the rest: its forwards overlap the
        # prefills' work (a GPU runs a long prefill while the host drafts), so they are not steady ones.
        first = timeline.cycle_ends[0] - timeline.start + timeline.tail_s()
        rows.append(TimingRow("first_cycle", k=timeline.cycles[0].drafted + 1, batch_size=1,
                              context_len=prefill.tokens + 1, seconds=first, draft=name))
    return rows


def plain_rows(timeline: SequenceTimeline, prompt_tokens: int) -> list[TimingRow]:
    """A hooked plain decode's rows: each in-loop target forward after the prefill (T_ar), the loop's overhead
    per token (context_len: the prompt's length) and the call up to its prefill's end (set-up and prefill)."""
    target = [f for f in timeline.forwards if f.role == "target"]
    rows = [TimingRow("autoregressive", 1, 1, f.context_len, f.seconds) for f in target[1:]]
    overhead, steps = timeline.autoregressive_overhead()
    if steps:
        rows.append(TimingRow("overhead", 1, 1, prompt_tokens, max(overhead / steps, 0.0)))
    if target:
        rows.append(TimingRow("first_cycle", 1, 1, prompt_tokens, target[0].end - timeline.start))
    return rows


def threshold_cycles(timelines: list[SequenceTimeline]) -> list[list[float]]:
    """The θ > 0 pass's cycles, each but a sequence's first: ``[F, L, wall seconds, context]`` (draft forwards,
    tokens proposed, the cycle's hooked wall time, the target's context), what the model's θ term is fitted to."""
    return [[c.draft_forwards, c.drafted, c.wall_s, c.context_len] for tl in timelines for c in tl.cycle_overheads()]


def first_cycles(timelines: list[SequenceTimeline]) -> list[list[float]]:
    """Each decode's first cycle whole with its tail: ``[F, L, hooked seconds, prompt tokens]`` (as the
    ``first_cycle`` rows, with F: at θ > 0 a cut draft runs one forward more than it proposes)."""
    out = []
    for tl in timelines:
        prefill = next((f for f in tl.forwards if f.role == "target"), None)
        if tl.cycles and prefill is not None:
            first = tl.cycles[0]
            wall = tl.cycle_ends[0] - tl.start + tl.tail_s()
            out.append([first.draft_forwards, first.drafted, wall, prefill.tokens + 1])
    return out


@dataclass(frozen=True)
class _Designs:
    """The decode configurations of the stage's passes (plain, θ = 0 at N_max and the small N, the θ > 0 pass,
    sampling)."""

    plain: DecodeConfig
    greedy: DecodeConfig
    small: list[DecodeConfig]
    threshold: DecodeConfig | None
    sample: DecodeConfig | None


def _designs(session: Any) -> _Designs:
    s, eos = session.settings, session.target.eos_token_id
    synthetic = {"synthetic_acceptance": s.synthetic_acceptance, "synthetic_seed": s.seed}
    spec = lambda n, **kw: DecodeConfig(max_new_tokens=s.max_new_tokens, num_speculative_tokens=n,  # noqa: E731
                                        eos_token_id=eos, **kw)
    # The θ pass runs where θ > 0 can be predicted: a model draft's greedy traces (not synthetic acceptance).
    theta = s.threshold_prompts > 0 and not s.synthetic_acceptance
    return _Designs(plain=DecodeConfig(max_new_tokens=s.max_new_tokens, eos_token_id=eos),
                    greedy=spec(s.n_max, **synthetic),
                    small=[spec(n, **synthetic) for n in small_ns(s.n_max, s.overhead_ns)],
                    threshold=spec(min(s.threshold_pass_n, s.n_max), threshold=s.threshold_pass) if theta else None,
                    sample=spec(s.n_max, temperature=s.temperature) if s.temperature > 0 else None)


def _prompts(session: Any, count: int) -> int:
    return max(0, min(count, len(session.ids)))


def decode_passes(session: Any) -> DecodePasses:
    """Run the stage for a :class:`ProfileSession` (the module docstring); store as it goes."""
    s, d = session.settings, _designs(session)
    few, theta = max(1, _prompts(session, s.overhead_prompts)), _prompts(session, s.threshold_prompts)
    models = sum(spec.model is not None for spec in session.drafts)
    session.progress.stage("decoding: baseline, acceptance, overhead", len(session.ids) * (
        1 + len(session.drafts) * (1 + (d.sample is not None))) + few * len(d.small) * len(session.drafts)
        + (theta * models if d.threshold else 0))
    out = DecodePasses(greedy={x.name: [] for x in session.drafts}, sampled={x.name: [] for x in session.drafts},
                       timelines={x.name: [] for x in session.drafts},
                       threshold_timelines={x.name: [] for x in session.drafts})
    if getattr(session, "regions", None) is None:  # a session not started by run(): checked all the same
        session.regions = TimedRegions({"target": session.target.model,
                                        **{x.name: x.model.model for x in session.drafts if x.model is not None}})
    warm_classes(session, [d.plain, d.greedy, *d.small] + [c for c in (d.threshold, d.sample) if c is not None])
    for x in session.drafts:  # suffix decoding's passes start from an empty history (warm_classes decoded)
        new_pass(x)
    recorder = ForwardRecorder(session.device)
    with recorder.attach(session.target.model, *(_model_draft(x) for x in session.drafts)), quiet_gc():
        for i, (p, ids) in enumerate(zip(session.prompts, session.ids)):
            rows = _baseline_prompt(session, out, recorder, p.id, ids, d.plain)
            for spec in session.drafts:
                mine = replace(d, small=d.small if i < few else [],
                               threshold=d.threshold if i < theta and spec.model is not None else None)
                rows += _draft_passes(session, out, recorder, spec, (i, ids), mine)
            add_timing_samples(session.db, session.run_id, rows + session.probe_rows())
    _store_sequences(session, out)
    return out


def _store_sequences(session: Any, out: DecodePasses) -> None:
    """Suffix decoding's acceptance depends on the earlier requests' outputs, so its model replays the
    profiled prompts in order: store each prompt's ids and greedy output (``tree_traces`` kind ``sequences``)."""
    if not any(d.kind == SUFFIX for d in session.drafts):
        return
    rows = [TreeTraceRecord("sequences", i, 0.0, {"prompt": ids.tolist(), "output": full[len(ids):].tolist()})
            for i, (ids, full) in enumerate(zip(session.ids, out.outputs))]
    add_tree_traces(session.db, session.run_id, SUFFIX, rows)


def warm_classes(session: Any, configs: list[DecodeConfig]) -> int:
    """With CUDA graphs: per pass setting, one untimed decode of the longest prompt of each slot length its
    prompts need (a cache takes a slot of its own length, ``engine.cuda_graphs``), plain decoding and every
    drafter, then every graph a decode at N_max can replay made on those slots; returns how many graphs were
    made. Eager models: nothing (a CPU pays no capture or slot)."""
    models = [session.target.model] + [d.model.model for d in session.drafts if d.model is not None]
    if all(graph_counters(m) is None for m in models):
        return 0
    for i, config in enumerate(configs):
        room = config.plain_room if i == 0 else config.room  # configs[0] is plain decoding
        longest: dict[int, Any] = {}
        for ids in session.ids:
            cls = slot_length(len(ids) + room)
            if cls not in longest or len(ids) > len(longest[cls]):
                longest[cls] = ids
        for ids in longest.values():
            for spec in [DraftSpec("none")] if i == 0 else session.drafts:
                decode_once(session.target, spec, ids, config, seed=session.settings.seed)
    n = session.settings.n_max
    made = prepare_graphs(session.target.model, decode_keys(n, draft=False))
    return made + sum(prepare_graphs(m, decode_keys(n, draft=True)) for m in models[1:])


def _fresh(spec: DraftSpec) -> None:
    """Suffix decoding's history starts again before a hook-tax decode: its unhooked and hooked decodes of a
    prompt draft alike (else the second would draft from the first's response)."""
    new_pass(spec)


def hook_tax(session: Any) -> None:
    """The hooks' own cost (``profiler.hook_tax``): every pass design of the stage, on the first
    ``hook_tax_prompts`` prompts, unhooked and hooked; stored as ``hook_tax`` rows."""
    s, d = session.settings, _designs(session)
    calls = []
    for ids in session.ids[:_prompts(session, s.hook_tax_prompts)]:
        calls.append(HookTaxCall(None, 0, 0.0, lambda on_cycle, ids=ids: decode_once(session.target, DraftSpec("none"),
                                                                                     ids, d.plain)))
        for spec in session.drafts:
            designs = [d.greedy, *d.small] + ([d.threshold] if d.threshold and spec.model is not None else [])
            calls += [HookTaxCall(spec.name, c.spec.num_speculative_tokens, c.spec.threshold,
                                  lambda on_cycle, ids=ids, c=c, spec=spec: _fresh(spec) or decode_once(
                                      session.target, spec, ids, c, seed=s.seed, on_cycle=on_cycle))
                      for c in designs]
    if not calls:
        return
    session.progress.stage("hooks' cost: each pass unhooked and hooked", 1)
    recorder = ForwardRecorder(session.device)
    models = [session.target.model, *(m for m in (_model_draft(x) for x in session.drafts) if m is not None)]
    add_timing_samples(session.db, session.run_id, hook_tax_rows(recorder, models, calls, session.device))
    session.progress.advance()


def _draft_passes(session: Any, out: DecodePasses, recorder: ForwardRecorder, spec: DraftSpec,
                  prompt: tuple[int, torch.Tensor], d: _Designs) -> list[TimingRow]:
    """One draft's passes over prompt ``prompt = (i, ids)``: greedy, the small-N ones, θ > 0, sampling; its
    traces are stored, its overhead rows returned."""
    s, name, (i, ids) = session.settings, spec.name, prompt
    timed = session.regions.run

    def traced(config: DecodeConfig, hooked: bool = True):
        return timed(rerunnable(spec, config, lambda: acc.record_trace(session.target, spec, ids, config, i, seed=s.seed + i,
                                                                        recorder=recorder if hooked else None)),
                     f"{name} N={config.spec.num_speculative_tokens} prompt {i}")

    trace = traced(d.greedy)
    out.greedy[name].append(trace)
    out.timelines[name].append(trace.timeline)
    rows = overhead_rows(name, trace.timeline)
    add_traces(session.db, session.run_id, name, "greedy", 0.0, acc.trace_rows([trace]))
    session.progress.advance()
    for config in d.small:
        extra = traced(config)
        out.timelines[name].append(extra.timeline)
        rows += overhead_rows(name, extra.timeline)
        session.progress.advance()
    if d.threshold is not None:  # kept apart: its forwards each end in a synchronisation
        checked = traced(d.threshold)
        out.threshold_timelines[name].append(checked.timeline)
        session.progress.advance()
    if d.sample is not None:
        st = traced(d.sample, hooked=False)
        out.sampled[name].append(st)
        add_traces(session.db, session.run_id, name, "sampling", s.temperature, acc.trace_rows([st]))
        session.progress.advance()
    return rows


def _baseline_prompt(session: Any, out: DecodePasses, recorder: ForwardRecorder, prompt_id: str, ids: torch.Tensor,
                     config: DecodeConfig) -> list[TimingRow]:
    """Plain greedy decoding of one prompt with hooks: in-loop T_ar, per-token overhead, output."""
    def hooked():
        recorder.begin()
        decoded = decode_once(session.target, DraftSpec("none"), ids, config)
        return decoded, recorder.finish()

    result, timeline = session.regions.run(hooked, f"plain prompt {prompt_id}")
    out.base_seconds += timeline.wall_s
    rows = plain_rows(timeline, len(ids))
    out.outputs.append(torch.cat([ids, torch.tensor(result.token_ids, dtype=ids.dtype, device=ids.device)]))
    out.infos.append({"id": prompt_id, "prompt_tokens": int(len(ids)), "new_tokens": result.new_tokens,
                      "eos": result.finished_by_eos})
    session.progress.advance()
    return rows
