"""What the sampling benchmarks share (``lossy_front.py``, ``tv_acceptance.py``, ``threshold_kinds.py``):
a sampling profile to reuse or make, the bundled pair with its held-out prompts, and the result files."""
from __future__ import annotations

import json
import os
from pathlib import Path

from specdec_tune.engine import check_compatible, load_model
from specdec_tune.engine.workloads import load_workload
from specdec_tune.profiler import ProfileSettings, run_profile
from specdec_tune.profiler.runs import encode_prompt
from specdec_tune.core.splits import split_prompts

RESULTS = Path(__file__).resolve().parent / "results"


def profile_run(database, run: int | None, target: str, draft: str, workload: str, **settings) -> int:
    """``run`` when given, else a fresh profile of the pair on the tuning half (``ProfileSettings`` overrides)."""
    if run is not None:
        return run
    return run_profile(database, target, [draft], workload, ProfileSettings(device="cpu", split="tune", **settings)).run_id


def held_out_pair(target: str, draft: str, workload: str, max_prompts: int | None):
    """(target, draft, held-out prompts as token ids): the models loaded on the CPU, checked to share a vocabulary."""
    tgt, drf = load_model(target, "cpu"), load_model(draft, "cpu")
    check_compatible(tgt, drf)
    prompts = split_prompts(load_workload(workload), "holdout")[:max_prompts]
    return tgt, drf, [encode_prompt(tgt, p.prompt, p.id) for p in prompts]


def result_stem(out: str | None, default: str) -> Path:
    """Where the result files go: ``out`` as a path stem (relative to the current folder), else
    ``benchmarks/results/<default>``. Its folder is created and checked now, before the measuring, so a
    bad ``--out`` fails in a second instead of after the run."""
    stem = Path(out) if out else RESULTS / default
    try:
        stem.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"error: cannot create the results folder {stem.parent.resolve()}: {exc.strerror}") from None
    if not os.access(stem.parent, os.W_OK):
        raise SystemExit(f"error: cannot write results to {stem.parent.resolve()}")
    return stem


def write_results(out: str | None, default: str, text: str, obj: dict) -> Path:
    """``<stem>.txt`` and ``<stem>.json`` (stem: :func:`result_stem`)."""
    stem = result_stem(out, default)
    stem.with_suffix(".txt").write_text(text + "\n")
    stem.with_suffix(".json").write_text(json.dumps(obj, indent=1, default=str, ensure_ascii=False) + "\n")
    return stem
