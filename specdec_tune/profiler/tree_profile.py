"""The profile's token-tree and staged-drafting stage (``profile --trees``; docs/model.md, Token trees
and staged drafting).

Recorded per model draft, stored in ``tree_traces`` as it goes:

- ``ranks`` (greedy): one teacher-forced draft forward over each prompt's greedy output gives, at
  every output position, the rank of the target's token in the draft's distribution (``RANKS`` = not
  among the draft's best ``RANKS``) and the draft's ``TOP`` highest probabilities. Greedy tree cycles
  are simulated exactly from the ranks (the accepted path's context is always the target's text).
- ``siblings`` (with ``--temperature``): teacher-forced target and draft over the sampled outputs;
  per position β_1..β_M, the acceptance of the m-th of M i.i.d. drafts after the ones before it were
  rejected (recursive residuals, ``engine.tree_verify``), and ``point``, the target's mass on the
  draft's top-1..K tokens (deterministic siblings).
- ``staged``: the first ``overhead_prompts`` prompts decoded by the draft speculated by n-gram lookup
  and by every smaller model draft of the run (``engine.staged``), greedily and (with a temperature)
  sampling: tokens proposed, draft-model forwards, tokens they carried, inner forwards, engine time.
- ``overhead``: on the first prompts, tree decoding (greedy, and with a temperature sampling) with a few
  trees (``OVERHEAD_TREES``) with
  the forwards hooked: per cycle the engine's own time (wall minus forwards), nodes and draft forwards
  (a tree cycle builds masks, verifies and compacts caches: more bookkeeping than a chain's), and the
  in-loop time of every deeper-depth draft forward by its width.
- timings ``draft_width``: the draft's forward over w = 2..8 tokens at the typical context, interleaved
  rounds like every micro-benchmark; a tree drafts one depth per forward.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdec_tune.db import TreeTraceRecord, add_timing_samples, add_tree_traces
from specdec_tune.engine import DecodeConfig, ModelDrafter, NgramDrafter, StagedDrafter, build_tree_drafter
from specdec_tune.engine import probs_from_logits, speculative, tree_speculative
from specdec_tune.profiler import microbench as mb
from specdec_tune.profiler.head_profile import is_head, teacher_view
from specdec_tune.profiler.overhead import ForwardRecorder
from specdec_tune.profiler.runs import DraftSpec
from specdec_tune.core.trees import parse_tree

RANKS = 8
TOP = 8
SIBLINGS = 4
WIDTHS = tuple(range(2, 9))
INNER_N = 3  # tokens the inner drafter proposes per inner cycle
STAGED_N = 8  # N of the staged pass (its per-token rates barely depend on N)
# Trees whose cycles are timed for the engine's own per-cycle time (static and dynamic kinds, 6-12 nodes).
OVERHEAD_TREES = (("chains:2", 3), ("sequoia:12", 6), ("eagle:2:8", 4))
OVERHEAD_PROMPTS = 4


def _logits(model: torch.nn.Module, seq: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits ``[T - 1, vocab]`` (row i predicts token i + 1), no cache."""
    return model(input_ids=seq[None, :-1], use_cache=False).logits[0].float()


def rank_rows(draft: torch.nn.Module, sequences: Sequence[torch.Tensor], prompt_lens: Sequence[int]) -> list[dict[str, Any]]:
    """Per prompt: ranks of the target's tokens in the draft's distribution and its top probabilities."""
    out = []
    with torch.inference_mode():
        for seq, plen in zip(sequences, prompt_lens):
            rows = _logits(draft, seq)[plen - 1:]  # [M, vocab]: the distributions before each output token
            vocab = rows.shape[-1]
            tokens = seq[plen:].clamp_max(vocab - 1)
            picked = rows.gather(1, tokens[:, None])
            ranks = (rows > picked).sum(dim=1).clamp_max(RANKS)
            top = torch.softmax(rows, dim=-1).topk(TOP, dim=-1).values
            out.append({"ranks": ranks.tolist(), "top": [[round(x, 6) for x in r] for r in top.tolist()]})
    return out


