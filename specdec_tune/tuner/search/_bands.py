"""Each band of a per-batch-size schedule measured held out at its own batch size (issue 38, part 3).

The schedule's N at batch size B (the model's proposal, ``._tune._schedule``) runs on the batched engine
against plain decoding at that B, interleaved batch by batch on the held-out prompts
(``measure_candidates(batch_size=B)``); the paired 95% CI of the speedup (over batches) decides the band by the
rule that holds at B = 1 (``tuner.model.decide_bands``: a CI lower bound below 1, or no CI, speculates 0 there
and at every larger batch size, and says why). Every distinct configuration that ships (the winner, each
server's pick) is measured in the same passes at each batch size, plain decoding once.

A band needs two batches of held-out prompts for a CI: where there are fewer than 2·B, it is not measured
(nothing is decoded for it) and its reason says how many held-out prompts it would need. Token trees and
staged drafting decode one sequence at a time: their bands are not measured either.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from specdec_tune.db import Database, get_run
from specdec_tune.profiler import chosen_prompts
from specdec_tune.tuner.model import NONE, BandEvidence, Candidate, ServerDecision, decide_bands
from specdec_tune.tuner.search._measure import measure_candidates, measured_speedup

PLAIN = Candidate(NONE, 0)


def band_evidence(db: Database, run_id: int, schedules: Mapping[Candidate, Mapping[int, int]], *,
                  heldout_prompts: int, **common: Any) -> dict[Candidate, dict[int, BandEvidence]]:
    """For every configuration and every batch size > 1 its schedule speculates at: the measured held-out
    evidence (or why there is none).

    Args:
        schedules: configuration -> its schedule (batch size -> N).
        heldout_prompts: the held-out prompts measured at each batch size (the first of the split).
        common: ``temperature``, ``repeats``, ``seed``, ``progress``, ``threads``, ``gpu_price``.
    """
    available = len(chosen_prompts(get_run(db, run_id), "holdout", heldout_prompts)[1])
    sizes = sorted({b for s in schedules.values() for b, n in s.items() if b > 1 and n > 0})
    out: dict[Candidate, dict[int, BandEvidence]] = {c: {} for c in schedules}
    for b in sizes:
        wanted = {c: replace(c, num_speculative_tokens=s[b]) for c, s in schedules.items() if s.get(b, 0) > 0}
        for c in [c for c in wanted if c.tree or c.staged]:
            out[c][b] = BandEvidence(why="token trees and staged drafting decode one sequence at a time")
            del wanted[c]
        batches = available // b
        if batches < 2:
            why = (f"{available} held-out prompts make {batches} batch{'es' * (batches != 1)} of {b}; a CI needs 2 "
                   f"(--heldout-prompts {2 * b})")
            out.update({c: {**out[c], b: BandEvidence(why=why)} for c in wanted})
            continue
        if not wanted:
            continue
        pool = list(dict.fromkeys(wanted.values())) + [PLAIN]
        measured = {m.candidate: m for m in measure_candidates(db, run_id, pool, split="holdout",
                                                               max_prompts=heldout_prompts, batch_size=b, **common)}
        plain = measured[PLAIN]
        for c, at in wanted.items():
            speedup, ci = measured_speedup(measured[at], plain)
            out[c][b] = BandEvidence(speedup, ci, measured[at].heldout, batches,
                                     None if ci is not None else "no CI of the speedup")
    return out


def measured_schedules(db: Database, run_id: int, winner: Candidate, schedule: Mapping[int, int],
                       decided: Mapping[str, ServerDecision], *, heldout_prompts: int, **common: Any
                       ) -> tuple[dict[str, ServerDecision], dict[int, int], dict[int, str]]:
    """The winner's schedule and every speculating server's decided band by band (:func:`band_evidence`,
    ``decide_bands``): (the decisions with their bands, the winner's schedule, its reasons)."""
    schedules: dict[Candidate, Mapping[int, int]] = {} if winner.is_plain else {winner: schedule}
    for d in decided.values():
        if d.speculates and d.per_batch_size:
            schedules.setdefault(d.candidate, d.per_batch_size)
    evidence = band_evidence(db, run_id, schedules, heldout_prompts=heldout_prompts, **common)
    ruled = {c: decide_bands(c, s, evidence[c]) for c, s in schedules.items()}
    out = {srv: replace(d, per_batch_size=ruled[d.candidate][0], per_batch_size_reasons=ruled[d.candidate][1])
           if d.candidate in ruled and d.speculates else d for srv, d in decided.items()}
    own, reasons = ruled.get(winner, (dict(schedule), {}))
    return out, own, reasons
