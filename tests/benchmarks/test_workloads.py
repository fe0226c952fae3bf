"""The larger validation prompt set (benchmarks/workloads/functions-240.jsonl) is the bundled population,
more of it: the builder is prefix-stable, so its first 40 prompts are the bundled ``functions`` set."""
from __future__ import annotations

from pathlib import Path

from specdec_tune.engine.workloads import load_workload

LARGE = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads" / "functions-240.jsonl"


def test_the_larger_set_extends_the_bundled_one():
    bundled = load_workload("functions")
    large = load_workload(str(LARGE))
    assert len(large) == 240 and len({p.id for p in large}) == 240
    assert [(p.id, p.prompt, p.category) for p in large[: len(bundled)]] == \
        [(p.id, p.prompt, p.category) for p in bundled]
    assert len({p.prompt for p in large}) == 240  # no prompt twice