def sibling_rows(target: torch.nn.Module, draft: torch.nn.Module, sequences: Sequence[torch.Tensor],
                 prompt_lens: Sequence[int], temperature: float) -> list[dict[str, Any]]:
    """Per prompt: β_1..β_M of i.i.d. siblings and the target's mass on the draft's top-1..K tokens."""
    out = []
    with torch.inference_mode():
        for seq, plen in zip(sequences, prompt_lens):
            p_logits, q_logits = _logits(target, seq)[plen - 1:], _logits(draft, seq)[plen - 1:]
            vocab = min(p_logits.shape[-1], q_logits.shape[-1])
            p = probs_from_logits(p_logits[:, :vocab], temperature)
            q = probs_from_logits(q_logits[:, :vocab], temperature)
            betas, r = [], p
            for _ in range(SIBLINGS):
                betas.append(torch.minimum(r, q).sum(dim=-1))
                rest = (r - q).clamp_min(0)
                total = rest.sum(dim=-1, keepdim=True)
                r = torch.where(total > 0, rest / total.clamp_min(1e-30), r)
            iid = torch.stack(betas, dim=1).clamp(0, 1)  # [M, SIBLINGS]
            point = p.gather(1, q.topk(TOP, dim=-1).indices).cumsum(dim=1).clamp(0, 1)  # [M, TOP]
            out.append({"iid": [[round(x, 6) for x in row] for row in iid.tolist()],
                        "point": [[round(x, 6) for x in row] for row in point.tolist()]})
    return out


def staged_pass(target: torch.nn.Module, draft: torch.nn.Module, inner: DraftSpec, prompts: Sequence[torch.Tensor],
                max_new_tokens: int, eos: int | None, temperature: float = 0.0, seed: int = 0) -> list[dict[str, Any]]:
    """Per prompt: what the draft speculated by ``inner`` cost while decoding (N = STAGED_N; greedy, or
    sampling at ``temperature``, where the inner acceptance and the verdicts differ), with every forward
    hooked: counts, and per cycle [drafted, engine seconds outside the forwards]."""
    config = DecodeConfig(max_new_tokens=max_new_tokens, num_speculative_tokens=STAGED_N, eos_token_id=eos,
                          temperature=temperature)
    gen = torch.Generator(device=next(target.parameters()).device).manual_seed(seed)
    inner_model = inner.model.model if inner.model is not None else None
    recorder = ForwardRecorder(next(target.parameters()).device)
    out = []
    with recorder.attach(target, draft, inner_model), torch.inference_mode():
        for ids in prompts:
            max_len = ids.shape[0] + max_new_tokens + STAGED_N + 2
            inner_drafter = NgramDrafter() if inner_model is None else ModelDrafter(
                inner_model, max_len + INNER_N + 2, temperature=temperature, generator=gen)
            staged = StagedDrafter(draft, inner_drafter, INNER_N, max_len, temperature=temperature, generator=gen)
            counts = {"inner": inner.name, "inner_n": INNER_N, "tokens": 0, "draft_forwards": 0, "fed": 0,
                      "inner_forwards": 0}

            def on_cycle(stats, counts=counts, staged=staged) -> None:
                recorder.on_cycle(stats)
                counts["tokens"] += stats.drafted
                counts["draft_forwards"] += staged.forwards
                counts["fed"] += staged.fed_tokens
                counts["inner_forwards"] += staged.inner_forwards

            recorder.begin()
            speculative(target, staged, ids, config, gen, on_cycle=on_cycle)
            counts["cycles"] = [[c.drafted, round(c.overhead_s, 7)] for c in recorder.finish().cycle_overheads()]
            out.append(counts)
    return out


def overhead_pass(target: torch.nn.Module, draft: torch.nn.Module, prompts: Sequence[torch.Tensor],
                  max_new_tokens: int, eos: int | None, rank_accept: Sequence[float],
                  temperature: float = 0.0, seed: int = 0) -> list[dict[str, Any]]:
    """Per prompt: the engine's own time per tree cycle (wall time minus the hooked forwards) while
    decoding with each of ``OVERHEAD_TREES`` (greedy, or sampling at ``temperature``: the sampled
    verdict walks the siblings on the host): rows [dynamic, nodes, draft forwards, seconds]."""
    recorder = ForwardRecorder(next(target.parameters()).device)
    gen = torch.Generator(device=next(target.parameters()).device).manual_seed(seed)
    out = []
    with recorder.attach(target, draft), torch.inference_mode():
        for ids in prompts:
            rows, widths = [], []
            for text, depth in OVERHEAD_TREES:
                spec = parse_tree(text)
                config = DecodeConfig(max_new_tokens=max_new_tokens, num_speculative_tokens=depth, eos_token_id=eos,
                                      temperature=temperature)
                drafter = build_tree_drafter(draft, ids.shape[0] + max_new_tokens + spec.nodes(depth) + 2, spec,
                                             rank_accept=rank_accept, temperature=temperature, generator=gen)
                recorder.begin()
                tree_speculative(target, drafter, ids, config, gen, on_cycle=recorder.on_cycle)
                timeline = recorder.finish()
                rows += [[int(spec.kind == "eagle"), c.drafted, c.draft_forwards, round(c.overhead_s, 7)]
                         for c in timeline.cycle_overheads()]
                widths += _depth_forwards(timeline)
            out.append({"cycles": rows, "draft_widths": widths})
    return out


