"""Does the machine probe track the decode's speed? (the regression rule's absolute speed cells on a shared machine)

Alternates, for ``--seconds``, a speculative decode and a plain decode of one prompt (the bundled
target and 1-layer draft, N = 4, 48 tokens) with one run of ``profiler.machine_probe.MachineProbe``,
and groups the samples into windows of ``--window``. Reports, over the windows, the correlation of
log decode time with log probe time, the slope (elasticity) of one on the other, and the spread
(standard deviation of the window's log time) of each decode before and after dividing by the
probe: what the regression comparison gains by dividing the machine out.

Run it while the machine's load changes (e.g. a vLLM engine starting on the other core), pinned:

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/machine_probe_tracking.py --seconds 240 \\
        --out benchmarks/results/machine_probe_tracking_cpu.json
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from specdec_tune.cli._options import run_script

Seconds = Annotated[float, typer.Option("--seconds", help="How long to alternate decodes and probe runs.")]
Window = Annotated[int, typer.Option("--window", help="Samples per window (about 8 s).")]
FromJson = Annotated[Path | None, typer.Option("--from-json", help="Analyse samples saved by an earlier run instead.")]
Out = Annotated[Path | None, typer.Option("--out", help="Write the analysis and the samples here (JSON).")]


def measure(seconds: float) -> list[tuple[float, float, float, float]]:
    import torch

    from specdec_tune.core.speculative import SpeculativeConfig
    from specdec_tune.engine import DecodeConfig
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.machine_probe import MachineProbe
    from specdec_tune.profiler.runs import encode_prompt
    from specdec_tune.profiler.suite_runs import ArmSpec, ModelCache, timed_decode

    torch.set_num_threads(1)
    models = ModelCache()
    target = models.get("mini-target", "cpu", "auto", "auto")
    draft = models.get("mini-draft-1l", "cpu", "auto", "auto")
    arm = ArmSpec("x", "mini-target", SpeculativeConfig("mini-draft-1l"), "functions", 1)
    prompt = load_workload("functions")[0]
    ids = encode_prompt(target, prompt.prompt, prompt.id)
    cfg = DecodeConfig(max_new_tokens=48, num_speculative_tokens=4, eos_token_id=target.eos_token_id)
    probe = MachineProbe()
    probe.run()
    timed_decode(target, arm, draft, ids, cfg, 0)  # warm-up
    out = []
    end = time.time() + seconds
    while time.time() < end:
        _, spec_s, _ = timed_decode(target, arm, draft, ids, cfg, 0)
        _, plain_s, _ = timed_decode(target, arm, None, ids, cfg, 0, plain=True)
        out.append((time.time(), spec_s, plain_s, probe.run()))
    return out


def analyse(samples: list, window: int) -> dict:
    x = np.array(samples)
    n = len(x) // window
    med = np.array([np.median(x[i * window:(i + 1) * window, 1:], axis=0) for i in range(n)])
    spec, plain, probe = np.log(med[:, 0]), np.log(med[:, 1]), np.log(med[:, 2])
    out = {"samples": len(x), "windows": n, "window": window,
           "probe_ms_range": [float(np.exp(probe.min()) * 1e3), float(np.exp(probe.max()) * 1e3)]}
    for name, y in (("speculative", spec), ("plain", plain)):
        out[name] = {"corr_with_probe": float(np.corrcoef(y, probe)[0, 1]),
                     "elasticity": float(np.polyfit(probe, y, 1)[0]),
                     "sd_log_raw": float(y.std(ddof=1)), "sd_log_probe_divided": float((y - probe).std(ddof=1))}
    return out


def main(seconds: Seconds = 240, window: Window = 10, from_json: FromJson = None, out: Out = None) -> None:
    samples = json.loads(from_json.read_text())["samples"] if from_json else measure(seconds)
    result = analyse(samples, window)
    for name in ("speculative", "plain"):
        r = result[name]
        print(f"{name}: corr(log decode, log probe) {r['corr_with_probe']:.2f}, elasticity {r['elasticity']:.2f}, "
              f"window spread {100 * r['sd_log_raw']:.1f}% raw -> {100 * r['sd_log_probe_divided']:.1f}% probe-divided")
    print(f"{result['samples']} samples, {result['windows']} windows; probe {result['probe_ms_range'][0]:.1f}-"
          f"{result['probe_ms_range'][1]:.1f} ms")
    if out:
        with open(out, "w") as f:
            json.dump({**result, "samples": samples, "columns": ["unix time", "speculative s", "plain s", "probe s"]}, f)


if __name__ == "__main__":
    run_script(main)
