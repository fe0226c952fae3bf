"""Sampling acceptance from the teacher-forced TV, checked on held-out prompts: tokens per cycle for
N = 1..8 predicted from the stored 1 - TV per position (no speculative run) against measured exact
speculative sampling, and Yin et al.'s "expected rejections = Σ TV" over whole generations.

Usage (about 10 minutes alone on one CPU thread with the defaults):

    OMP_NUM_THREADS=1 python benchmarks/tv_acceptance.py --db sqlite:////tmp/tv.db

1. Profile with ``--temperature`` on the tuning half (or reuse ``--run``): it stores, for each tuning
   prompt's target-sampled generation, 1 - TV(p, q) and the draft's top probability per position.
2. Predict E[τ] for N = 1..8 from those (``predict --acceptance-source tv``) and, for comparison, from
   the profile's sampling traces (``--acceptance-source traces``).
3. Measure E[τ] on the held-out prompts: exact speculative sampling, ``--seeds`` generations per prompt
   and N (cycles counted; 95% CI: bootstrap over prompts). Goal: |error| ≤ 3 % for every N.
4. Σ TV: for every measured generation, 1 - TV is read teacher-forced at each position where a draft
   token was verified; the sum of TV there is the expected number of rejections (Theorem 1: a verified
   position rejects with probability TV at its context, whatever came before). Compared with the
   rejections counted, in total and as a ratio with a bootstrap CI over generations.

Writes ``benchmarks/results/tv_acceptance_cpu_<workload>.txt`` and ``.json``.
"""
from __future__ import annotations

import os
import platform
import time
from typing import Annotated

import numpy as np
import torch
import typer

from _bench import held_out_pair, profile_run, write_results
from specdec_tune.cli import _options as opts
from specdec_tune.db import open_database
from specdec_tune.engine import DecodeConfig
from specdec_tune.engine.drafters import probs_from_logits
from specdec_tune.profiler.runs import DraftSpec, decode_once
from specdec_tune.tuner.model import SpecConfig, load_run_profile, predict

GOAL = 0.03

Db = Annotated[str, typer.Option("--db", metavar="URL", help="Results database URL (required here).")]
Run = Annotated[int | None, typer.Option("--run", help="Reuse a profile run made with --temperature.")]
Temperature = Annotated[float, typer.Option("--temperature", help="Sampling temperature.")]
Seeds = Annotated[int, typer.Option("--seeds", help="Generations per held-out prompt and N.")]
Ns = Annotated[str, typer.Option("--ns", help="N values, comma-separated.")]
MaxPrompts = Annotated[int | None, typer.Option("--max-prompts", help="Held-out prompts (default: all).")]
Out = Annotated[str | None, typer.Option("--out", help="Result file stem (default in benchmarks/results).")]


def tv_along(target, draft, ids: torch.Tensor, new: list[int], temperature: float) -> np.ndarray:
    """TV(p, q) at each generated position of ``new`` after ``ids`` (teacher-forced, one forward each)."""
    seq = torch.cat([ids, torch.tensor(new, dtype=ids.dtype)])[None, :-1]
    with torch.inference_mode():
        lp, lq = target.model(input_ids=seq, use_cache=False).logits[0], draft.model(input_ids=seq, use_cache=False).logits[0]
    vocab = min(lp.shape[-1], lq.shape[-1])
    start = ids.shape[0] - 1
    p = probs_from_logits(lp[start:, :vocab].double(), temperature)
    q = probs_from_logits(lq[start:, :vocab].double(), temperature)
    return (0.5 * (p - q).abs().sum(-1)).numpy()


def verified_positions(result) -> tuple[list[int], int]:
    """Output positions where a draft token was verified, and the rejections counted."""
    positions, rejections, j = [], 0, 0
    for c in result.cycles:
        verified = c.accepted + 1 if c.accepted < c.drafted else c.drafted
        positions += [k for k in range(j, j + verified) if k < len(result.token_ids)]
        rejections += c.accepted < c.drafted
        j += c.emitted
    return positions, rejections


def bootstrap(values: np.ndarray, stat, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), (4000, len(values)))
    s = np.array([stat(values[i]) for i in idx])
    return float(np.quantile(s, 0.025)), float(np.quantile(s, 0.975))


