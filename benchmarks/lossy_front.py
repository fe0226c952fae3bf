"""Lossy acceptance on the bundled pair: the rejection–bias front (theory against measurement) and what
the bias costs in quality, judged by the target itself.

Usage (about 10 minutes alone on one CPU thread with the defaults):

    OMP_NUM_THREADS=1 python benchmarks/lossy_front.py --db sqlite:////tmp/lossy.db

1. Profile the target and draft with ``--temperature`` on the tuning half (or reuse ``--run``): the
   profile stores the front (``profiler.lossy_front``): for Decoding-OPT and Decoding-UNO at each
   over-acceptance ε, the rejection and bias per verified position computed exactly from p and q at
   teacher-forced positions of target-sampled text (theory, Yin et al. 2024 Theorems 4-5), and the
   same from lossy decoding runs (measured: rejections counted, the bias of each verified step
   computed from its p and q). Printed next to Theorem 5's least bias.
2. Quality without a reward model, on the held-out prompts: ``--samples`` continuations per prompt from
   exact speculative sampling and from OPT and UNO at each ``--quality-eps``; each continuation is
   scored by the target's mean log-likelihood per token at the sampling temperature. Reported: each
   rule's mean score minus exact decoding's (paired by prompt, 95% bootstrap CI over prompts), and a
   WinRate analogue: the share of prompts where OPT's mean score beats UNO's, with its 95% Wilson CI.
   OPT and UNO draw with the same seeds (common random numbers), so their continuations coincide until
   a rejection, where only the resampling distribution differs; prompts where no rejection told them
   apart are ties, counted apart and left out of the share.

Writes ``benchmarks/results/lossy_front_cpu_<workload>.txt`` and ``.json``.
"""
from __future__ import annotations

import os
import platform
import time
from typing import Annotated

import numpy as np
import torch
import typer
from scipy import stats

from _bench import held_out_pair, profile_run, write_results
from specdec_tune.cli import _options as opts
from specdec_tune.core.stats import bootstrap
from specdec_tune.db import BiasFrontRow, load_bias_front, open_database
from specdec_tune.engine import DecodeConfig
from specdec_tune.profiler.runs import DraftSpec, decode_once

Db = Annotated[str, typer.Option("--db", metavar="URL", help="Results database URL (required here).")]
Run = Annotated[int | None, typer.Option("--run", help="Reuse a profile run made with --temperature.")]
Temperature = Annotated[float, typer.Option("--temperature", help="Sampling temperature.")]
FrontPrompts = Annotated[int, typer.Option("--front-prompts", help="Prompts each rule and ε decodes in the profile.")]
Samples = Annotated[int, typer.Option("--samples", help="Continuations per held-out prompt and rule.")]
QualityEps = Annotated[str, typer.Option("--quality-eps", help="ε values of the quality comparison, comma-separated.")]
MaxPrompts = Annotated[int | None, typer.Option("--max-prompts", help="Held-out prompts scored (default: all).")]
Out = Annotated[str | None, typer.Option("--out", help="Result file stem (default in benchmarks/results).")]


def front_lines(rows) -> list[str]:
    """The stored front as a table: theory and measured side by side per rule and ε."""
    by = {(r.method, r.epsilon, r.source): r for r in rows}
    lines = [f"{'rule':<6} {'ε':>5} {'rejection theory':>16} {'measured':>9} {'bias theory':>12} {'measured':>9} "
             f"{'Thm 5 least bias':>16} {'positions t/m':>14}"]
    for method in ("opt", "uno"):
        for eps in sorted({r.epsilon for r in rows if r.method == method}):
            t, m = by.get((method, eps, "theory")), by.get((method, eps, "measured"))
            if t is None:
                continue
            lines.append(f"{method.upper():<6} {eps:5g} {t.rejection:16.4f} {m.rejection if m else float('nan'):9.4f} "
                         f"{t.bias:12.4f} {m.bias if m else float('nan'):9.4f} {t.pareto_bias or 0:16.4f} "
                         f"{t.positions:>6}/{m.positions if m else 0:<6}")
    return lines


def score(target, ids: torch.Tensor, new: list[int], temperature: float) -> float:
    """The target's mean log-likelihood per generated token at ``temperature`` (teacher-forced)."""
    seq = torch.cat([ids, torch.tensor(new, dtype=ids.dtype)])
    with torch.inference_mode():
        logits = target.model(input_ids=seq[None, :-1], use_cache=False).logits[0, ids.shape[0] - 1:]
        logp = torch.log_softmax(logits.double() / temperature, -1)
        return float(logp.gather(1, torch.tensor(new)[:, None]).mean())


