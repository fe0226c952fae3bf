"""Read a profile run from the results database and build its :class:`RunProfile` (the one database
reader of the model; the assembly itself is pure, :mod:`._profile`)."""
from __future__ import annotations

from specdec_tune.db import Database, get_run, list_measured, load_acceptance, load_bias_front, load_teacher_forced
from specdec_tune.db import load_timings, load_traces
from specdec_tune.tuner.model._profile import PromptInfo, RunProfile, build_run_profile, resolve_draft


def greedy_prompts(db: Database, run_id: int) -> list[PromptInfo] | None:
    """Per-prompt greedy output lengths stored with the run's measured baseline, if any."""
    for m in list_measured(db, run_id):
        if m.draft is None and isinstance(m.config.get("prompts"), list):  # the profile's hooked baseline
            return [PromptInfo(int(p["prompt_tokens"]), int(p["new_tokens"])) for p in m.config["prompts"]]
    return None


def load_run_profile(
    db: Database, run_id: int, draft: str | None = None, *, baseline_only: bool = False, calibrate: bool = True
) -> RunProfile:
    """Read everything about ``draft`` in run ``run_id`` and build its :class:`RunProfile`.

    Args:
        db: the results database.
        run_id: a profile run.
        draft: one of the run's drafts (default: the first); ignored with ``baseline_only``.
        baseline_only: target-only profile (plain decoding predictions).

    Raises:
        NotFoundError: no such run, or the draft is not in it.
    """
    run = get_run(db, run_id)
    name = None if baseline_only else resolve_draft(run, draft)
    timings = load_timings(db, run_id)
    traces = load_traces(db, run_id, name, "greedy") if name else []
    sampling, tv, continuations, in_loop, forced, front = None, None, None, None, [], []
    if name:
        for rec in load_acceptance(db, run_id, draft=name, mode="greedy"):
            continuations = rec.confidence_bins.get("continuations")
            in_loop = rec.confidence_bins.get("in_loop")
        for rec in load_acceptance(db, run_id, draft=name, mode="sampling"):
            sampling = load_traces(db, run_id, name, "sampling", temperature=rec.temperature) or None
            tv = rec.one_minus_tv
            forced = load_teacher_forced(db, run_id, name, temperature=rec.temperature)
        front = load_bias_front(db, run_id, name)
    return build_run_profile(run, name, timings, traces, prompts=greedy_prompts(db, run_id),
                             sampling_traces=sampling, sampling_acceptance=tv, continuations=continuations,
                             in_loop=in_loop, calibrate=calibrate, teacher_forced=forced, bias_front=front)
