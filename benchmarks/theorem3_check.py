"""The batch-speculative-decoding rejection formula against simulation, as seed 003's figure does.

Yin et al. 2024 (seed 003) check their batch theorem by simulating Markov-chain target and draft
models: the running mean of the rejections over more and more runs settles on the theoretical value
for M = 4 and M = 5, and the theoretical rejections fall with M towards a limit. This script does the
same with the engine's own ``chains:M`` tree decoding (``engine.tree_decode``) of bigram target and
draft models whose transition matrices are random Dirichlet draws, against
``tuner.model.batch_rejections`` (the exact (token, depth) Markov-chain sum; its docstring derives it).

    OMP_NUM_THREADS=1 python benchmarks/theorem3_check.py

Writes ``benchmarks/results/theorem3_check.txt`` and ``.json``: for M = 4 and 5 the running mean
(with its standard error) at 50, 100, 200, 500, 1000, 2000 runs next to the formula; and the formula
for M = 1..10 and M -> ∞ next to simulated means.
"""
from __future__ import annotations

import platform
import sys
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import typer

from specdec_tune.engine import DecodeConfig
from specdec_tune.engine.tree_decode import tree_speculative
from specdec_tune.engine.tree_draft import TreeDrafter
from specdec_tune.core.trees import parse_tree
from specdec_tune.tuner.model import batch_rejection_limit, batch_rejections

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._bench import write_results  # noqa: E402
from tests.support.stub_models import Bigram  # noqa: E402  (the bigram LM of the exactness tests)
CHECKPOINTS = (50, 100, 200, 500, 1000, 2000, 5000)

app = typer.Typer(add_completion=False)


def simulate(P: np.ndarray, Q: np.ndarray, m: int, tokens: int, depth: int, runs: int, seed: int) -> np.ndarray:
    """Rejections of each of ``runs`` engine decodes (chains:M of depth K over T tokens)."""
    target, draft = Bigram(torch.tensor(np.log(P))), Bigram(torch.tensor(np.log(Q)))
    gen = torch.Generator().manual_seed(seed)
    cfg = DecodeConfig(max_new_tokens=tokens, num_speculative_tokens=depth, temperature=1.0)
    out = np.zeros(runs)
    with torch.no_grad():
        for i in range(runs):
            drafter = TreeDrafter(draft, tokens + m * depth + 4, parse_tree(f"chains:{m}"), temperature=1.0, generator=gen)
            res = tree_speculative(target, drafter, torch.tensor([0]), cfg, gen)
            out[i] = sum(c.accepted < c.drafted // m and c.emitted == c.accepted + 1 for c in res.cycles)
    return out


@app.command()
def main(
    vocab: Annotated[int, typer.Option("--vocab", help="States of the Markov chains.")] = 12,
    tokens: Annotated[int, typer.Option("--tokens", help="T, output tokens per run.")] = 40,
    depth: Annotated[int, typer.Option("--depth", help="K, tokens per draft chain.")] = 4,
    runs: Annotated[int, typer.Option("--runs", help="Simulated runs for M = 4 and 5.")] = 2000,
    scan_runs: Annotated[int, typer.Option("--scan-runs", help="Simulated runs per M of the M = 1..10 scan.")] = 300,
    concentration: Annotated[float, typer.Option("--concentration", help="Dirichlet concentration of the rows.")] = 0.5,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: Annotated[str, typer.Option("--out", help="Result file stem in benchmarks/results.")] = "theorem3_check",
) -> None:
    """Simulate batch speculative decoding with the engine and compare with the formula."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(vocab) * concentration, size=vocab)
    Q = rng.dirichlet(np.ones(vocab) * concentration, size=vocab)
    started = time.time()
    lines = [f"# batch speculative decoding: formula vs the engine's chains:M decoding ({time.strftime('%Y-%m-%d')}, "
             f"{platform.node()}, {platform.processor() or platform.machine()})",
             f"# V = {vocab}, T = {tokens} tokens, K = {depth} per chain, Dirichlet({concentration}) rows, seed {seed}",
             "", "## running mean of the rejections (the seed's figure, middle panel)", "",
             "| M | runs | simulated mean ± s.e. | formula | z |", "|---|---|---|---|---|"]
    report: dict = {"vocab": vocab, "tokens": tokens, "depth": depth, "seed": seed, "convergence": {}, "scan": []}
    for m in (4, 5):
        exact = batch_rejections(P, Q, 0, tokens, m, depth)
        sims = simulate(P, Q, m, tokens, depth, runs, seed + m)
        rows = []
        for n in (c for c in CHECKPOINTS if c <= runs):
            mean, se = float(sims[:n].mean()), float(sims[:n].std(ddof=1) / np.sqrt(n))
            rows.append({"runs": n, "mean": mean, "se": se, "formula": exact})
            lines.append(f"| {m} | {n} | {mean:.3f} ± {se:.3f} | {exact:.3f} | {(mean - exact) / se:+.2f} |")
        report["convergence"][m] = rows
    limit, reached = batch_rejection_limit(P, Q, 0, tokens, depth)
    lines += ["", "## rejections against M (the seed's figure, right panel)", "",
              "| M | formula | simulated mean ± s.e. |", "|---|---|---|"]
    for m in range(1, 11):
        exact = batch_rejections(P, Q, 0, tokens, m, depth)
        sims = simulate(P, Q, m, tokens, depth, scan_runs, seed + 100 + m)
        mean, se = float(sims.mean()), float(sims.std(ddof=1) / np.sqrt(len(sims)))
        report["scan"].append({"m": m, "formula": exact, "mean": mean, "se": se})
        lines.append(f"| {m} | {exact:.3f} | {mean:.3f} ± {se:.3f} |")
    lines.append(f"| ∞ | {limit:.3f} (converged by M = {reached}) | |")
    report["limit"] = limit
    report["seconds"] = time.time() - started
    write_results(None, out, "\n".join(lines), report)
    print("\n".join(lines))


if __name__ == "__main__":
    app()
