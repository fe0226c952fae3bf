"""Regression arms at batch size B > 1: a schedule's band checked on the batched engine (``regress``).

An arm with ``batch_size`` B > 1 decodes its prompts in consecutive batches of B (``profiler.batch_runs``)
instead of one at a time; each batch is one sample (:class:`~profiler.suite_runs.PromptSample` with the
batch's prompt ids joined by ``+``): its wall seconds, and right after it the same batch decoded plainly at
the same batch size (``plain_seconds``, the paired reference whose ratio is the band's speedup), then the
machine probe. The first repeat keeps every row's tokens (concatenated: a greedy batch must decode exactly
what its plain batch decodes, every row its own sequence) and the per-position acceptance of all rows.
"""
from __future__ import annotations

import torch

from specdec_tune.engine import DecodeConfig, acceptance_counts
from specdec_tune.profiler.batch_measure import batches_of
from specdec_tune.profiler.batch_runs import measure_batch, warm_up_batch
from specdec_tune.profiler.machine_probe import MachineProbe
from specdec_tune.profiler.runs import NGRAM, DraftSpec


def batch_plan(plan) -> None:
    """Regroup a planned arm's prompts into its batches (the partial rest dropped), one sample per batch."""
    from specdec_tune.profiler.suite_runs import PromptSample

    groups = batches_of(len(plan.ids), plan.arm.batch_size)
    plan.ids = [[plan.ids[i] for i in g] for g in groups]
    plan.samples = [PromptSample(prompt_id="+".join(plan.samples[i].prompt_id for i in g), new_tokens=0) for g in groups]


def _draft(plan) -> DraftSpec:
    if plan.arm.plain:
        return DraftSpec("none")
    if plan.arm.spec.drafter == NGRAM:
        return DraftSpec("ngram")
    return DraftSpec("model", plan.draft_model)


def warm_up_arm(plan) -> None:
    """One short untimed batched decode of the arm's first batch (plain decoding too, the reference)."""
    warm_up_batch(plan.target, _draft(plan), plan.ids[0], plan.cfg)
    if not plan.arm.plain:
        warm_up_batch(plan.target, DraftSpec("none"), plan.ids[0], _plain(plan.cfg))


def _plain(cfg: DecodeConfig) -> DecodeConfig:
    return DecodeConfig(cfg.max_new_tokens, temperature=cfg.temperature, eos_token_id=cfg.eos_token_id)


def measure_batch_sample(plan, batch: list[torch.Tensor], s, repeat: int, seed: int, probe: MachineProbe) -> None:
    """One repeat of one batch: the arm's batched decode, the same batch decoded plainly, the machine probe."""
    arm = plan.arm
    got = measure_batch(plan.target, _draft(plan), batch, plan.cfg, seed=seed)
    s.seconds.append(got.seconds)
    s.draft_seconds.append(0.0)  # inside the batched drafter's steps, not separable per row
    tokens = [t for r in got.results for t in r.token_ids]
    if not arm.plain:
        ref = measure_batch(plan.target, DraftSpec("none"), batch, _plain(plan.cfg), seed=seed)
        s.plain_seconds.append(ref.seconds)
        if repeat == 0:
            s.plain_new_tokens = ref.new_tokens
            if arm.temperature == 0:
                s.plain_token_ids = [t for r in ref.results for t in r.token_ids]
                first = next((i for i, (a, b) in enumerate(zip(s.plain_token_ids, tokens)) if a != b), None)
                if first is None and len(tokens) != len(s.plain_token_ids):
                    first = min(len(tokens), len(s.plain_token_ids))
                s.parted = None if first is None else {"position": first, "margin": None, "top_logit": None}
    s.probe_seconds.append(probe.run())
    if repeat == 0:
        s.dtype = str(plan.target.dtype).replace("torch.", "")
        s.new_tokens, s.token_ids = got.new_tokens, tokens
        cycles = [c for r in got.results for c in r.cycles]
        s.cycles, s.drafted = len(got.cycles), sum(c.drafted for c in cycles)
        s.draft_forwards = sum(c.draft_forwards for c in got.cycles)
        s.reached, s.accepted = acceptance_counts(cycles, arm.spec.num_speculative_tokens)
        s.traces = [[list(c.confidences), int(c.accepted)] for c in cycles]
