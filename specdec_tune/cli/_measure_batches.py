"""``measure --batch-sizes`` on our engine: one configuration and plain decoding measured at every batch size
asked (B = 1 one sequence at a time, B > 1 on the batched engine), each next to the batch model's prediction,
with the speedup over plain decoding at that batch size and its paired 95% CI (the unit: a batch)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer

from specdec_tune.cli._app import THROUGHPUT_NOTE, print_json
from specdec_tune.cli._progress import Bar, progress_bar
from specdec_tune.core.stats import ci_unavailable, speedup_estimate


def measure_per_batch_size(database, run: int, items: list, sizes: Sequence[int], console, **options) -> list[dict]:
    """Measure ``items`` (the configuration, plain decoding last) at every batch size; one row per size."""
    from specdec_tune.tuner.search import measure_predicted_at

    with progress_bar(console) as bar:
        got = measure_predicted_at(database, run, items, sizes, progress=Bar(bar), **options)
    rows = []
    for b in sorted(set(sizes)):
        at = [v for v in got if v.batch_size == b]
        rows.append(batch_row(at[0], at[-1] if len(at) > 1 else None))
    return rows


def batch_row(v, plain) -> dict[str, Any]:
    """One batch size: the configuration's measurement and prediction, and plain decoding's, with the speedup."""
    m, p = v.measurement, v.prediction
    row: dict[str, Any] = {
        "batch_size": m.batch_size, "batches": m.groups or [[pid] for pid in m.prompt_ids],
        "ci_unit": "batch" if m.batch_size > 1 else "prompt",
        "tokens_per_s": m.tokens_per_s, "ci95": list(m.ci95) if m.ci95 else None,
        "ci95_why": None if m.ci95 else ci_unavailable(len(m.samples.prompt_ids)),
        "mean_tokens_per_cycle": m.mean_tokens_per_cycle, "acceptance_per_position": m.acceptance_per_position,
        "predicted_tokens_per_s": None if p is None else p.tokens_per_s,
        "predicted_speedup": None if p is None else p.speedup, "relative_error": v.relative_error,
        "prediction_source": None if p is None else p.source, "unpredicted": v.unpredicted,
        "measured_id": m.measured_id, "label": "measured",
    }
    if plain is not None:
        pm = plain.measurement
        est = speedup_estimate(m, pm)  # the point and its CI from one estimator (core.stats)
        row["plain"] = {"tokens_per_s": pm.tokens_per_s, "ci95": list(pm.ci95) if pm.ci95 else None,
                        "predicted_tokens_per_s": None if plain.prediction is None else plain.prediction.tokens_per_s,
                        "measured_id": pm.measured_id}
        row["speedup"] = est.value
        row["speedup_ci95"] = None if est.ci is None else list(est.ci)
        row["speedup_ci95_why"] = est.why
    return row


def report(rows: list[dict], run: int, split: str | None, json_out: bool) -> None:
    """``--json``: one object with a row per batch size; else one line per batch size."""
    if json_out:
        print_json({"run_id": run, "split": split or "profiled prompts", "per_batch_size": rows,
                    "throughput": THROUGHPUT_NOTE + "; at B > 1 per batch, until its last sequence finished",
                    "label": "measured"})
        return
    for r in rows:
        typer.echo(_line(r))
    typer.echo("predicted: the batch model (ragged rows in lock-step cycles, docs/model.md item 7), rescaled to the "
               "machine speed plain decoding measured in the same passes")


def _ci(ci, why) -> str:
    return f"95% CI {ci[0]:.2f}-{ci[1]:.2f}" if ci else (why or "no CI")


def _line(r: dict) -> str:
    b, batches = r["batch_size"], r["batches"]
    what = f"{len(batches)} batch{'es' * (len(batches) != 1)} of {b}" if b > 1 else f"{len(batches)} prompts"
    ci = f"95% CI {r['ci95'][0]:.1f}-{r['ci95'][1]:.1f}" if r["ci95"] else r["ci95_why"] or "no CI"
    line = f"B={b} ({what}): measured {r['tokens_per_s']:.1f} tokens/s ({ci})"
    if "plain" in r:
        line += (f", plain {r['plain']['tokens_per_s']:.1f} tokens/s; speedup {r['speedup']:.2f}× "
                 f"({_ci(r['speedup_ci95'], r['speedup_ci95_why'])})")
    if r["predicted_tokens_per_s"] is not None:
        line += f"; predicted {r['predicted_tokens_per_s']:.1f} tokens/s (error {r['relative_error'] * 100:+.1f}%)"
    elif r["unpredicted"]:
        line += f"; {r['unpredicted']}"
    return line + f" [stored as #{r['measured_id']}]"
