"""Memory fidelity: each configuration's predicted memory against its measured peak, in a fresh process.

For every (draft, N, new tokens, prompt) of the grid the probe (``profiler/memory.py``) decodes once and
reports the configuration's own peak (CPU: peak resident set over a warmed-up baseline; GPU:
``torch.cuda.max_memory_allocated``); the memory model (``tuner.model.MemoryModel``: weights, the lean
forward's packed copy, both KV caches, graph pools) predicts it from the models' configs alone.
Goal: every |error| ≤ 10 %.

Usage (about 1 minute per configuration on a busy 2-core CPU; memory does not depend on load):

    OMP_NUM_THREADS=1 python benchmarks/memory_fidelity.py

Writes ``benchmarks/results/memory_fidelity_<device>.txt`` and ``.json``.
"""
from __future__ import annotations

import os
import time
import types
from typing import Annotated

import typer

from _bench import write_results  # benchmarks/ is this script's folder
from specdec_tune.cli import _options as opts
from specdec_tune.engine.workloads import load_workload
from specdec_tune.profiler.memory import measure_peak_memory
from specdec_tune.tuner.model import Candidate, MemoryModel
from specdec_tune.tuner.search._memory import model_memory

GOAL = 0.10
DEFAULT_GRID = ("none:0,mini-draft-1l:4,mini-draft-2l:4,ngram:4,mini-draft-2l:8")

Grid = Annotated[str, typer.Option("--grid", help="draft:N items, comma-separated (draft 'none': plain decoding).")]
NewTokens = Annotated[str, typer.Option("--new-tokens", help="Decode lengths (the caches' size), comma-separated.")]
Prompts = Annotated[str, typer.Option("--prompts", help=(
    "Workload prompt indices, comma-separated (a short prompt packs plain decoding's weights, a long one does not)."))]
Device = Annotated[str, typer.Option("--device", help="cpu | cuda | auto.")]
Out = Annotated[str | None, typer.Option("--out", help="Result file stem (default in benchmarks/results).")]


def _facts(name: str, device: str):
    from specdec_tune.engine import load_model

    m = load_model(name, device)
    record = types.SimpleNamespace(name=name, extra={"source": m.source}, dtype=str(m.dtype).replace("torch.", ""),
                                   num_parameters=m.num_parameters)
    return model_memory(record, device=m.device.type, forward=m.forward)


def main(
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    grid: Grid = DEFAULT_GRID,
    new_tokens: NewTokens = "64,640",
    prompts: Prompts = "0,9",
    device: Device = "cpu",
    out: Out = None,
) -> None:
    args = dict(locals())
    items = [(d, int(n)) for d, n in (x.split(":") for x in grid.split(","))]
    drafts = {d for d, _ in items if d not in ("none", "ngram")}
    mm_target = _facts(target, device)
    mm_drafts = {d: _facts(d, device) for d in drafts}
    texts = load_workload(workload)
    rows, started = [], time.perf_counter()
    for index in (int(i) for i in prompts.split(",")):
        for new in (int(x) for x in new_tokens.split(",")):
            for draft, n in items:
                m = measure_peak_memory(target, draft, n, texts[index].prompt, max_new_tokens=new, device=device)
                mm = MemoryModel(mm_target, mm_drafts, m.prompt_tokens + new)
                p = mm.breakdown(Candidate(draft, n), 1, m.prompt_tokens + new, m.prompt_tokens)
                rows.append({"draft": draft, "N": n, "prompt": texts[index].id, "prompt_tokens": m.prompt_tokens,
                             "new_tokens": new, "measured_bytes": m.bytes, "baseline_bytes": m.baseline_bytes,
                             "method": m.method, "predicted": p.to_dict(), "error": (p.total - m.bytes) / m.bytes})
                r = rows[-1]
                print(f"{draft:>14} N={n:<2} prompt {r['prompt']} ({m.prompt_tokens:>3} tokens) + {new:>3} new: measured "
                      f"{m.bytes / 2**20:6.1f} MiB, predicted {p.total / 2**20:6.1f} MiB, error {r['error'] * 100:+5.1f}%",
                      flush=True)
    errors = [abs(r["error"]) for r in rows]
    lines = [f"memory fidelity: target {target}, device {device}, {time.strftime('%Y-%m-%d')}, load average "
             f"{os.getloadavg()[0]:.2f} (memory does not depend on load); method: {rows[0]['method']}", "",
             f"{'configuration':<22} {'prompt':>12} {'new':>4} {'measured MiB':>12} {'predicted MiB':>13} {'error':>7}  "
             f"breakdown (MiB)"]
    for r in rows:
        parts = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in r["predicted"].items() if k != "total" and v)
        lines.append(f"{r['draft'] + ' N=' + str(r['N']):<22} {r['prompt'] + ' (' + str(r['prompt_tokens']) + ')':>12} "
                     f"{r['new_tokens']:>4} {r['measured_bytes'] / 2**20:12.1f} {r['predicted']['total'] / 2**20:13.1f} "
                     f"{r['error'] * 100:+6.1f}%  {parts}")
    lines += ["", f"{len(rows)} configurations: median |error| {sorted(errors)[len(errors) // 2] * 100:.1f}%, worst "
              f"{max(errors) * 100:.1f}%; goal every |error| <= {GOAL * 100:.0f}%: {max(errors) <= GOAL}",
              f"total {time.perf_counter() - started:.0f} s"]
    text = "\n".join(lines)
    print(text)
    write_results(out, f"memory_fidelity_{device}", text, {"args": args, "rows": rows, "date": time.strftime("%Y-%m-%d")})


if __name__ == "__main__":
    opts.run_script(main)
