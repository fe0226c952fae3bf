"""``specdec-tune predict``: predict one configuration from a stored profile (no model is run).

Throughput is end to end, as a user sees it: new tokens / wall seconds of whole decode calls, prefill
included; every number printed is labelled predicted (and synthetic where the acceptance rates were given).
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from specdec_tune.cli import _checks as opt
from specdec_tune.cli._app import THROUGHPUT_NOTE, app, print_json
from specdec_tune.cli._options import (
    DEFAULT_SCHEDULE,
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLD_KIND,
    DEFAULT_THRESHOLD_STEP,
    RUN_HELP,
    AcceptanceOption,
    DbOption,
    EpsilonOption,
    ScheduleOption,
    SyntheticAcceptanceOption,
    ThresholdKindOption,
    ThresholdOption,
    ThresholdStepOption,
)
from specdec_tune.core.errors import InputError

_RunDraft = Annotated[str | None, typer.Option("--draft", help="Which of the run's drafts (default: its first).")]
_Json = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def _bias_json(rp, config) -> dict | None:
    """A lossy configuration's bias per verified position (the stored front), or None for exact acceptance."""
    if config.spec.acceptance == "exact":
        return None
    from specdec_tune.tuner.model import bias_of

    b = bias_of(rp.bias_front, config.spec.acceptance, config.spec.epsilon)
    return {"bias": b.bias, "rejection": b.rejection, "label": b.label, "measured_bias": b.measured_bias,
            "unit": "mean TV(emitted, target) per verified position"}


def _kind_text(kind: str, step: float | None) -> str:
    """How θ applies, for the summary lines (``per-token``, ``cumulative``, ``adaptive, step 0.05``)."""
    return f"{kind}, step {step:g}" if kind == "adaptive" else kind


def interpolated_between(batch_size: int, profiled: list[int], run: int) -> tuple[int, int] | None:
    """The profiled batch sizes around an unprofiled ``batch_size`` (its T_v(B, k) and T_s(B) are
    interpolated between theirs), None for a profiled one.

    Raises:
        InputError: ``batch_size`` lies outside the profiled ones: a prediction there would extrapolate.
    """
    if batch_size in profiled:
        return None
    below, above = [b for b in profiled if b < batch_size], [b for b in profiled if b > batch_size]
    if not below or not above:
        wanted = ",".join(str(b) for b in sorted({*profiled, batch_size}))
        raise InputError(f"--batch-size {batch_size} is outside run {run}'s profiled batch sizes "
                         f"{', '.join(map(str, profiled))}: predictions interpolate between profiled batch sizes but "
                         f"never extrapolate (profile with --batch-sizes {wanted})")
    return max(below), min(above)


@app.command()
def predict(
    run_given: str = typer.Option(..., "--run", metavar="ID|latest", help=RUN_HELP),
    num_speculative_tokens: Optional[int] = typer.Option(None, "--num-speculative-tokens", "-N", help=(
        "N (0 = plain decoding). Leave it out with --batch-sizes for the best N per batch size.")),
    threshold: ThresholdOption = DEFAULT_THRESHOLD,
    schedule: ScheduleOption = DEFAULT_SCHEDULE,
    threshold_kind: ThresholdKindOption = DEFAULT_THRESHOLD_KIND,
    threshold_step: ThresholdStepOption = DEFAULT_THRESHOLD_STEP,
    batch_size: int = typer.Option(1, "--batch-size", help="B sequences in lock-step (needs T_v(B, k) in the run)."),
    batch_sizes: Optional[str] = typer.Option(None, "--batch-sizes", help=(
        "Several B, e.g. 1,2,4,8: one row each (the best N over 0..k_max-1 when -N is left out).")),
    draft: _RunDraft = None,
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy; > 0 predicts sampling mode."),
    acceptance: AcceptanceOption = "exact",
    epsilon: EpsilonOption = 0.0,
    acceptance_source: str = typer.Option("traces", "--acceptance-source", help=(
        "--temperature > 0: traces (the profile's sampling cycles) | tv (the teacher-forced 1 - TV per position of "
        "target-sampled text: no speculative run needed; per-token θ only)")),
    synthetic_acceptance: SyntheticAcceptanceOption = None,
    max_prompts: Optional[int] = typer.Option(None, "--max-prompts", help="Predict for the run's first prompts only."),
    db: DbOption = None,
    json_out: _Json = False,
) -> None:
    """Predict tokens/s of one configuration from a stored profile (no model is run); with
    --synthetic-acceptance, as if the draft were accepted at those rates (labelled synthetic)."""
    from specdec_tune.db import open_database
    from specdec_tune.tuner.model import load_run_profile, synthetic_rates, with_synthetic_acceptance

    rates = opt.parse_rates(synthetic_acceptance)
    if num_speculative_tokens is None and batch_sizes is None:
        raise InputError("give -N (the configuration to predict), or --batch-sizes for the best N per batch size")
    source = acceptance_source if temperature > 0 else "auto"

    def config_at(n: int, b: int):
        return opt.spec_config(n, threshold, schedule, b, temperature, threshold_kind, threshold_step, acceptance,
                               epsilon, source)

    config_at(num_speculative_tokens or 0, batch_size)  # bad flags fail before the database opens
    database = open_database(db)
    run = opt.run_id(database, run_given)
    rp = load_run_profile(database, run, draft)
    if rates is not None:
        rp = with_synthetic_acceptance(rp, rates)
    rates = rates or synthetic_rates(rp.run.settings)
    sizes = opt.int_list(batch_sizes, "--batch-sizes") if batch_sizes is not None else (batch_size,)
    rows = [_predict_row(rp, run, num_speculative_tokens, b, config_at, max_prompts) for b in sizes]
    label = "predicted" + (f", {opt.synthetic_label(rates)}" if rates else "")
    for r in rows:
        r["label"] = label + _interpolated(r)
    if json_out:
        obj = rows[0] if batch_sizes is None else {"run_id": run, "draft": rp.draft, "per_batch_size": rows,
                                                   "label": label}
        print_json({**obj, "acceptance_rates": "synthetic" if rates else "measured",
                    "synthetic_acceptance": list(rates) if rates else None, "throughput": THROUGHPUT_NOTE})
        return
    _print_rows(rows, run, rp.draft)