def quality(target, draft, prompts, temperature: float, eps: list[float], samples: int, n: int,
            max_new: int) -> dict[str, np.ndarray]:
    """Rule -> [prompt] mean score over ``samples`` continuations (rules: exact, opt ε, uno ε)."""
    rules = [("exact", 0.0)] + [(m, e) for e in eps for m in ("opt", "uno")]
    out = {f"{m} {e:g}" if m != "exact" else "exact": np.zeros(len(prompts)) for m, e in rules}
    for i, ids in enumerate(prompts):
        for m, e in rules:
            cfg = DecodeConfig(max_new_tokens=max_new, num_speculative_tokens=n, temperature=temperature,
                               eos_token_id=target.eos_token_id, acceptance=m, epsilon=e)
            vals = [score(target, ids, decode_once(target, draft, ids, cfg, seed=1000 * i + k).token_ids, temperature)
                    for k in range(samples)]
            out[f"{m} {e:g}" if m != "exact" else "exact"][i] = float(np.mean(vals))
    return out


def paired_ci(diff: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap CI of the mean of per-prompt differences."""
    return bootstrap(lambda picked, _: diff[picked].mean(1), len(diff), resamples=4000, seed=seed).interval


def main(
    db: Db,
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    draft: opts.BundledDraftOption = opts.BUNDLED_DRAFT,
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    run: Run = None,
    temperature: Temperature = 1.0,
    front_prompts: FrontPrompts = 8,
    samples: Samples = 3,
    quality_eps: QualityEps = "0.003,0.03",
    max_prompts: MaxPrompts = None,
    out: Out = None,
) -> None:
    args = dict(locals())
    started, load_before = time.perf_counter(), os.getloadavg()
    database = open_database(db)
    run = profile_run(database, run, target, draft, workload, temperature=temperature, front_prompts=front_prompts)
    rows = [r for r in load_bias_front(database, run) if r.temperature == temperature]
    tgt, drf, prompts = held_out_pair(target, draft, workload, max_prompts)
    eps = [float(x) for x in quality_eps.split(",") if x.strip()]
    scores = quality(tgt, DraftSpec("model", drf), prompts, temperature, eps, samples, 4, 64)
    result = {"args": args, "run_id": run, "header": f"lossy acceptance: target {target}, draft {draft}, workload "
              f"{workload}, run {run}, T = {temperature}; {platform.node()} {time.strftime('%Y-%m-%d')}; load average "
              f"{load_before[0]:.2f}", "front": [r.__dict__ for r in rows], "prompts": len(prompts), "samples": samples,
              "quality": summarize_quality(scores, eps), "scores": {k: v.tolist() for k, v in scores.items()},
              "seconds": time.perf_counter() - started}
    text = render(result)
    print(text)
    write_results(out, f"lossy_front_cpu_{workload}", text, result)


def summarize_quality(scores: dict[str, np.ndarray], eps: list[float]) -> dict[str, dict]:
    """Each lossy rule's mean score minus exact decoding's (paired CI), and OPT's WinRate over UNO per ε."""
    out: dict[str, dict] = {}
    for rule, s in scores.items():
        if rule != "exact":
            d = s - scores["exact"]
            out[rule] = {"delta_loglik": float(d.mean()), "ci95": list(paired_ci(d))}
    for e in eps:
        opt, uno = scores[f"opt {e:g}"], scores[f"uno {e:g}"]
        wins, ties = int((opt > uno).sum()), int((opt == uno).sum())
        decided = len(opt) - ties  # a tie (no rejection told the two apart) counts for neither
        ci = stats.binomtest(wins, decided).proportion_ci(method="wilson") if decided else None
        out[f"winrate {e:g}"] = {"wins": wins, "ties": ties, "prompts": len(opt),
                                 "ci95": [ci.low, ci.high] if ci else None}
    return out


def render(result: dict) -> str:
    """The result file's text from its JSON (``python -c`` can re-render a stored result)."""
    lines = [result["header"], "", "front per verified position (theory: exact at teacher-forced positions; "
             "measured: lossy decoding runs)"]
    lines += front_lines([BiasFrontRow(**r) for r in result["front"]])
    lines += ["", f"quality on {result['prompts']} held-out prompts x {result['samples']} continuations (N = 4, 64 new "
              "tokens): target mean log-likelihood per token minus exact decoding's"]
    for rule, q in result["quality"].items():
        if rule.startswith("winrate"):
            w, ties, n, ci = q["wins"], q.get("ties", 0), q["prompts"], q["ci95"]
            share = f"{w}/{n - ties} = {w / (n - ties):.2f} (95% Wilson CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else "-"
            lines.append(f"  WinRate OPT over UNO at ε = {rule.split()[1]}: {share} of the prompts where they differ; "
                         f"{ties} of {n} tied")
        else:
            lines.append(f"  {rule.upper():<9} {q['delta_loglik']:+.4f} nats/token (95% CI {q['ci95'][0]:+.4f} "
                         f"to {q['ci95'][1]:+.4f})")
    lines.append(f"total {result['seconds']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    opts.run_script(main)
