"""Telemetry overhead: does NVML sampling slow the decoding thread? (CPU, fake NVML library)

Usage: python benchmarks/telemetry_overhead.py [--pairs 12] [--steps 800] [--call-ms 10] [--interval-s 0.01]
Every fake NVML query (tests/support/fake_nvml.py) takes --call-ms holding the GIL; a decode-shaped loop is
timed without and with a monitor running, interleaved pair by pair, for the sampling process the
profiler uses and for the earlier design (a sampler thread in the decoding process). Prints one JSON
object (measured): per design the median time ratio (with / without) and its 95% bootstrap CI.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import typer
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support.fake_nvml, run from anywhere
from specdec_tune.cli import _options as opts  # noqa: E402
from specdec_tune.profiler.telemetry import NvmlMonitor  # noqa: E402
from tests.support import fake_nvml  # noqa: E402


def _ci(ratios: list[float]) -> list[float]:
    res = stats.bootstrap((np.array(ratios),), np.median, confidence_level=0.95, n_resamples=2000,
                          random_state=np.random.default_rng(0), method="percentile")
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def main(
    pairs: int = typer.Option(12, "--pairs", help="Interleaved (without, with) pairs per design."),
    steps: int = typer.Option(800, "--steps", help="Steps of the decode-shaped loop."),
    call_ms: float = typer.Option(10.0, "--call-ms", help="Milliseconds every fake NVML query holds the GIL."),
    interval_s: float = typer.Option(0.01, "--interval-s", help="Seconds between samples."),
) -> None:
    os.environ["FAKE_NVML_CALL_MS"] = str(call_ms)
    designs = {
        "sampling_process": lambda: NvmlMonitor(fake_nvml, interval_s=interval_s),
        "sampler_thread_earlier_design": lambda: fake_nvml.InThreadMonitor(fake_nvml, interval_s=interval_s),
    }
    out: dict = {"label": "measured", "date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
                 "cpus": os.cpu_count(), "load_average": list(os.getloadavg()), "call_ms": call_ms,
                 "interval_s": interval_s, "steps": steps, "pairs": pairs,
                 "loop_alone_s": fake_nvml.decode_like_loop(steps)}
    for name, make in designs.items():
        rows = fake_nvml.paired_loop_seconds(make, pairs, steps)
        ratios = [w / wo for wo, w in rows]
        out[name] = {"median_ratio": statistics.median(ratios), "ci95": _ci(ratios),
                     "ratios": [round(r, 4) for r in ratios]}
    out["load_average_after"] = list(os.getloadavg())
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    opts.run_script(main)
