"""Calibrate the throughput model to a server and predict configurations for it .

Glue between the server's measurements (``profiler.ServerMeasurement``), the engine
profile's acceptance (E[τ] and E[L] per configuration, from the run's traces) and the pure
calibration math (:mod:`specdec_tune.tuner.servers._time_model`).
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from specdec_tune.tuner.model import NGRAM, Candidate, Evaluator, predict_config, spec_config
from specdec_tune.tuner.servers._time_model import (
    MODEL,
    NGRAM_KIND,
    PLAIN,
    ServerModel,
    ServerPoint,
    calibrate,
    context_tokens,
)

if TYPE_CHECKING:
    from specdec_tune.profiler import ServerMeasurement

__all__ = ["ServerPrediction", "acceptance_terms", "calibrate_from", "group_points_of", "kind_of", "mean_prompt_tokens",
           "points_of", "predict_server"]


def kind_of(drafter: str, n: int = 1) -> str:
    """``plain``, ``ngram`` or ``model`` for a drafter name (``none`` or N = 0 is plain)."""
    if drafter in ("none", "", None) or n == 0:
        return PLAIN
    return NGRAM_KIND if drafter == NGRAM else MODEL


def points_of(m: ServerMeasurement) -> list[ServerPoint]:
    """The measurement as one calibration point: its *mean group*, aggregated the way its measured
    tokens/s is (each group's median seconds over the repeats, summed over groups), so the fitted
    time terms reproduce that number and a group's heavy-tailed repeats (a shared machine's slow
    seconds) weigh as they do in it, not once per group. Counts come from vLLM's counters.

    A draft model drafts at every decode step, so vLLM's ``num_drafts`` counts the steps exactly (its
    accepted count can run past ``max_tokens``: it drafts K whatever is left). n-gram steps without a
    match are not drafts, so there the steps are the tokens after the first minus the accepted ones,
    and at least the drafts. Returns [] for a measurement without groups.
    """
    kind = kind_of(m.config.drafter, m.config.num_speculative_tokens)
    by_group = _repeats_by_group(m)
    if not by_group:
        return []
    seconds = prefill = steps = draft_tokens = tokens = 0.0
    for gs in by_group.values():
        g = gs[0]  # greedy: every repeat of a group decodes the same tokens with the same counts
        seconds += statistics.median(x.seconds for x in gs)
        prefill += statistics.median(max(x.ttft_s) if x.ttft_s else 0.0 for x in gs)
        tokens += g.new_tokens
        c = g.counters
        if kind == PLAIN or c is None or not c.drafts:
            steps += g.new_tokens - g.batch_size
            continue
        n = c.drafts if kind == MODEL else max(c.drafts, g.new_tokens - g.batch_size - c.accepted)
        steps += n
        draft_tokens += c.draft_tokens
    k, b = len(by_group), m.batch_size
    context = statistics.mean(_group_context(gs[0]) for gs in by_group.values())
    return [ServerPoint(b, kind, seconds / k, steps / (k * b), draft_tokens / steps if steps and kind != PLAIN else 0.0,
                        round(tokens / k), prefill / k, context)]


def _group_context(g) -> float:
    return context_tokens(sum(g.prompt_tokens) / len(g.prompt_tokens), g.new_tokens / g.batch_size) \
        if g.prompt_tokens else 0.0


def _repeats_by_group(m: ServerMeasurement) -> dict[tuple[str, ...], list]:
    """A measurement's groups of prompts, each with its repeats."""
    by_group: dict[tuple[str, ...], list] = {}
    for g in m.groups:
        by_group.setdefault(g.prompt_ids, []).append(g)
    return by_group


def group_points_of(m: ServerMeasurement) -> list[ServerPoint]:
    """The measurement one point per group of prompts (median seconds over its repeats), each with its
    own context: what the context slope γ is fitted on (:mod:`._time_model`)."""
    return [p for gs in _repeats_by_group(m).values() for p in points_of(replace(m, groups=gs))]


