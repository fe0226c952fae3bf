"""The lean forward's fused CPU kernels against its eager operators, in one process, interleaved.

Usage: OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/lean_kernels.py [--target mini-target]
       [--draft mini-draft-1l] [-N 4] [--workload functions] [--prompts 12] [--max-new-tokens 96] [--rounds 3]
Each round runs every prompt with the kernels and then with the eager operators (target-only and
speculative decoding, greedy), so a slow stretch of the machine hits both. Prints tokens/s (measured)
with the paired bootstrap 95% CI of each kernels/eager ratio, and whether the greedy outputs agree.
"""
from __future__ import annotations

import argparse
import time

import torch

from specdec_tune.engine import DecodeConfig, autoregressive, build_drafter, lean_kernels, load_model, speculative
from specdec_tune.engine.workloads import load_workload
from specdec_tune.profiler.runs import encode_prompt
from specdec_tune.stats import RateSamples, speedup_ci, tokens_per_s_ci


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="mini-target")
    ap.add_argument("--draft", default="mini-draft-1l")
    ap.add_argument("-N", type=int, default=4)
    ap.add_argument("--workload", default="functions")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if lean_kernels.kernels() is None:
        raise SystemExit(f"the fused kernels are unavailable: {lean_kernels.unavailable()}")
    target, draft = load_model(args.target, "cpu", "float32"), load_model(args.draft, "cpu", "float32")
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, num_speculative_tokens=args.N)
    prompts = [(p.id, encode_prompt(target, p.prompt, p.id)) for p in load_workload(args.workload)[: args.prompts]]

    def decode(method: str, ids: torch.Tensor) -> list[int]:
        if method == "plain":
            return autoregressive(target.model, ids, cfg).token_ids
        drafter = build_drafter(draft.model, max_len=ids.shape[0] + args.max_new_tokens + args.N + 2)
        return speculative(target.model, drafter, ids, cfg).token_ids

    arms = [(m, k) for m in ("plain", "speculative") for k in (True, False)]
    tokens = {a: [[] for _ in prompts] for a in arms}
    seconds = {a: [[] for _ in prompts] for a in arms}
    outputs: dict[tuple, list] = {}
    with torch.inference_mode():
        for _, ids in prompts[:2]:  # warm-up
            for method, kern in arms:
                target.model.use_kernels = draft.model.use_kernels = kern
                decode(method, ids)
        for _ in range(args.rounds):
            for i, (_, ids) in enumerate(prompts):
                for arm in arms:
                    target.model.use_kernels = draft.model.use_kernels = arm[1]
                    t0 = time.perf_counter()
                    out = decode(arm[0], ids)
                    seconds[arm][i].append(time.perf_counter() - t0)
                    tokens[arm][i].append(len(out))
                    outputs.setdefault((arm[0], i), []).append(out)
    ids = tuple(pid for pid, _ in prompts)
    samples = {a: RateSamples(ids, tuple(map(tuple, tokens[a])), tuple(map(tuple, seconds[a]))) for a in arms}
    print(f"{args.target} + {args.draft}, N = {args.N}, {len(prompts)} prompts x {args.max_new_tokens} tokens x "
          f"{args.rounds} rounds, interleaved, greedy, float32, {torch.get_num_threads()} thread(s)")
    for method in ("plain", "speculative"):
        on, off = samples[(method, True)], samples[(method, False)]
        rate = {k: sum(map(sum, s.tokens)) / sum(map(sum, s.seconds)) for k, s in ((True, on), (False, off))}
        lo_on, hi_on = tokens_per_s_ci(on)
        lo_off, hi_off = tokens_per_s_ci(off)
        lo, hi = speedup_ci(on, off)
        same = all(len({tuple(o) for o in outs}) == 1 for (m, _), outs in outputs.items() if m == method)
        print(f"  {method:12s} kernels {rate[True]:6.1f} tok/s (CI {lo_on:.1f}-{hi_on:.1f})  eager {rate[False]:6.1f} "
              f"(CI {lo_off:.1f}-{hi_off:.1f})  kernels/eager {rate[True] / rate[False]:.2f}x (95% CI {lo:.2f}-{hi:.2f}), "
              f"greedy outputs {'identical' if same else 'DIFFER'} (measured)")


if __name__ == "__main__":
    main()
