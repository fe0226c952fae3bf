"""Predicted next to measured at batch sizes B > 1: the batched engine measures (``profiler.measure_batches``),
the batch model predicts the very batches it decoded (``tuner.model.predict_batches``: ragged rows in
lock-step cycles, a shrinking batch), and the pair is stored. B = 1 stays with :mod:`._validate`.

A prediction at B needs T_v(B, k) and T_s(B) from the profile (``profile --batch-sizes``): without them the
measurement is still made and stored, and the prediction is ``None`` with the reason (``Validated.unpredicted``).
As at B = 1, rates are rescaled to the machine's speed during the measurement: plain decoding measured at the
same batch size in the same passes is the gauge of every speculative configuration at that B (so their errors
are the speedups' errors), the machine probe the gauge of plain decoding itself.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from specdec_tune.core.errors import InputError
from specdec_tune.core.speculative import NONE, PLAIN
from specdec_tune.db import Database, RunRecord, get_run
from specdec_tune.profiler import Measurement, MeasureSpec, batches_of, chosen_prompts, default_split, measure_batches
from specdec_tune.tuner.model import PromptSpec, RunPrediction, RunProfile, SpecConfig, at_machine_speed
from specdec_tune.tuner.model import load_run_profile, machine_speed, predict_batches
from specdec_tune.tuner.search._validate import _DEFAULT, SPEED_FROM_PLAIN, SPEED_FROM_PROBE, Validated
from specdec_tune.tuner.search._validate import _store_prediction, measure_predicted


def measure_predicted_at(db: Database, run_id: int, items: list[tuple[str | None, SpecConfig]],
                         batch_sizes: Sequence[int] = (1,), **options) -> list[Validated]:
    """:func:`measure_predicted` at every batch size: B = 1 as it is, each B > 1 on the batched engine.

    Returns:
        the validated items, batch sizes ascending, the items in order within each.

    Raises:
        InputError: a bad batch size, fewer prompts than a batch size, a configuration the batched engine
            cannot run (trees, staged drafting); what :func:`measure_predicted` raises.
    """
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise InputError(f"--batch-sizes must be integers >= 1, got {list(batch_sizes)}")
    others = [b for b in sizes if b > 1]
    if others:  # fewer prompts than a batch size is refused before anything is measured
        run = get_run(db, run_id)
        split = options.get("split", _DEFAULT)
        count = len(chosen_prompts(run, default_split(run.settings) if split == _DEFAULT else split,
                                   options.get("max_prompts"))[1])
        for b in others:
            batches_of(count, b)
    out = measure_predicted(db, run_id, items, **options) if sizes[0] == 1 else []
    if others:
        out += _batched(db, run_id, items, others, **options)
    return out


def _batched(db: Database, run_id: int, items: list[tuple[str | None, SpecConfig]], sizes: list[int], *,
             split: str | None = _DEFAULT, temperature: float = 0.0, **options) -> list[Validated]:
    options.pop("peak_memory", None)  # peak memory is measured at B = 1 only
    if any(s for s in (options.pop("shapes", None) or []) if any(s)):
        raise InputError("token trees and staged drafting decode one sequence at a time: measure them at batch size 1")
    run = get_run(db, run_id)
    if split == _DEFAULT:
        split = default_split(run.settings)
    mode = "sampling" if temperature > 0 else "greedy"
    planned = [_plan(db, run, draft, config, mode) for draft, config in items]
    specs = [MeasureSpec(PLAIN) if plain else MeasureSpec(replace(config.spec, drafter=rp.draft))
             for plain, rp, config in planned]
    measured = measure_batches(db, run_id, specs, sizes, split=split, temperature=temperature, **options)
    out: list[Validated] = []
    for b in sizes:
        out += _predictions(db, run, planned, measured[b], b)
    return out


def _plan(db: Database, run: RunRecord, draft: str | None, config: SpecConfig,
          mode: str) -> tuple[bool, RunProfile, SpecConfig]:
    plain = config.spec.is_plain or draft == NONE
    rp = load_run_profile(db, run.id, run.resolve_draft(None if plain else draft))
    return plain, rp, (SpecConfig(0, mode=mode) if plain else replace(config, mode=mode))  # type: ignore[arg-type]


def batch_specs(run: RunRecord, m: Measurement) -> list[list[PromptSpec]]:
    """The batches ``m`` decoded, as the model's prompt specs (profiled prompts by index: exact)."""
    index = {pid: i for i, pid in enumerate(run.settings.prompt_ids)}
    length = dict(zip(m.prompt_ids, m.prompt_tokens))
    return [[PromptSpec(length[pid], None, index.get(pid)) for pid in group] for group in m.groups]


def _predictions(db: Database, run: RunRecord, planned: list, measured: list[Measurement], b: int) -> list[Validated]:
    """Each measurement at batch size ``b`` with the batch model's prediction for its batches, rescaled to the
    machine speed and stored beside it; ``None`` with the reason where the profile cannot predict it."""
    raws: list[RunPrediction | None] = []
    reasons: list[str | None] = []
    for (_, rp, config), m in zip(planned, measured):
        try:
            raws.append(predict_batches(rp, replace(config, batch_size=b), batch_specs(run, m)))
            reasons.append(None)
        except InputError as exc:
            raws.append(None)
            reasons.append(f"no prediction at B={b}: {exc}")
    gauge = next((m.tokens_per_s / r.tokens_per_s for (plain, _, _), m, r in zip(planned, measured, raws)
                  if plain and r is not None and r.tokens_per_s > 0 and m.tokens_per_s > 0), None)
    out = []
    for (plain, rp, config), m, raw, why in zip(planned, measured, raws, reasons):
        factor, source = (gauge, SPEED_FROM_PLAIN) if gauge is not None and not plain else \
            (machine_speed(rp, m.machine_probe_s), SPEED_FROM_PROBE)
        prediction = None if raw is None else at_machine_speed(raw, factor)
        if prediction is not None:
            _store_prediction(db, m, prediction, None, None, source)
        out.append(Validated(m, prediction, replace(config, batch_size=b), in_sample=m.in_sample, speed_source=source,
                             unpredicted=why))
    return out