def _print_rows(rows: list[dict], run: int, draft: str | None) -> None:
    for r in rows:
        typer.echo(_predict_line(r, run, draft))
        if r["bias"] is not None:
            b = r["bias"]
            typer.echo(f"predicted bias of {r['acceptance']} ε = {r['epsilon']:g}: {b['bias']:.4f} per verified "
                       f"position (mean TV(emitted, target); {b['label']})")


def _interpolated(r: dict) -> str:
    between = r["interpolated_between"]
    return f", interpolated between profiled B = {between[0]} and {between[1]}" if between else ""


def _predict_row(rp, run: int, n: int | None, batch_size: int, config_at, max_prompts: int | None) -> dict:
    """One predicted configuration as a dict; ``n`` None: the best N at this batch size (the other settings
    as ``config_at(n, batch_size)`` makes them)."""
    from specdec_tune.core.errors import SpecdecError
    from specdec_tune.tuner.model import predict_config

    between = interpolated_between(batch_size, sorted(rp.model.verify_s), run)
    chosen = n is None
    if chosen:
        k_max = max(max(c) for c in rp.model.verify_s.values())
        scored = []
        for m in range(k_max):
            try:
                scored.append((config_at(m, batch_size), predict_config(rp, config_at(m, batch_size), max_prompts)))
            except SpecdecError:  # beyond what the run can predict (N_max, θ): not a candidate
                continue
        config, p = max(scored, key=lambda cp: (cp[1].tokens_per_s, -cp[0].spec.num_speculative_tokens))
    else:
        config = config_at(n, batch_size)
        p = predict_config(rp, config, max_prompts)
    return {
        "run_id": run, "draft": rp.draft, "num_speculative_tokens": config.spec.num_speculative_tokens, "best_n": chosen,
        "threshold": config.spec.threshold, "threshold_kind": config.spec.threshold_kind,
        "threshold_step": config.spec.threshold_step if config.spec.threshold_kind == "adaptive" else None,
        "schedule": config.spec.schedule, "batch_size": batch_size, "mode": config.mode,
        "tokens_per_s": p.tokens_per_s, "speedup": p.speedup,
        "baseline_tokens_per_s": p.baseline_tokens_per_s, "decode_tokens_per_s": p.decode_tokens_per_s,
        "expected_tokens_per_cycle": p.expected_tokens_per_cycle, "expected_draft_length": p.expected_draft_length,
        "source": p.source, "interpolated_between": list(between) if between else None,
        "acceptance": config.spec.acceptance, "epsilon": config.spec.epsilon, "acceptance_source": config.acceptance_source,
        "bias": _bias_json(rp, config),
    }


def _predict_line(r: dict, run: int, draft: str | None) -> str:
    return (f"{r['label']}: {r['tokens_per_s']:.1f} tokens/s ({r['speedup']:.2f}× over "
            f"{r['baseline_tokens_per_s']:.1f} tokens/s plain decoding), τ = {r['expected_tokens_per_cycle']:.2f} "
            f"tokens/cycle, E[L] = {r['expected_draft_length']:.2f} [run {run}, draft {draft}, "
            f"{'best ' if r['best_n'] else ''}N = {r['num_speculative_tokens']}, θ = {r['threshold']} "
            f"{_kind_text(r['threshold_kind'], r['threshold_step'])}, {r['schedule']}, B = {r['batch_size']}, "
            f"{r['mode']}; {r['source']}]")