def measure(target, draft, prompts, n: int, seeds: int, temperature: float, max_new: int):
    """Per prompt (cycles, tokens-per-cycle sum), and per generation (Σ TV at verified positions, rejections)."""
    per_prompt, per_gen = [], []
    for i, ids in enumerate(prompts):
        cycles = taus = 0
        for s in range(seeds):
            cfg = DecodeConfig(max_new_tokens=max_new, num_speculative_tokens=n, temperature=temperature,
                               eos_token_id=target.eos_token_id)
            res = decode_once(target, draft, ids, cfg, seed=10_000 * n + 100 * i + s)
            cycles += len(res.cycles)
            taus += sum(c.accepted + 1 for c in res.cycles)
            positions, rejections = verified_positions(res)
            tv = tv_along(target, draft.model, ids, res.token_ids, temperature)
            per_gen.append((float(tv[positions].sum()), rejections))
        per_prompt.append((cycles, taus))
    return np.array(per_prompt, dtype=float), np.array(per_gen, dtype=float)


def main(
    db: Db,
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    draft: opts.BundledDraftOption = opts.BUNDLED_DRAFT,
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    run: Run = None,
    temperature: Temperature = 1.0,
    seeds: Seeds = 3,
    ns: Ns = "1,2,3,4,5,6,7,8",
    max_prompts: MaxPrompts = None,
    out: Out = None,
) -> None:
    args = dict(locals())
    started, load_before = time.perf_counter(), os.getloadavg()
    database = open_database(db)
    run = profile_run(database, run, target, draft, workload, temperature=temperature, front_prompts=0)
    rp = load_run_profile(database, run, draft)
    max_new = rp.max_new_tokens
    tgt, drf, prompts = held_out_pair(target, draft, workload, max_prompts)
    lines = [f"acceptance from TV: target {target}, draft {draft}, workload {workload}, run {run}, T = {temperature}; "
             f"{len(prompts)} held-out prompts x {seeds} generations per N, {max_new} new tokens; "
             f"{platform.node()} {time.strftime('%Y-%m-%d')}; load average {load_before[0]:.2f}", "",
             f"{'N':>2} {'τ measured':>10} {'95% CI':>13} {'τ from tv':>9} {'error':>7} {'τ from traces':>13} {'error':>7}"]
    rows, gens = [], []
    for n in (int(x) for x in ns.split(",")):
        per_prompt, per_gen = measure(tgt, DraftSpec("model", drf), prompts, n, seeds, temperature, max_new)
        gens.append(per_gen)
        tau = per_prompt[:, 1].sum() / per_prompt[:, 0].sum()
        ci = bootstrap(per_prompt, lambda x: x[:, 1].sum() / x[:, 0].sum())
        pred = {src: predict(rp.model, SpecConfig(n, mode="sampling", acceptance_source=src)).expected_tokens_per_cycle
                for src in ("tv", "traces")}
        err = {src: v / tau - 1 for src, v in pred.items()}
        rows.append({"N": n, "tau_measured": tau, "ci95": list(ci), "tau_tv": pred["tv"], "error_tv": err["tv"],
                     "tau_traces": pred["traces"], "error_traces": err["traces"], "label_tv": "predicted (tv per position)"})
        lines.append(f"{n:>2} {tau:10.3f} {ci[0]:6.3f}-{ci[1]:<6.3f} {pred['tv']:9.3f} {err['tv'] * 100:+6.1f}% "
                     f"{pred['traces']:13.3f} {err['traces'] * 100:+6.1f}%")
    worst = max(abs(r["error_tv"]) for r in rows)
    lines.append(f"worst |error| of the tv source over N = {ns}: {worst * 100:.1f}% (goal ≤ {GOAL * 100:.0f}%: "
                 f"{worst <= GOAL})")
    g = np.concatenate(gens)
    ratio = g[:, 1].sum() / g[:, 0].sum()
    rci = bootstrap(g, lambda x: x[:, 1].sum() / x[:, 0].sum())
    lines += ["", f"rejections = Σ TV (Yin et al. Theorem 1) over {len(g)} generations: counted {int(g[:, 1].sum())}, "
              f"Σ TV at the verified positions {g[:, 0].sum():.1f}; counted / expected = {ratio:.3f} "
              f"(95% CI {rci[0]:.3f}-{rci[1]:.3f})", f"total {time.perf_counter() - started:.0f} s"]
    text = "\n".join(lines)
    print(text)
    write_results(out, f"tv_acceptance_cpu_{workload}", text, {
        "args": args, "run_id": run, "rows": rows, "rejections": {"counted": float(g[:, 1].sum()),
        "sum_tv": float(g[:, 0].sum()), "ratio": ratio, "ci95": list(rci)}})


if __name__ == "__main__":
    opts.run_script(main)
