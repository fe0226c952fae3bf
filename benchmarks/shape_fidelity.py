"""Shape fidelity: the model's predicted speedup against the measured one for a real-size model shape
pair with synthetic acceptance (random weights; engine.shapes, engine.verify.SyntheticAcceptance).

Usage: OMP_NUM_THREADS=1 python benchmarks/shape_fidelity.py [--target shape:qwen2.5-0.5b]
       [--draft shape:qwen2.5-draft-2l] [--acceptance 0.7] [--ns 1,2,3] [--max-prompts 4]
       [--max-new-tokens 16] [--repeats 3] [--prompt-chars 0] [--db sqlite:////tmp/shape_fidelity.db] [--device cpu]
Profiles the pair on the tuning half of --workload (every acceptance drawn at --acceptance), then
measures every N and plain decoding interleaved on held-out prompts, and prints one JSON object: per N
the predicted and the measured speedup over plain decoding (paired 95% CI) and the relative error.
Labelled synthetic: acceptance was given, the timings are real.
"""
from __future__ import annotations

import json
import os
import platform
import time

import typer

from specdec_tune.cli import _options as opts
from specdec_tune.db import open_database
from specdec_tune.profiler import ProfileSettings, StageLog, run_profile
from specdec_tune.core.stats import bounds, speedup_estimate
from specdec_tune.tuner.model import SpecConfig
from specdec_tune.tuner.search import measure_predicted


def _shortened(workload: str, chars: int) -> str:
    """A copy of ``workload`` whose prompts keep their last ``chars`` characters (a temporary JSONL file)."""
    import tempfile

    from specdec_tune.engine.workloads import load_workload

    fd, path = tempfile.mkstemp(prefix="shape-fidelity-", suffix=".jsonl")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        for p in load_workload(workload):
            out.write(json.dumps({"id": p.id, "prompt": p.prompt[-chars:]}) + "\n")
    return path


def main(
    target: str = typer.Option("shape:qwen2.5-0.5b", "--target", help="Target shape."),
    draft: str = typer.Option("shape:qwen2.5-draft-2l", "--draft", help="Draft shape of the same family."),
    acceptance: str = typer.Option("0.7", "--acceptance", help="Synthetic acceptance α (or α_1,α_2,...)."),
    ns: str = typer.Option("1,2,3", "--ns", help="N values measured."),
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    max_prompts: int = typer.Option(4, "--max-prompts", help="Prompts profiled, and measured (held out)."),
    max_new_tokens: int = typer.Option(16, "--max-new-tokens", help=opts.MAX_NEW_TOKENS_HELP),
    repeats: int = typer.Option(3, "--repeats", help=opts.REPEATS_HELP),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    db: str = typer.Option("sqlite:////tmp/shape_fidelity.db", "--db", help="Results database."),
    batch_sizes: str = typer.Option("1", "--batch-sizes", help="Batch sizes profiled for T_v(B, k)."),
    prompt_chars: int = typer.Option(0, "--prompt-chars", help=(
        "Keep only the last C characters of each prompt (0: whole prompts): on a CPU a long prompt's prefill "
        "outweighs a short decode.")),
) -> None:
    rates = tuple(float(a) for a in acceptance.split(","))
    if prompt_chars > 0:
        workload = _shortened(workload, prompt_chars)
    n_list = [int(n) for n in ns.split(",")]
    database = open_database(db)
    start = time.time()
    settings = ProfileSettings(
        device=device, synthetic_acceptance=rates, n_max=max(n_list), k_max=max(n_list) + 1, repeats=7, warmup=1,
        max_prompts=max_prompts, max_new_tokens=max_new_tokens, context_lens=(64,), prefill_repeats=3,
        # In-loop anchors at every k a measured N verifies (k = N + 1): the overhead passes at the smaller N,
        # the N_max pass at the largest; T_v(k) between anchors would otherwise be a straight line.
        overhead_prompts=2, overhead_ns=tuple(n_list[:-1]) or (1,),
        batch_sizes=tuple(int(b) for b in batch_sizes.split(",")),
        threads=1 if device == "cpu" else None)
    result = run_profile(database, target, [draft], workload, settings, StageLog())
    profile_s = time.time() - start
    items = [(None, SpecConfig(n)) for n in n_list] + [("none", SpecConfig(0))]
    got = measure_predicted(database, result.run_id, items, split="holdout", max_prompts=max_prompts,
                            repeats=repeats, progress=StageLog(), threads=settings.threads)
    plain = got[-1].measurement
    rows = []
    for v in got[:-1]:
        est = speedup_estimate(v.measurement, plain)  # one estimator: the CI contains the point
        measured = est.value
        rows.append({"N": v.config.spec.num_speculative_tokens, "predicted_speedup": v.prediction.speedup,
                     "measured_speedup": measured, "measured_ci95": list(bounds(est.ci)),
                     "speedup_error": v.prediction.speedup / measured - 1,
                     "predicted_tokens_per_s": v.prediction.tokens_per_s, "measured_tokens_per_s": v.measurement.tokens_per_s,
                     "tokens_per_s_error": v.relative_error, "measured_tau": v.measurement.mean_tokens_per_cycle,
                     "predicted_tau": v.prediction.expected_tokens_per_cycle, "source": v.prediction.source})
    print(json.dumps({
        "label": "measured vs predicted, synthetic acceptance (given, not measured)", "date": time.strftime("%Y-%m-%d"),
        "machine": platform.node(), "load_average": list(os.getloadavg()), "target": target, "draft": draft,
        "synthetic_acceptance": list(rates), "run_id": result.run_id, "device": device, "prompt_chars": prompt_chars,
        "prompts": max_prompts, "max_new_tokens": max_new_tokens, "repeats": repeats, "profile_seconds": profile_s,
        "total_seconds": time.time() - start, "plain_tokens_per_s": plain.tokens_per_s, "rows": rows,
        "max_abs_speedup_error": max(abs(r["speedup_error"]) for r in rows),
    }, indent=1))


if __name__ == "__main__":
    opts.run_script(main)