def mean_prompt_tokens(m: ServerMeasurement) -> float | None:
    """The measured prompts' mean length (an input of the requests, known before they run)."""
    lengths = [t for g in m.groups for t in g.prompt_tokens]
    return sum(lengths) / len(lengths) if lengths else None


def calibrate_from(measurements: Iterable[ServerMeasurement], server: str = "vllm") -> ServerModel:
    """The server model fitted to ``measurements`` (one point per configuration and batch size; the
    context slope from their groups)."""
    ms = list(measurements)
    return calibrate([p for m in ms for p in points_of(m)], server, groups=[g for m in ms for g in group_points_of(m)])


def acceptance_terms(evaluator: Evaluator, c: Candidate) -> tuple[float, float]:
    """(tokens per decode step, draft tokens per decode step) for ``c`` on the server, from the engine
    profile's traces (1, 0 for plain), counted the way the server counts them.

    - Steps: the engine's cycles per request, replayed from its traces, equal vLLM's decode steps
      exactly (``profiler.backends._vllm_parity``); the tokens per step are the tokens after the prefill's first
      over those cycles. Not E[τ]: E[τ] counts the last cycle's accepted tokens past ``max_new_tokens``
      (vLLM's mean acceptance length does the same), so ``(max_new_tokens - 1) / E[τ]`` undercounts the
      steps (measured: by 3 % at N = 2 and 5 with 48 tokens, every prediction 3 % too fast).
    - Draft length: vLLM's draft-model proposer drafts K tokens at every step, whatever is left of
      ``max_tokens``; the engine shortens its last drafts (E[L] = 7.5 at N = 8 with 48 tokens). So a
      draft model's is N; an n-gram drafter's is the engine's E[L] (no match, no draft).
    """
    if c.is_plain:
        return 1.0, 0.0
    p = predict_config(evaluator.profile(c.drafter), spec_config(c, evaluator.mode))
    tokens_per_step = (p.new_tokens - p.prompts) / p.cycles  # every speculative prediction has cycles > 0
    draft_len = p.expected_draft_length if c.drafter == NGRAM else float(c.num_speculative_tokens)
    return max(1.0, tokens_per_step), draft_len


@dataclass(frozen=True)
class ServerPrediction:
    """A configuration's predicted server throughput at one batch size (labelled predicted)."""

    candidate: Candidate
    batch_size: int
    tokens_per_s: float
    tokens_per_step: float
    draft_len: float
    label: str = "predicted"

    def to_dict(self) -> dict[str, Any]:
        return {**self.candidate.to_dict(), "batch_size": self.batch_size, "tokens_per_s": self.tokens_per_s,
                "tokens_per_step": self.tokens_per_step, "draft_len": self.draft_len, "label": self.label}


def predict_server(model: ServerModel, evaluator: Evaluator, c: Candidate, batch_size: int,
                   max_new_tokens: int, prompt_tokens: float | None = None) -> ServerPrediction:
    """Predicted server tokens/s of ``c`` at ``batch_size`` (acceptance from the engine profile) on
    prompts of mean length ``prompt_tokens`` (None: the calibration prompts')."""
    tau, length = acceptance_terms(evaluator, c)
    kind = kind_of(c.drafter, c.num_speculative_tokens)
    tps = model.predict(batch_size, kind, max_new_tokens, tau, length, prompt_tokens)
    return ServerPrediction(c, batch_size, tps, tau, length)


def best_server_n_per_batch_size(model: ServerModel, evaluator: Evaluator, drafter: str, ns: Sequence[int],
                          batch_sizes: Sequence[int], max_new_tokens: int) -> dict[int, int]:
    """For each batch size, the N in ``ns`` (or 0 = do not speculate) with the best predicted server
    throughput: the per-batch-size schedule vLLM takes."""
    out = {}
    for b in batch_sizes:
        plain = model.predict(b, PLAIN, max_new_tokens)
        best_n, best = 0, plain
        for n in ns:
            p = predict_server(model, evaluator, Candidate(drafter, n), b, max_new_tokens).tokens_per_s
            if p > best:
                best_n, best = n, p
        out[int(b)] = best_n
    return out


__all__ += ["best_server_n_per_batch_size"]