def _depth_forwards(timeline) -> list[list[float]]:
    """[k, seconds] of the draft forwards of a tree's deeper depths (each cycle's first draft forward,
    the catch-up and the root's children, is T_s's and left out)."""
    out, seen = [], set()
    ends = timeline.cycle_ends
    for f in (f for f in timeline.forwards if f.role == "draft"):
        cycle = sum(e <= f.start for e in ends)
        if cycle in seen:
            out.append([f.tokens, round(f.seconds, 7)])
        seen.add(cycle)
    return out


def _rank_accept(rows: Sequence[TreeTraceRecord]) -> tuple[float, ...]:
    """P(rank = r) over the ``ranks`` rows (shapes the Sequoia tree of the overhead pass)."""
    counts, total = [0] * RANKS, 0
    for r in rows:
        for rank in r.data.get("ranks", ()):
            total += 1
            if rank < RANKS:
                counts[rank] += 1
    return tuple(c / total for c in counts) if total else (1.0,)


def _inners(drafts: Sequence[DraftSpec], spec: DraftSpec) -> list[DraftSpec]:
    """Inner drafters for ``spec``: n-gram lookup and every model draft of the run smaller than it (none for
    an EAGLE-3 head, whose steps read features no inner drafter has; nor is a head an inner drafter)."""
    if is_head(spec.model):
        return []
    size = spec.model.num_parameters
    smaller = [d for d in drafts if d.model is not None and not is_head(d.model) and d.model.num_parameters < size]
    return [DraftSpec("ngram"), *smaller]


def tree_passes(session) -> None:
    """The ``--trees`` stage of a :class:`~specdec_tune.profiler.session.ProfileSession` (module docstring)."""
    s, db, run_id = session.settings, session.db, session.run_id
    models = [d for d in session.drafts if d.model is not None]
    if not models:
        return
    cases = [c for d in models for c in mb.cached_cases(d.model.model, "draft_width",
             [(session.typical_context, w) for w in WIDTHS], source=session.source_ids, draft=d.model.name,
             device=session.device)]
    few = max(1, min(s.overhead_prompts, len(session.ids)))
    inner_count = sum(len(_inners(session.drafts, d)) for d in models)
    session.progress.stage("trees: draft widths, ranks, staged drafting", s.warmup + s.repeats + len(models) + inner_count)
    timings = mb.run_interleaved(cases, warmup=s.warmup, repeats=s.repeats, device=session.device, seed=s.seed,
                                 advance=session.progress.advance)
    add_timing_samples(db, run_id, [r for t in timings for r in t.rows()])
    prompt_lens = [int(i.shape[0]) for i in session.ids]
    for spec in models:
        name, model = spec.model.name, spec.model.model
        view = teacher_view(session.target, spec.model)  # a head's first step at every position
        rows = [TreeTraceRecord("ranks", i, 0.0, d) for i, d in enumerate(rank_rows(view, session._outputs, prompt_lens))]
        sampled = session._sampled.get(spec.name) or []
        if s.temperature > 0 and sampled:
            seqs = [torch.cat([ids, torch.tensor(t.result.token_ids, dtype=ids.dtype, device=ids.device)])
                    for ids, t in zip(session.ids, sampled)]
            rows += [TreeTraceRecord("siblings", i, s.temperature, d)
                     for i, d in enumerate(sibling_rows(session.target.model, view, seqs, prompt_lens, s.temperature))]
        temps = (0.0, s.temperature) if s.temperature > 0 else (0.0,)
        for t in temps:  # greedy, and the profile's sampling temperature: their verdicts cost differently
            docs = overhead_pass(session.target.model, model, session.ids[:min(few, OVERHEAD_PROMPTS)],
                                 s.max_new_tokens, session.target.eos_token_id, _rank_accept(rows), t, s.seed)
            rows += [TreeTraceRecord("overhead", i, t, d) for i, d in enumerate(docs)]
        add_tree_traces(db, run_id, name, rows)
        session.progress.advance()
        for inner in _inners(session.drafts, spec):
            for t in temps:
                docs = staged_pass(session.target.model, model, inner, session.ids[:few], s.max_new_tokens,
                                   session.target.eos_token_id, t, s.seed)
                add_tree_traces(db, run_id, name, [TreeTraceRecord("staged", i, t, d) for i, d in enumerate(docs)])
            session.progress.advance()
