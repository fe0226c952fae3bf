"""Read a profile run from the results database and build its :class:`RunProfile` (the one database
reader of the model; the assembly itself is pure, :mod:`._profile`)."""
from __future__ import annotations

import statistics

from specdec_tune.db import Database, get_run, list_measured, load_acceptance, load_bias_front, load_teacher_forced
from specdec_tune.db import load_timings, load_traces, load_tree_traces
from specdec_tune.core.speculative import SUFFIX
from specdec_tune.tuner.model._profile import PromptInfo, RunProfile, build_run_profile, resolve_draft
from specdec_tune.tuner.model._tree import Rollout, StagedStats, TreeData


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
            continuations, in_loop = rec.continuations, rec.in_loop
        for rec in load_acceptance(db, run_id, draft=name, mode="sampling"):
            sampling = load_traces(db, run_id, name, "sampling", temperature=rec.temperature) or None
            tv = rec.one_minus_tv
            forced = load_teacher_forced(db, run_id, name, temperature=rec.temperature)
        front = load_bias_front(db, run_id, name)
    rollouts = [r.data for r in load_tree_traces(db, run_id, name, kind="rollouts")] if name else []
    sequences = [(r.data["prompt"], r.data["output"]) for r in load_tree_traces(db, run_id, name, "sequences")] \
        if name == SUFFIX else []
    return build_run_profile(run, name, timings, traces, prompts=greedy_prompts(db, run_id),
                             sampling_traces=sampling, sampling_acceptance=tv, continuations=continuations,
                             in_loop=in_loop, calibrate=calibrate, teacher_forced=forced, bias_front=front,
                             rollouts=rollouts or None, sequences=sequences)


def load_tree_data(db: Database, run_id: int, draft: str, mode: str = "greedy") -> TreeData | None:
    """The token-tree and staged-drafting data of ``draft`` in run ``run_id`` (``profile --trees``), or
    ``None`` when the run has none. The timed passes (engine time, staged rates) are the ``mode``'s
    where the profile ran them in that mode, else the greedy ones."""
    # a head's roll-outs and suffix decoding's sequences alone are no tree data (profile --trees)
    rows = [r for r in load_tree_traces(db, run_id, draft) if r.kind not in ("rollouts", "sequences")]
    if not rows:
        return None
    sampled = mode == "sampling" and any(r.temperature > 0 for r in rows if r.kind in ("overhead", "staged"))
    rows = [r for r in rows if r.kind not in ("overhead", "staged") or (r.temperature > 0) == sampled]
    by_prompt: dict[str, dict[int, dict]] = {"ranks": {}, "siblings": {}, "overhead": {}, "rollouts": {}}
    staged: dict[str, list[dict]] = {}
    for r in rows:
        if r.kind == "staged":
            staged.setdefault(str(r.data["inner"]), []).append(r.data)
        else:
            by_prompt[r.kind][int(r.prompt_index or 0)] = r.data
    ranks = by_prompt["ranks"]
    sib = by_prompt["siblings"]
    widths: dict[int, list[float]] = {}
    for t in load_timings(db, run_id, kind="draft_width", draft=draft):
        widths.setdefault(t.k, []).append(t.seconds)
    return TreeData(
        ranks=tuple(tuple(int(x) for x in ranks[i]["ranks"]) for i in sorted(ranks)),
        top=tuple(tuple(tuple(row) for row in ranks[i]["top"]) for i in sorted(ranks)),
        iid=tuple(tuple(tuple(row) for row in sib[i]["iid"]) for i in sorted(sib)),
        point=tuple(tuple(tuple(row) for row in sib[i]["point"]) for i in sorted(sib)),
        width_raw_s={k: statistics.median(v) for k, v in sorted(widths.items())},
        staged={name: StagedStats(name, int(docs[0]["inner_n"]), *(sum(int(d[key]) for d in docs) for key in
                                  ("tokens", "draft_forwards", "fed", "inner_forwards")),
                                  cycles=tuple((int(n), float(t)) for d in docs for n, t in d.get("cycles", ())))
                for name, docs in staged.items()},
        overhead=tuple((int(d), int(n), int(f), float(t)) for doc in by_prompt["overhead"].values()
                       for d, n, f, t in doc["cycles"]),
        width_in_loop_s=_medians((int(k), float(t)) for doc in by_prompt["overhead"].values()
                                 for k, t in doc.get("draft_widths", ())),
        rollouts=tuple(Rollout(doc["ranks"], doc["top"]) for _, doc in sorted(by_prompt["rollouts"].items())),
    )


def _medians(pairs) -> dict[int, float]:
    """Median seconds per key of (key, seconds) pairs."""
    groups: dict[int, list[float]] = {}
    for k, t in pairs:
        groups.setdefault(k, []).append(t)
    return {k: statistics.median(v) for k, v in sorted(groups.items())}
