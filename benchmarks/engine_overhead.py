"""Engine overhead: time per speculative cycle minus the time of the model forwards it ran.

Usage: OMP_NUM_THREADS=1 python benchmarks/engine_overhead.py [--target mini-target] [--draft mini-draft-1l]
       [-N 4] [--workload functions] [--max-prompts 8] [--max-new-tokens 64]
Prints one JSON object (measured): median and mean overhead per cycle in ms and as a share of the cycle.
"""
from __future__ import annotations

import json
import statistics
from typing import Annotated

import torch
import typer

from specdec_tune.cli import _options as opts
from specdec_tune.engine import DecodeConfig, build_drafter, load_model, speculative
from specdec_tune.engine.workloads import load_workload
from specdec_tune.profiler.overhead import ForwardRecorder
from specdec_tune.profiler.runs import encode_prompt

Prompts = Annotated[int, typer.Option("--max-prompts", "--prompts", help=opts.MAX_PROMPTS_HELP)]


def main(
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    draft: opts.BundledDraftOption = opts.BUNDLED_DRAFT,
    num_speculative_tokens: opts.NumSpeculativeTokensOption = opts.DEFAULT_NUM_SPECULATIVE_TOKENS,
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    prompts: Prompts = opts.BENCH_MAX_PROMPTS,
    max_new_tokens: opts.MaxNewTokensOption = opts.DEFAULT_MAX_NEW_TOKENS,
) -> None:
    n = num_speculative_tokens
    tgt, drf = load_model(target, "cpu"), load_model(draft, "cpu")
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, num_speculative_tokens=n, eos_token_id=tgt.eos_token_id)
    encoded = [encode_prompt(tgt, p.prompt, p.id) for p in load_workload(workload)[:prompts]]
    rec = ForwardRecorder("cpu")
    cycles = []
    with torch.inference_mode(), rec.attach(tgt.model, drf.model):
        for i, ids in enumerate([encoded[0]] + encoded):  # the first decode is a warm-up
            drafter = build_drafter(drf.model, max_len=ids.shape[0] + max_new_tokens + n + 2)
            rec.begin()
            speculative(tgt.model, drafter, ids, cfg, on_cycle=rec.on_cycle)
            timeline = rec.finish()
            if i:
                cycles += timeline.cycle_overheads()
    over = [c.overhead_s for c in cycles]
    wall = [c.wall_s for c in cycles]
    print(json.dumps({
        "label": "measured", "target": target, "draft": draft, "N": n, "cycles": len(cycles),
        "threads": torch.get_num_threads(),
        "cycle_ms_median": 1e3 * statistics.median(wall),
        "overhead_ms_median": 1e3 * statistics.median(over),
        "overhead_share_median": statistics.median(c.share for c in cycles),
        "overhead_share_total": sum(over) / sum(wall),
    }))


if __name__ == "__main__":
    opts.run_script(main)
