"""The profile's decoding stage: the plain baseline and every draft's passes, interleaved prompt by prompt.

A stage of :class:`~specdec_tune.profiler.session.ProfileSession` (as ``tree_profile`` is). Per prompt:
plain greedy decoding with the forwards hooked (in-loop T_ar, per-token overhead, the greedy output), then
per draft the greedy θ = 0, N = N_max pass (traces, per-cycle overhead, in-loop forward times), on the first
``overhead_prompts`` prompts the small-N overhead passes (they separate per-cycle from per-forward
overhead), and with a temperature the sampling pass. Interleaving puts every in-loop statistic (T_ar,
in-loop forwards, overhead) in the same stretch of time, so a slow minute of a shared machine does not skew
one draft. Samples and traces are stored after every prompt; what the per-draft summaries need comes back
as :class:`DecodePasses`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specdec_tune.db import TimingRow, TreeTraceRecord, add_timing_samples, add_traces, add_tree_traces
from specdec_tune.engine import DecodeConfig
from specdec_tune.profiler import acceptance as acc
from specdec_tune.profiler.overhead import ForwardRecorder, SequenceTimeline
from specdec_tune.profiler.runs import SUFFIX, DraftSpec, decode_once


@dataclass
class DecodePasses:
    """What the decoding stage recorded, for the summaries stored after it.

    Attributes:
        outputs: per prompt, ``[prompt + greedy output]`` token ids of plain decoding.
        infos: per prompt, its id, prompt tokens, new tokens and whether EOS ended it.
        base_seconds: wall seconds of the hooked plain baseline, all prompts.
        greedy, sampled: draft name -> per prompt, the greedy (θ = 0, N = N_max) and sampling traces.
        timelines: draft name -> every pass's timeline (greedy and small-N), for the in-loop medians.
    """

    outputs: list[torch.Tensor] = field(default_factory=list)
    infos: list[dict] = field(default_factory=list)
    base_seconds: float = 0.0
    greedy: dict[str, list] = field(default_factory=dict)
    sampled: dict[str, list] = field(default_factory=dict)
    timelines: dict[str, list] = field(default_factory=dict)


def _model_draft(spec: DraftSpec) -> torch.nn.Module | None:
    return spec.model.model if spec.model is not None else None


def overhead_rows(name: str | None, timeline: SequenceTimeline) -> list[TimingRow]:
    """Per-cycle overhead rows (k = L + 1) plus one per-sequence row (context_len = 0)."""
    rows = [
        TimingRow("overhead", k=c.drafted + 1, batch_size=1, context_len=max(c.context_len, 1),
                  seconds=max(c.overhead_s, 0.0), draft=name)
        for c in timeline.cycle_overheads()
    ]
    setup = max(timeline.first_cycle_s() + timeline.tail_s(), 0.0)
    rows.append(TimingRow("overhead", k=1, batch_size=1, context_len=0, seconds=setup, draft=name))
    return rows


def decode_passes(session: Any) -> DecodePasses:
    """Run the stage for a :class:`ProfileSession` (the module docstring); store as it goes."""
    s = session.settings
    small_ns = sorted({min(n, s.n_max) for n in s.overhead_ns} - {s.n_max}) or [1]
    few = max(1, min(s.overhead_prompts, len(session.ids)))
    sampling = s.temperature > 0
    session.progress.stage("decoding: baseline, acceptance, overhead", len(session.ids) * (
        1 + len(session.drafts) * (1 + sampling)) + few * len(small_ns) * len(session.drafts))
    eos = session.target.eos_token_id
    plain = DecodeConfig(max_new_tokens=s.max_new_tokens, eos_token_id=eos)
    synthetic = {"synthetic_acceptance": s.synthetic_acceptance, "synthetic_seed": s.seed}
    greedy = DecodeConfig(max_new_tokens=s.max_new_tokens, num_speculative_tokens=s.n_max, eos_token_id=eos,
                          **synthetic)
    small = [DecodeConfig(max_new_tokens=s.max_new_tokens, num_speculative_tokens=n, eos_token_id=eos, **synthetic)
             for n in small_ns]
    sample = DecodeConfig(max_new_tokens=s.max_new_tokens, num_speculative_tokens=s.n_max,
                          temperature=s.temperature or 1.0, eos_token_id=eos)
    out = DecodePasses(greedy={d.name: [] for d in session.drafts}, sampled={d.name: [] for d in session.drafts},
                       timelines={d.name: [] for d in session.drafts})
    recorder = ForwardRecorder(session.device)
    with recorder.attach(session.target.model, *(_model_draft(d) for d in session.drafts)):
        for i, (p, ids) in enumerate(zip(session.prompts, session.ids)):
            rows = _baseline_prompt(session, out, recorder, p.id, ids, plain)
            for spec in session.drafts:
                rows += _draft_passes(session, out, recorder, spec, (i, ids), greedy, small if i < few else [],
                                      sample if sampling else None)
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


def _draft_passes(session: Any, out: DecodePasses, recorder: ForwardRecorder, spec: DraftSpec,
                  prompt: tuple[int, torch.Tensor], greedy: DecodeConfig, small: list[DecodeConfig],
                  sample: DecodeConfig | None) -> list[TimingRow]:
    """One draft's passes over prompt ``prompt = (i, ids)``: greedy, the small-N ones, sampling; its traces
    are stored, its overhead rows returned."""
    s, name, (i, ids) = session.settings, spec.name, prompt
    trace = acc.record_trace(session.target, spec, ids, greedy, i, seed=s.seed + i, recorder=recorder)
    out.greedy[name].append(trace)
    out.timelines[name].append(trace.timeline)
    rows = overhead_rows(name, trace.timeline)
    add_traces(session.db, session.run_id, name, "greedy", 0.0, acc.trace_rows([trace]))
    session.progress.advance()
    for config in small:
        extra = acc.record_trace(session.target, spec, ids, config, i, seed=s.seed + i, recorder=recorder)
        out.timelines[name].append(extra.timeline)
        rows += overhead_rows(name, extra.timeline)
        session.progress.advance()
    if sample is not None:
        st = acc.record_trace(session.target, spec, ids, sample, i, seed=s.seed + i)
        out.sampled[name].append(st)
        add_traces(session.db, session.run_id, name, "sampling", s.temperature, acc.trace_rows([st]))
        session.progress.advance()
    return rows


def _baseline_prompt(session: Any, out: DecodePasses, recorder: ForwardRecorder, prompt_id: str, ids: torch.Tensor,
                     config: DecodeConfig) -> list[TimingRow]:
    """Plain greedy decoding of one prompt with hooks: in-loop T_ar, per-token overhead, output."""
    recorder.begin()
    result = decode_once(session.target, DraftSpec("none"), ids, config)
    timeline = recorder.finish()
    out.base_seconds += timeline.wall_s
    target = [f for f in timeline.forwards if f.role == "target"]
    rows = [TimingRow("autoregressive", 1, 1, f.context_len, f.seconds) for f in target[1:]]
    overhead, steps = timeline.autoregressive_overhead()
    if steps:
        rows.append(TimingRow("overhead", 1, 1, len(ids), max(overhead / steps, 0.0)))
    out.outputs.append(torch.cat([ids, torch.tensor(result.token_ids, dtype=ids.dtype, device=ids.device)]))
    out.infos.append({"id": prompt_id, "prompt_tokens": int(len(ids)), "new_tokens": result.new_tokens,
                      "eos": result.finished_by_eos})
    session.progress.advance()
    return rows
