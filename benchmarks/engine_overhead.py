"""Engine overhead: time per speculative cycle minus the time of the model forwards it ran.

Usage: OMP_NUM_THREADS=1 python benchmarks/engine_overhead.py [--target mini-target] [--draft mini-draft-1l]
       [-N 4] [--workload functions] [--prompts 8] [--max-new-tokens 64]
Prints one JSON object (measured): median and mean overhead per cycle in ms and as a share of the cycle.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from specdec_tune.engine import DecodeConfig, build_drafter, load_model, speculative
from specdec_tune.engine.workloads import load_workload
from specdec_tune.profiler.overhead import ForwardRecorder
from specdec_tune.profiler.runs import encode_prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="mini-target")
    ap.add_argument("--draft", default="mini-draft-1l")
    ap.add_argument("-N", type=int, default=4)
    ap.add_argument("--workload", default="functions")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    target, draft = load_model(args.target, "cpu"), load_model(args.draft, "cpu")
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, num_speculative_tokens=args.N, eos_token_id=target.eos_token_id)
    prompts = [encode_prompt(target, p.prompt, p.id) for p in load_workload(args.workload)[: args.prompts]]
    rec = ForwardRecorder("cpu")
    cycles = []
    with torch.inference_mode(), rec.attach(target.model, draft.model):
        for i, ids in enumerate([prompts[0]] + prompts):  # the first decode is a warm-up
            drafter = build_drafter(draft.model, max_len=ids.shape[0] + args.max_new_tokens + args.N + 2)
            rec.begin()
            speculative(target.model, drafter, ids, cfg, on_cycle=rec.on_cycle)
            timeline = rec.finish()
            if i:
                cycles += timeline.cycle_overheads()
    over = [c.overhead_s for c in cycles]
    wall = [c.wall_s for c in cycles]
    print(json.dumps({
        "label": "measured", "target": args.target, "draft": args.draft, "N": args.N, "cycles": len(cycles),
        "threads": torch.get_num_threads(),
        "cycle_ms_median": 1e3 * statistics.median(wall),
        "overhead_ms_median": 1e3 * statistics.median(over),
        "overhead_share_median": statistics.median(c.share for c in cycles),
        "overhead_share_total": sum(over) / sum(wall),
    }))


if __name__ == "__main__":
    main()
