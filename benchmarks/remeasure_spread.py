"""How far two measurements of the same configurations, at different times, put each one's TPOT p50
relative to plain decoding: the session-to-session spread a model's error has to sit above.

Reads ``latency_fidelity.py`` result files (``.json``) of the same profile and prompts and prints,
per configuration, TPOT p50 ÷ plain decoding's TPOT p50 in each and the relative difference between
two of them; nothing is measured. Pairs measured the same way compare one measurement design with
another (e.g. configurations taking turns pass by pass against prompt by prompt).

    python benchmarks/remeasure_spread.py A.json B.json [C.json D.json ...]   # pairs: (A, B), (C, D)
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def ratios(path: str) -> dict[str, float]:
    """Each configuration's measured TPOT p50 over plain decoding's, from one result file."""
    rows = json.loads(Path(path).read_text())["rows"]
    plain = next(r["tpot_p50_measured_ms"] for r in rows if r["N"] == 0)
    return {r["config"]: r["tpot_p50_measured_ms"] / plain for r in rows if r["N"] != 0}


def spread(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Relative difference b/a - 1 of the configurations both measured."""
    return {c: b[c] / a[c] - 1.0 for c in a if c in b}


def main(paths: list[str]) -> None:
    if len(paths) < 2 or len(paths) % 2:
        sys.exit("usage: remeasure_spread.py A.json B.json [C.json D.json ...] (pairs)")
    for first, second in zip(paths[::2], paths[1::2]):
        a, b = ratios(first), ratios(second)
        d = spread(a, b)
        print(f"{Path(first).stem} -> {Path(second).stem}")
        for c, x in d.items():
            print(f"  {c:28s} {a[c]:.3f} -> {b[c]:.3f}  {x:+.1%}")
        mags = [abs(x) for x in d.values()]
        print(f"  median |difference| {statistics.median(mags):.1%}, largest {max(mags):.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
