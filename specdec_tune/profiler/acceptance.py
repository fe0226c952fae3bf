"""Acceptance profiling: per-cycle traces from real speculative decoding, and teacher-forced agreement.

Traces (docs/architecture.md, The throughput model): speculative decoding runs on the workload with
θ = 0 and N = N_max; each cycle records the draft's confidence at every drafted position
(``Draft.confidence``: the top draft probability there, the number θ is compared with, in sampling mode
too, so a replay's cut at the first confidence below θ is the engine's stop) and the accepted prefix
length. The threshold model replays these under any (N, θ). Aggregates per drafted position: attempts
(cycles that drafted position i with 1..i-1 accepted), accepts, α_i = accepts/attempts (conditional) and
β_i = accepts/cycles (vLLM's unconditional rate), and accept counts per confidence bin (what a threshold
cuts).

Teacher-forced pass (docs/architecture.md, The throughput model): both models read the same text
(prompt + generated tokens) in one forward each; greedy agreement = P(argmax p == argmax q), and
1 - E[TV(p, q)] = E[Σ min(p, q)] is the expected sampling acceptance per token (Leviathan et al. 2023).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdec_tune.db import TraceRow
from specdec_tune.engine import CycleStats, DecodeConfig, GenerationResult, LoadedModel
from specdec_tune.engine import probs_from_logits
from specdec_tune.profiler.overhead import ForwardRecorder, SequenceTimeline
from specdec_tune.profiler.runs import DraftSpec, decode_once

CONFIDENCE_EDGES = tuple(i / 10 for i in range(11))  # bins [0, .1), ..., [.9, 1.0]


@dataclass
class PromptTrace:
    """The cycles of one prompt decoded with θ = 0, N = N_max (and its hooked timeline, if any)."""

    prompt_index: int
    result: GenerationResult
    timeline: SequenceTimeline | None = None

    @property
    def cycles(self) -> list[CycleStats]:
        return self.result.cycles


@dataclass
class AcceptanceSummary:
    """Per-position acceptance aggregated over cycles (lists are ``[N_max]``)."""

    cycles: int
    attempts: list[int]
    accepts: list[int]
    alpha: list[float | None]
    beta: list[float | None]
    confidence_bins: dict = field(default_factory=dict)

    def mean_tokens_per_cycle(self) -> float | None:
        """E[τ] = 1 + Σ β_i over the recorded cycles (accepted + 1 per cycle)."""
        if not self.cycles:
            return None
        return 1.0 + sum(self.accepts) / self.cycles


def summarize(cycles: Sequence[CycleStats], n_max: int) -> AcceptanceSummary:
    """Aggregate cycles into per-position attempts/accepts, α, β and confidence-bin counts.

    A position counts as attempted when it was drafted and every earlier position was accepted
    (accepted tokens form a prefix), so α_i is the conditional rate the throughput model uses.
    """
    attempts, accepts = [0] * n_max, [0] * n_max
    nbins = len(CONFIDENCE_EDGES) - 1
    bin_drafted, bin_accepted = [0] * nbins, [0] * nbins
    for c in cycles:
        for i, (conf, ok) in enumerate(zip(c.confidences[:n_max], c.outcomes[:n_max])):
            attempts[i] += 1
            b = min(int(conf * nbins), nbins - 1)
            bin_drafted[b] += 1
            if not ok:
                break
            accepts[i] += 1
            bin_accepted[b] += 1
    n = len(cycles)
    alpha = [a / t if t else None for a, t in zip(accepts, attempts)]
    beta = [a / n if n else None for a in accepts]
    bins = {"edges": list(CONFIDENCE_EDGES), "drafted": bin_drafted, "accepted": bin_accepted}
    return AcceptanceSummary(n, attempts, accepts, alpha, beta, bins)


def trace_rows(traces: Sequence[PromptTrace]) -> list[TraceRow]:
    """Database rows, one per cycle, in decode order (cycle_index counts within a prompt)."""
    return [
        TraceRow(cycle_index=i, confidences=tuple(c.confidences), num_accepted=c.accepted, prompt_index=t.prompt_index,
                 token_probs=tuple(c.token_probs) if len(c.token_probs) == len(c.confidences) else None,
                 target_probs=tuple(c.target_probs) if c.target_probs and len(c.target_probs) == len(c.confidences) else None)
        for t in traces
        for i, c in enumerate(t.cycles)
    ]


def record_traces(
    target: LoadedModel,
    draft: DraftSpec,
    prompts: Sequence[torch.Tensor],
    config: DecodeConfig,
    *,
    seed: int = 0,
    recorder: ForwardRecorder | None = None,
    on_prompt: Callable[[PromptTrace], None] | None = None,
) -> list[PromptTrace]:
    """Decode every prompt speculatively and keep its cycles (the engine records them).

    Args:
        target: the target model.
        draft: the drafter to profile.
        prompts: ``[T]`` token ids per prompt.
        config: normally θ = 0 and N = N_max; temperature 0 (greedy) or > 0 (sampling).
        seed: sampling seed of prompt 0 (prompt i uses seed + i).
        recorder: hooks already attached to both models; gives each prompt its timeline.
        on_prompt: called after each prompt (progress, storing as we go).
    """
    out: list[PromptTrace] = []
    for i, ids in enumerate(prompts):
        trace = record_trace(target, draft, ids, config, i, seed=seed + i, recorder=recorder)
        out.append(trace)
        if on_prompt is not None:
            on_prompt(trace)
    return out


def record_trace(
    target: LoadedModel,
    draft: DraftSpec,
    ids: torch.Tensor,
    config: DecodeConfig,
    prompt_index: int,
    *,
    seed: int = 0,
    recorder: ForwardRecorder | None = None,
) -> PromptTrace:
    """Decode one prompt (``[T]``) speculatively; keep its cycles and, with a recorder, its timeline."""
    on_cycle = None
    if recorder is not None:
        recorder.begin()
        on_cycle = recorder.on_cycle
    result = decode_once(target, draft, ids, config, seed=seed, on_cycle=on_cycle)
    return PromptTrace(prompt_index, result, recorder.finish() if recorder is not None else None)


def bonus_continuations(
    draft: torch.nn.Module, traces: Sequence[PromptTrace], prompts: Sequence[torch.Tensor]
) -> list[tuple[int, int, float, bool]]:
    """The draft's greedy guess at the bonus position of every fully accepted cycle.

    A cycle that accepted all L drafted tokens ends with the target's bonus token, which the draft
    never predicted. One teacher-forced draft forward over the decoded text gives that prediction
    (its confidence and whether it equals the bonus token), so a greedy roll-out can be followed
    past the cycle's end (``tuner.model``'s ``position_traces``). The sequence's last cycle is
    skipped (nothing follows it).

    Returns:
        (prompt_index, cycle_index, confidence, accepted) per fully accepted, non-final cycle.
    """
    out: list[tuple[int, int, float, bool]] = []
    with torch.inference_mode():
        for trace, ids in zip(traces, prompts):
            cycles = trace.cycles
            wanted = [c for c, s in enumerate(cycles[:-1]) if s.drafted and s.accepted == s.drafted]
            if not wanted:
                continue
            tokens = torch.tensor(trace.result.token_ids, dtype=ids.dtype, device=ids.device)
            seq = torch.cat([ids, tokens])
            logits = draft(input_ids=seq[None, :-1], use_cache=False).logits[0]  # [T-1, vocab]
            starts, j = [], 0
            for s in cycles:
                starts.append(j)
                j += s.emitted
            for c in wanted:
                pos = ids.shape[0] + starts[c] + cycles[c].drafted  # index of the bonus token in seq
                row = logits[pos - 1].float()
                guess = int(row.argmax())
                conf = float(torch.exp(row[guess] - torch.logsumexp(row, dim=-1)))
                out.append((trace.prompt_index, c, conf, guess == int(seq[pos])))
    return out


@dataclass(frozen=True)
class TeacherForced:
    """Agreement of target p and draft q on the same text (one forward of each model).

    Attributes:
        tokens: positions compared.
        greedy_agreement: fraction of positions where argmax p == argmax q.
        one_minus_tv: mean Σ_x min(p(x), q(x)) at ``temperature``, the expected sampling acceptance.
        temperature: softmax temperature of the TV comparison.
    """

    tokens: int
    greedy_agreement: float
    one_minus_tv: float
    temperature: float


def teacher_forced(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    sequences: Sequence[torch.Tensor],
    temperature: float = 1.0,
) -> TeacherForced:
    """Compare p and q position by position over ``sequences`` (``[T]`` each: prompt + generated).

    Each model reads each sequence once (no cache); positions 0..T-2 predict tokens 1..T-1.
    """
    if temperature <= 0:
        raise ValueError(f"teacher-forced TV needs a temperature > 0, got {temperature}")
    agree = 0
    overlap = 0.0
    count = 0
    with torch.inference_mode():
        for ids in sequences:
            if ids.numel() < 2:
                continue
            x = ids[None, :-1]
            p_logits = target(input_ids=x, use_cache=False).logits[0]  # [T-1, vocab]
            q_logits = draft(input_ids=x, use_cache=False).logits[0]  # [T-1, vocab]
            vocab = min(p_logits.shape[-1], q_logits.shape[-1])  # padded embedding rows never win
            p_logits, q_logits = p_logits[:, :vocab], q_logits[:, :vocab]
            agree += int((p_logits.argmax(-1) == q_logits.argmax(-1)).sum())
            p = probs_from_logits(p_logits, temperature)
            q = probs_from_logits(q_logits, temperature)
            overlap += float(torch.minimum(p, q).sum())
            count += p.shape[0]
    if count == 0:
        return TeacherForced(0, float("nan"), float("nan"), temperature)
    return TeacherForced(count, agree / count, overlap / count, temperature)
