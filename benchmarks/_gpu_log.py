"""What the stages of ``benchmarks/gpu_check.py`` share: a JSON-lines log written as each number is measured
(a run cut off keeps what it measured), the device and dtype of a run, and the CPU stand-in of the CUDA-graph
runner for the dry run (the runner's bookkeeping without capture, as tests/profiler/test_timed_regions.py
attaches it)."""
from __future__ import annotations

import json
import time
from pathlib import Path

EVENTS = "events.jsonl"


def emit(out: Path, stage: str, what: str, **numbers) -> dict:
    """Append one record to ``out/events.jsonl`` now (flushed), and return it."""
    record = {"t": round(time.time(), 3), "stage": stage, "what": what, **numbers}
    with open(out / EVENTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")
    return record


def write_json(path: Path, obj) -> None:
    """``obj`` as JSON, replaced whole (a reader never sees half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def device_and_dtype(dry_run: bool) -> tuple[str, str]:
    """The real check: CUDA in bf16; the dry run: the CPU in float32."""
    return ("cpu", "float32") if dry_run else ("cuda", "bfloat16")


def load_pair(target: str, draft: str, dry_run: bool):
    """The target and draft, graphed on CUDA; on the dry run eager on the CPU with the runner's stand-in
    (``GraphRunner(capture=False)``: slots, per-width static inputs and counters, no capture)."""
    import specdec_tune.engine.cuda_graphs as cg
    from specdec_tune.engine import load_model

    device, dtype = device_and_dtype(dry_run)
    if dry_run:
        cg.attach = lambda lean, mode="auto": setattr(lean, "cuda_graph_runner", cg.GraphRunner(lean, capture=False))
    return load_model(target, device, dtype, "lean", "auto"), load_model(draft, device, dtype, "lean", "auto")


def counters(*models) -> list:
    """The graph counters of each model (None: eager), as JSON."""
    from specdec_tune.engine import graph_counters

    out = []
    for m in models:
        c = graph_counters(m.model)
        out.append(None if c is None else c.to_json())
    return out
