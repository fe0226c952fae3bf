"""Draft acceptance in llama-server against our engine, on the same prompts, from the exported files.

Usage: OMP_NUM_THREADS=1 python benchmarks/llamacpp_acceptance.py [--target mini-target]
       [--draft mini-draft-1l] [--n 4,8] [--thresholds 0,0.5] [--workload functions] [--max-prompts 8]
       [--max-new-tokens 64]
Needs scripts/setup_llamacpp.sh's build. For each (N, θ) it writes ``export --format llamacpp`` (GGUF
files included), starts its launch.sh, decodes the workload's last prompts greedily, and reads
llama-server's counters (/metrics). The same prompts then run in our engine twice: scheduled as
llama-server does (profiler/backends/_llamacpp_parity.py: prefill token, n_remaining - 1 drafts, p_min over
the draft's top-10) and with the engine's own loop and θ rule. Counts, not timings: they do not
depend on the machine's load. Prints per row drafts, draft tokens, accepted, acceptance rate
(accepted / draft tokens), mean acceptance length (1 + accepted / drafts) and beta_i per position.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated

import torch
import typer

from specdec_tune.cli import _options as opts
from specdec_tune.engine import DecodeConfig, build_drafter, load_model, speculative
from specdec_tune.engine.workloads import load_workload
from specdec_tune.profiler.backends._llamacpp import find_llamacpp
from specdec_tune.profiler.backends._llamacpp_parity import LlamacppDrafter, compare_prompt, engine_like_llamacpp
from specdec_tune.profiler.backends._llamacpp_server import LlamaServer, completions_with_counters
from specdec_tune.profiler.runs import encode_prompt
from specdec_tune.profiler.backends._vllm import SpecCounters, counters_from_steps
from specdec_tune.tuner.model import Candidate, TuningResult
from specdec_tune.tuner.servers import write_exports

NList = Annotated[str, typer.Option("--n", help="Comma-separated N values.")]
Thresholds = Annotated[str, typer.Option("--thresholds", help="Comma-separated θ values (--spec-draft-p-min).")]
Prompts = Annotated[int, typer.Option("--max-prompts", help="The workload's last prompts to decode.")]
MaxNew = Annotated[int, typer.Option("--max-new-tokens", help="n_predict (EOS ignored).")]


def _row(label: str, c: SpecCounters) -> str:
    rate = c.accepted / c.draft_tokens if c.draft_tokens else float("nan")
    beta = " ".join(f"{b:.2f}" for b in c.per_position_rate)
    return (f"  {label:34s} drafts {c.drafts:4d}  draft tokens {c.draft_tokens:5d}  accepted {c.accepted:5d}  "
            f"rate {rate:.3f}  mean length {c.mean_acceptance_length:.3f}  beta {beta}")


def _engine_runs(tgt, drf, prompts, done, counts, n: int, theta: float, max_new: int):
    """Per prompt: the comparison with llama-server (its schedule and rules), and our own loop's counters."""
    results, own = [], SpecCounters()
    for ids, completion, server in zip(prompts, done, counts):
        p, room = torch.tensor(ids), len(ids) + max_new + n + 2
        drafter = LlamacppDrafter(drf.model, room, p_min=theta)
        with torch.inference_mode():
            run = engine_like_llamacpp(tgt.model, drafter, p, max_new, n)
            res = speculative(tgt.model, build_drafter(drf.model, max_len=room, threshold=theta), p,
                              DecodeConfig(max_new, num_speculative_tokens=n, threshold=theta, eos_token_id=None))
        results.append(compare_prompt(tgt.model, ids, completion.token_ids, server, run, drafter, n))
        own = own + counters_from_steps([c.accepted for c in res.cycles], [c.drafted for c in res.cycles], n)
    return results, own


def main(
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    draft: opts.BundledDraftOption = opts.BUNDLED_DRAFT,
    n_values: NList = "4,8",
    thresholds: Thresholds = "0,0.5",
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    max_prompts: Prompts = 8,
    max_new_tokens: MaxNew = 64,
) -> None:
    llama = find_llamacpp()
    if llama is None:
        raise SystemExit("no llama.cpp build: run scripts/setup_llamacpp.sh (or set SPECDEC_LLAMACPP_DIR)")
    torch.set_num_threads(1)
    tgt, drf = load_model(target, "cpu", "float32"), load_model(draft, "cpu", "float32")
    prompts = [encode_prompt(tgt, p.prompt, p.id).tolist() for p in load_workload(workload)[-max_prompts:]]
    env = {**os.environ, "PATH": f"{llama.server.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    print(f"{target} + {draft}, {workload}: last {len(prompts)} prompts x {max_new_tokens} tokens, greedy, float32 "
          f"(GGUF f32 in llama.cpp {llama.home.name}); counted, not timed")
    for n in (int(x) for x in n_values.split(",")):
        for theta in (float(x) for x in thresholds.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                result = TuningResult(candidate=Candidate(draft, n, theta), server="llamacpp", target=target,
                                      workload=workload)
                write_exports(result, ["llamacpp"], Path(tmp))
                with LlamaServer(["sh", str(Path(tmp) / "llamacpp" / "launch.sh"), "--threads", "1"], env=env) as srv:
                    done, counts = completions_with_counters(srv, prompts, max_new_tokens)
            results, own = _engine_runs(tgt, drf, prompts, done, counts, n, theta, max_new_tokens)
            same = sum(r.same_output for r in results)
            verdicts = ", ".join(f"{i}: {r.verdict}" for i, r in enumerate(results) if not r.equal) or "none"
            print(f"N = {n}, θ = {theta:g}: greedy outputs identical for {same}/{len(prompts)} prompts; counters equal "
                  f"for {sum(r.equal for r in results)}/{len(prompts)}; prompts that differ: {verdicts}")
            print(_row("llama-server (/metrics)", sum((r.server for r in results), SpecCounters())))
            print(_row("engine, llama-server's schedule", sum((r.engine for r in results), SpecCounters())))
            print(_row("engine, its own loop and θ rule", own))


if __name__ == "__main__":
    typer.run(main)
