"""bf16 tolerance: how far logits move between forwards that round differently (CPU, bundled models).

Usage: OMP_NUM_THREADS=1 python benchmarks/bf16_tolerance.py [--models mini-target,mini-draft-1l,mini-draft-2l]
       [--dtype bfloat16] [--workload functions] [--max-prompts 16] [--steps 32] [--ks 2,3,5,9,0]
For every prompt each model greedy-decodes --steps tokens with one-token forwards, then the same tokens
are fed again in forwards of k tokens (a verify forward that accepts everything; k = 0: one forward over
the whole sequence, as the consistency rule recomputes a margin). Per position: how far the margin
between the one-token path's top two logits moved, in ulps of its top logit in --dtype. Prints one JSON
object (measured): quantiles per model and k, the largest movement, and the tolerance it gives
(specdec_tune.core.consistency: TOLERANCE_ULPS = 4 × the measured maximum).
"""
from __future__ import annotations

import json
import os
import platform
import time

import numpy as np
import torch
import typer

from specdec_tune.cli import _options as opts
from specdec_tune.core.consistency import MEASURED_MAX_ULPS, TOLERANCE_ULPS
from specdec_tune.engine import load_model
from specdec_tune.engine.workloads import load_workload
from specdec_tune.profiler.logit_margins import rounding_spread
from specdec_tune.profiler.runs import encode_prompt


def _summary(rows) -> dict:
    ulps = np.array([r.ulps for r in rows])
    return {"positions": len(rows), "ulps_q50": float(np.quantile(ulps, 0.5)), "ulps_q99": float(np.quantile(ulps, 0.99)),
            "ulps_q999": float(np.quantile(ulps, 0.999)), "ulps_max": float(ulps.max()),
            "moved_share": float((ulps > 0).mean()), "max_abs_logit_diff": float(max(r.max_abs for r in rows)),
            "margin_shift_max": float(max(r.margin_shift for r in rows))}


def main(
    models: str = typer.Option("mini-target,mini-draft-1l,mini-draft-2l", "--models", help="Models, comma-separated."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="bfloat16 | float16."),
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    max_prompts: int = typer.Option(16, "--max-prompts", help=opts.MAX_PROMPTS_HELP),
    steps: int = typer.Option(32, "--steps", help="Greedy tokens per prompt."),
    ks: str = typer.Option("2,3,5,9,0", "--ks", help="Tokens per forward of the other path (0: the whole sequence)."),
) -> None:
    torch.set_num_threads(1)
    k_list = [int(k) for k in ks.split(",")]
    prompts = load_workload(workload)[:max_prompts]
    out: dict = {"label": "measured", "date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
                 "torch": torch.__version__, "dtype": dtype, "workload": workload, "prompts": len(prompts),
                 "steps": steps, "load_average": list(os.getloadavg()), "models": {}}
    everything = []
    for name in models.split(","):
        model = load_model(name, "cpu", dtype)
        rows = [r for p in prompts for r in rounding_spread(model, encode_prompt(model, p.prompt, p.id), steps, k_list)]
        everything += rows
        out["models"][name] = {str(k): _summary([r for r in rows if r.k == k]) for k in k_list}
        ties = sum(r.margin == 0 for r in rows if r.k == k_list[0])
        out["models"][name]["exact_ties_one_token_path"] = ties
    out["all"] = _summary(everything)
    out["tolerance"] = {"measured_max_ulps": out["all"]["ulps_max"], "in_code_measured_max_ulps": MEASURED_MAX_ULPS,
                        "tolerance_ulps": TOLERANCE_ULPS,
                        "rule": "near-tie iff |margin| <= TOLERANCE_ULPS ulps of the reference's top logit"}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    opts.run_script(main)
