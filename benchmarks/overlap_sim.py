"""The throughput model against a simulated host and GPU (issue 37, F3): predicted vs simulated seconds of
plain decoding and of N ∈ {2, 3, 6, 12} at θ ∈ {0, 0.4}, in a host-bound, a GPU-bound and a balanced regime.

The simulator (``tests/support/host_gpu_sim.py``) and its profile through the profiler's real code
(``tests/support/host_gpu_profile.py``) are the ones ``tests/tuner/model/test_overlap.py`` checks at 2 %. No clock is read:
the numbers are exact, the same on every machine. ``--ablate`` also prints the model with one of its terms
switched off (the θ > 0 term, the hooks' tax, the first-cycle residual, plain decoding's M - 1 forwards and
its set-up), which shows what each term is worth.

Usage: python benchmarks/overlap_sim.py [--ablate] [--out PATH]
Writes ``benchmarks/results/overlap_sim.txt`` and ``.json``.
"""
from __future__ import annotations

import contextlib
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ is a package of the repository

from _bench import write_results  # noqa: E402  (benchmarks/ is this script's folder)
from specdec_tune.tuner.model import SpecConfig, predict_baseline, predict_config  # noqa: E402
from specdec_tune.tuner.model import _predict, _profile  # noqa: E402
from tests.support.host_gpu_profile import simulated_profile, simulated_seconds  # noqa: E402
from tests.support.host_gpu_sim import REGIMES  # noqa: E402

CONFIGS = [(0, 0.0)] + [(n, theta) for theta in (0.0, 0.4) for n in (2, 3, 6, 12)]


@contextlib.contextmanager
def ablated(term: str) -> Iterator[None]:
    """The model without one term (``none``: as it is)."""
    saved = {}

    def patch(module, name: str, value) -> None:
        saved[module, name] = getattr(module, name)
        setattr(module, name, value)

    if term == "theta":
        patch(_profile, "threshold_forward_s", lambda *a, **k: 0.0)
    elif term == "hook tax":
        patch(_profile, "hook_tax", lambda samples: 0.0)
    elif term == "first cycle":
        patch(_profile, "first_cycle_residuals", lambda *a, **k: [])
    elif term == "plain M forwards":
        step = _predict.plain_step_s
        patch(_predict, "plain_seconds", lambda rp, b, p, n: n * step(rp, b, p, n) - rp.plain_setup_s)
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def table(term: str) -> tuple[list[str], list[dict]]:
    lines, rows = [f"model {'as it is' if term == 'none' else f'without {term}'}: predicted vs simulated seconds"], []
    for regime in REGIMES:
        with ablated(term):
            run = simulated_profile(regime)
            errors = []
            for n, theta in CONFIGS:
                p = predict_baseline(run.baseline) if n == 0 else predict_config(run.profile, SpecConfig(n, theta))
                s = simulated_seconds(run, n, theta)
                errors.append(p.seconds / s - 1)
                rows.append({"term_off": term, "regime": regime.name, "n": n, "theta": theta,
                             "predicted_s": p.seconds, "simulated_s": s, "error": errors[-1]})
        cells = " ".join(f"{'plain' if n == 0 else f'N{n}/θ{theta:g}'} {e:+.1%}"
                         for (n, theta), e in zip(CONFIGS, errors))
        worst = max(abs(e) for e in errors)
        lines.append(f"  {regime.name:10s} worst {worst:.1%}, median {statistics.median(abs(e) for e in errors):.1%}: "
                     + cells)
    return lines, rows


def main(ablate: Annotated[bool, typer.Option("--ablate", help="Also each term switched off.")] = False,
         out: Annotated[str | None, typer.Option("--out", help="Result path stem.")] = None) -> None:
    terms = ["none"] + (["theta", "hook tax", "first cycle", "plain M forwards"] if ablate else [])
    text, rows = [], []
    for term in terms:
        lines, found = table(term)
        text += lines
        rows += found
    print("\n".join(text))
    path = write_results(out, "overlap_sim", "\n".join(text), {"configs": CONFIGS, "rows": rows})
    print(f"written: {path}.txt / .json")


if __name__ == "__main__":
    typer.run(main)
