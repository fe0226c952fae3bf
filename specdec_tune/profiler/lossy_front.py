"""Teacher-forced positions and the lossy acceptance front of a model draft (sampling profiles).

Teacher-forced (docs/model.md, Acceptance from TV): both models read generations sampled from the
target (the sampling pass's outputs: speculative sampling emits the target's distribution), one
forward each; at every generated position p and q give 1 - TV(p, q), the exact sampling acceptance
there (Leviathan et al. 2023; Yin et al. 2024, Theorem 1), and the draft's top probability. For each
over-acceptance ε and rule (``engine.lossy``) the same p and q give the rejection probability and the
bias TV(emitted, p) exactly: the *theory* front, next to Theorem 5's least bias at that rejection.

Measured (docs/model.md, Lossy acceptance): the draft decodes with each rule and ε on a few prompts;
a wrapper around the lossy verifier reads each verified position's p and q, counts its rejection and
computes the bias of the step it took there. Rates are per verified position (a bonus token, emitted
from p, is exact and not counted).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from specdec_tune.db import BiasFrontRow, TeacherForcedRow
from specdec_tune.engine import DecodeConfig, LoadedModel, SamplingVerifier, bias_and_rejection, build_drafter, pareto_bias
from specdec_tune.engine import speculative
from specdec_tune.engine import VerifyResult, verify_lossy
from specdec_tune.engine import probs_from_logits

EPSILONS = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3)  # the over-acceptance grid a profile stores (log-spaced:
# on a 4,096-token vocabulary the additive ε is steep, docs/results.md, Lossy acceptance)
METHODS = ("opt", "uno")  # Decoding-OPT (OPT at ε = 0 is the exact rule) and Decoding-UNO


@dataclass
class _Sums:
    """Running sums of one (method, ε) over positions."""

    rejection: float = 0.0
    bias: float = 0.0
    pareto: float = 0.0
    positions: int = 0

    def add(self, bias: torch.Tensor, rejection: torch.Tensor, pareto: torch.Tensor | None = None) -> None:
        self.rejection += float(rejection.sum())
        self.bias += float(bias.sum())
        self.pareto += float(pareto.sum()) if pareto is not None else 0.0
        self.positions += int(rejection.numel())


@dataclass
class TeacherForcedFront:
    """What one teacher-forced pass over target-sampled generations gives."""

    rows: list[TeacherForcedRow] = field(default_factory=list)
    front: list[BiasFrontRow] = field(default_factory=list)


def teacher_forced_front(target: torch.nn.Module, draft: torch.nn.Module, sequences: Sequence[torch.Tensor],
                         prompt_lengths: Sequence[int], temperature: float, name: str,
                         epsilons: Sequence[float] = EPSILONS) -> TeacherForcedFront:
    """Per generated position 1 - TV and top q, and the theory front over ``epsilons`` × OPT/UNO.

    Args:
        target, draft: the models.
        sequences: ``[T]`` prompt + generation per prompt (generations sampled from the target).
        prompt_lengths: each sequence's prompt length (positions before it are not generated).
        temperature: the sampling temperature of p and q.
        name: the draft's name (stored with the rows).
        epsilons: the over-acceptance grid.
    """
    sums = {(m, e): _Sums() for m in METHODS for e in epsilons}
    out = TeacherForcedFront()
    with torch.inference_mode():
        for i, (ids, start) in enumerate(zip(sequences, prompt_lengths)):
            if ids.numel() <= start:
                continue
            x = ids[None, :-1]
            p_logits, q_logits = target(input_ids=x, use_cache=False).logits[0], draft(input_ids=x, use_cache=False).logits[0]
            vocab = min(p_logits.shape[-1], q_logits.shape[-1])  # padded embedding rows never win
            keep = slice(start - 1, None)  # positions that predict a generated token
            p = probs_from_logits(p_logits[keep, :vocab].double(), temperature)  # [M, vocab]
            q = probs_from_logits(q_logits[keep, :vocab].double(), temperature)  # [M, vocab]
            tv = 0.5 * (p - q).abs().sum(-1)  # [M]
            out.rows.append(TeacherForcedRow(i, tuple((1 - tv).tolist()), tuple(q.max(-1).values.tolist()), name,
                                             temperature))
            for (method, eps), acc in sums.items():
                bias, r = bias_and_rejection(p, q, eps, method)
                acc.add(bias, r, pareto_bias(p, q, r))
    out.front = [BiasFrontRow(m, e, "theory", s.rejection / s.positions, s.bias / s.positions, s.positions,
                              s.pareto / s.positions, name, temperature)
                 for (m, e), s in sums.items() if s.positions]
    return out


def _recording(sums: _Sums, epsilon: float, method: str) -> Callable:
    """A verify function that verifies with the lossy rule and adds each verified position's bias."""
    inner = partial(verify_lossy, epsilon=epsilon, method=method)

    def verify(tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
               generator: torch.Generator | None) -> VerifyResult:
        result = inner(tokens, draft_probs, target_probs, generator)
        verified = min(result.num_accepted + 1, tokens.shape[0])  # a bonus position is not verified
        if verified:
            p, q = target_probs[:verified].double(), draft_probs[:verified].double()
            bias, _ = bias_and_rejection(p, q, epsilon, method)
            rejected = torch.zeros(verified, dtype=torch.float64)
            rejected[-1] = float(result.num_accepted < tokens.shape[0])
            sums.add(bias, rejected)
        return result

    return verify


def measured_front(target: LoadedModel, draft: LoadedModel, prompts: Sequence[torch.Tensor], config: DecodeConfig,
                   name: str, epsilons: Sequence[float] = EPSILONS, seed: int = 0) -> list[BiasFrontRow]:
    """Decode ``prompts`` with every rule and ε (``config``: N, θ, temperature, limits) and measure the front."""
    rows = []
    for method in METHODS:
        for eps in epsilons:
            sums = _Sums()
            cfg = replace(config, acceptance=method, epsilon=eps)
            with torch.inference_mode():
                for i, ids in enumerate(prompts):
                    gen = torch.Generator(device=target.device).manual_seed(seed + i)
                    drafter = build_drafter(draft.model, max_len=ids.shape[0] + cfg.room, temperature=cfg.temperature,
                                            generator=gen)
                    recording = SamplingVerifier(cfg.temperature, _recording(sums, eps, method))
                    speculative(target.model, drafter, ids, cfg, gen, verifier=recording)
            if sums.positions:
                rows.append(BiasFrontRow(method, eps, "measured", sums.rejection / sums.positions,
                                         sums.bias / sums.positions, sums.positions, None, name, cfg.temperature))
    return rows
