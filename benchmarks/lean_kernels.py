"""The lean forward's fused CPU kernels against its eager operators, in one process, interleaved.

Usage: OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/lean_kernels.py [--target mini-target]
       [--draft mini-draft-1l] [-N 4] [--workload functions] [--max-prompts 12] [--max-new-tokens 96] [--rounds 3]
Each round runs every prompt with the kernels and then with the eager operators (target-only and
speculative decoding, greedy), so a slow stretch of the machine hits both. Prints tokens/s (measured)
with the paired bootstrap 95% CI of each kernels/eager ratio, and whether the greedy outputs agree.
"""
from __future__ import annotations

import time
from typing import Annotated

import torch
import typer

from specdec_tune.cli import _options as opts
from specdec_tune.engine import DecodeConfig, autoregressive, build_drafter, lean_kernels, load_model, speculative
from specdec_tune.engine.workloads import load_workload
from specdec_tune.profiler.runs import encode_prompt
from specdec_tune.core.stats import RateSamples, bounds, speedup_ci, tokens_per_s_ci

Prompts = Annotated[int, typer.Option("--max-prompts", "--prompts", help=(
    f"{opts.MAX_PROMPTS_HELP} 12 here, not bench's {opts.BENCH_MAX_PROMPTS}: the setting of "
    "results/lean_kernels_cpu.txt."))]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", help=(
    f"{opts.MAX_NEW_TOKENS_HELP} 96 here, not the CLI's {opts.DEFAULT_MAX_NEW_TOKENS}: the setting of "
    "results/lean_kernels_cpu.txt."))]
Rounds = Annotated[int, typer.Option("--rounds", help="Interleaved rounds over every prompt and arm.")]


def main(
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    draft: opts.BundledDraftOption = opts.BUNDLED_DRAFT,
    num_speculative_tokens: opts.NumSpeculativeTokensOption = opts.DEFAULT_NUM_SPECULATIVE_TOKENS,
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    max_prompts: Prompts = 12,
    max_new_tokens: MaxNewTokens = 96,
    rounds: Rounds = 3,
) -> None:
    if lean_kernels.kernels() is None:
        raise SystemExit(f"the fused kernels are unavailable: {lean_kernels.unavailable()}")
    tgt, drf = load_model(target, "cpu", "float32"), load_model(draft, "cpu", "float32")
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, num_speculative_tokens=num_speculative_tokens)
    prompts = [(p.id, encode_prompt(tgt, p.prompt, p.id)) for p in load_workload(workload)[:max_prompts]]
    samples, outputs = _measure(tgt, drf, prompts, cfg, rounds)
    print(f"{target} + {draft}, N = {num_speculative_tokens}, {len(prompts)} prompts x {max_new_tokens} tokens x "
          f"{rounds} rounds, interleaved, greedy, float32, {torch.get_num_threads()} thread(s)")
    for method in ("plain", "speculative"):
        on, off = samples[(method, True)], samples[(method, False)]
        rate = {k: sum(map(sum, s.tokens)) / sum(map(sum, s.seconds)) for k, s in ((True, on), (False, off))}
        lo_on, hi_on = bounds(tokens_per_s_ci(on))
        lo_off, hi_off = bounds(tokens_per_s_ci(off))
        lo, hi = bounds(speedup_ci(on, off))
        same = all(len({tuple(o) for o in outs}) == 1 for (m, _), outs in outputs.items() if m == method)
        print(f"  {method:12s} kernels {rate[True]:6.1f} tok/s (CI {lo_on:.1f}-{hi_on:.1f})  eager {rate[False]:6.1f} "
              f"(CI {lo_off:.1f}-{hi_off:.1f})  kernels/eager {rate[True] / rate[False]:.2f}x "
              f"(95% CI {lo:.2f}-{hi:.2f}), greedy outputs {'identical' if same else 'DIFFER'} (measured)")


def _measure(tgt, drf, prompts: list[tuple[str, torch.Tensor]], cfg: DecodeConfig,
             rounds: int) -> tuple[dict[tuple, RateSamples], dict[tuple, list]]:
    """Every (method, kernels on/off) arm on every prompt, interleaved, ``rounds`` times after a warm-up:
    the arms' samples, and each (method, prompt)'s outputs."""
    def decode(method: str, ids: torch.Tensor) -> list[int]:
        if method == "plain":
            return autoregressive(tgt.model, ids, cfg).token_ids
        drafter = build_drafter(drf.model, max_len=ids.shape[0] + cfg.room)
        return speculative(tgt.model, drafter, ids, cfg).token_ids

    arms = [(m, k) for m in ("plain", "speculative") for k in (True, False)]
    tokens = {a: [[] for _ in prompts] for a in arms}
    seconds = {a: [[] for _ in prompts] for a in arms}
    outputs: dict[tuple, list] = {}
    with torch.inference_mode():
        for _, ids in prompts[:2]:  # warm-up
            for method, kern in arms:
                tgt.model.use_kernels = drf.model.use_kernels = kern
                decode(method, ids)
        for _ in range(rounds):
            for i, (_, ids) in enumerate(prompts):
                for arm in arms:
                    tgt.model.use_kernels = drf.model.use_kernels = arm[1]
                    t0 = time.perf_counter()
                    out = decode(arm[0], ids)
                    seconds[arm][i].append(time.perf_counter() - t0)
                    tokens[arm][i].append(len(out))
                    outputs.setdefault((arm[0], i), []).append(out)
    ids = tuple(pid for pid, _ in prompts)
    return {a: RateSamples(ids, tuple(map(tuple, tokens[a])), tuple(map(tuple, seconds[a]))) for a in arms}, outputs


if __name__ == "__main__":
    opts.run_script(main)
