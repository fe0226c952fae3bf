"""Tokens/s per batch size, plain and speculative, of our engine on the bundled pair (issue 38, part 2).

B = 1 runs the one-sequence engine (``profiler.run_bench``: our baseline and speculative decoding, prompt by
prompt); each B > 1 the batched engine (``profiler.run_bench_batches``: consecutive batches of B prompts, plain
and speculative interleaved batch by batch, each batch one timed call with its prefill, until its last sequence
finished). Every greedy output is judged against its prompt decoded alone (float32: identical). The speedup's
95% CI is the paired bootstrap over prompts (B = 1) or batches (B > 1).

    OMP_NUM_THREADS=1 python benchmarks/batch_throughput.py --workload benchmarks/workloads/functions-240.jsonl \\
        --max-prompts 32 --batch-sizes 1,2,4,8,16 --ns 2,4 --repeats 2

Writes ``benchmarks/results/batch_throughput_cpu.txt`` and ``.json`` (labelled noisy: a shared VM).
"""
from __future__ import annotations

import time

import torch

from _bench import write_results  # benchmarks/ is this script's folder
from specdec_tune.cli import _options as opts
from specdec_tune.engine import load_model, load_workload
from specdec_tune.profiler import encode_prompt, run_bench, run_bench_batches


def main(target: str = "mini-target", draft: str = "mini-draft-1l",
         workload: str = "benchmarks/workloads/functions-240.jsonl", max_prompts: int = 32,
         batch_sizes: str = "1,2,4,8,16", ns: str = "2,4", max_new_tokens: int = 64, repeats: int = 2,
         threads: int = 1, out: str | None = None) -> None:
    """Measure plain and speculative tokens/s at every batch size; write the table."""
    started = time.perf_counter()
    torch.set_num_threads(threads)
    tgt, drf = load_model(target, "cpu"), load_model(draft, "cpu")
    ids = [encode_prompt(tgt, p.prompt, p.id) for p in load_workload(workload)[:max_prompts]]
    sizes = [int(b) for b in batch_sizes.split(",")]
    rows = []
    for n in (int(x) for x in ns.split(",")):
        if 1 in sizes:
            r = run_bench(tgt, drf, ids, num_speculative_tokens=n, max_new_tokens=max_new_tokens, repeats=repeats,
                          methods=("ours_baseline", "ours_speculative"))
            ci = r.ratio_ci("ours_speculative", "ours_baseline")
            rows.append(_row(1, n, len(ids), r.methods["ours_baseline"].tokens_per_s,
                             r.methods["ours_speculative"].tokens_per_s, ci, r.verdict))
        for b in run_bench_batches(tgt, drf, ids, [x for x in sizes if x > 1], num_speculative_tokens=n,
                                   max_new_tokens=max_new_tokens, repeats=repeats):
            j = b.to_json()
            rows.append(_row(b.batch_size, n, len(b.batches), j["tokens_per_s"]["ours_baseline"],
                             j["tokens_per_s"]["ours_speculative"], j["speedup_ci95"], j["consistency"]["verdict"]))
        print(f"N={n}: {time.perf_counter() - started:.0f} s", flush=True)
    head = [f"tokens/s per batch size: {target} + {draft}, {workload}, {len(ids)} prompts x {max_new_tokens} new "
            f"tokens, {repeats} repeats, CPU, {threads} thread(s); measured, end to end (prefill included; per batch "
            "at B > 1, until its last sequence finished)",
            "NOISY: a shared 2-core VM with other processes running; the coordinator reruns this on a quiet machine", "",
            f"{'B':>3} {'N':>3} {'units':>6} {'plain tok/s':>12} {'spec tok/s':>11} {'speedup':>8} {'95% CI':>13} outputs"]
    lines = [f"{r['B']:>3} {r['N']:>3} {r['units']:>6} {r['plain']:>12.1f} {r['speculative']:>11.1f} "
             f"{r['speedup']:>7.2f}× {r['ci']:>13} {r['outputs']}" for r in rows]
    text = "\n".join(head + lines + [f"total {time.perf_counter() - started:.0f} s"])
    print(text)
    args = {"target": target, "draft": draft, "workload": workload, "max_prompts": max_prompts, "batch_sizes": sizes,
            "ns": ns, "max_new_tokens": max_new_tokens, "repeats": repeats, "threads": threads}
    write_results(out, "batch_throughput_cpu", text, {"rows": rows, "args": args, "label": "measured, noisy"})


def _row(b: int, n: int, units: int, plain: float, spec: float, ci, outputs: str) -> dict:
    return {"B": b, "N": n, "units": units, "plain": plain, "speculative": spec, "speedup": spec / plain,
            "ci": f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "no CI", "ci95": list(ci) if ci else None, "outputs": outputs}


if __name__ == "__main__":
    opts.run_script(main)
