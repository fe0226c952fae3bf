"""Predicted next to measured: predict with the model, measure through the profiler, store the pair.

The profiler measures and never predicts; the tuner predicts and never times (docs/architecture.md,
Rooms). A
command that wants the model's error asks for both here and stores the prediction beside the
measurement through ``db``. Predictions are made first, so a configuration the profile cannot
predict fails before anything runs.

Honest validation: measure on prompts the profile did not run (``split="holdout"``, the default for
a run profiled on ``tune``). Those prompts are predicted from the profiled ones only
(``tuner.model.predict_prompts``: pooled cycles, prefill fitted by prompt length, output length
``max_new_tokens``), so the comparison is out of sample. Every measurement carries a 95% bootstrap
CI and the prediction is reported as inside or outside it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from specdec_tune.db import Database, RunRecord, get_run, set_prediction
from specdec_tune.core.errors import InputError
from specdec_tune.core.speculative import NONE, PLAIN
from specdec_tune.profiler import (
    Measurement,
    MeasureSpec,
    Progress,
    chosen_prompts,
    default_split,
    measure_configs,
)
from specdec_tune.tuner.model import (
    Candidate,
    LatencyPrediction,
    MemoryBreakdown,
    PromptSpec,
    RunPrediction,
    RunProfile,
    SpecConfig,
    TreeData,
    TreePlan,
    at_machine_speed,
    load_run_profile,
    load_tree_data,
    machine_speed,
    predict_latency,
    predict_prompts,
    predict_tree_prompts,
    tree_plan,
)

_DEFAULT = "default"
SPEED_FROM_PLAIN = "plain decoding in the same passes"
SPEED_FROM_PROBE = "the machine probe"


@dataclass
class Validated:
    """One configuration measured and predicted on the same prompts.

    Attributes:
        measurement: what the profiler measured (with ``ci95`` and raw ``samples``).
        prediction: the model's prediction for exactly the measured prompts.
        config: the configuration (N = 0: plain decoding).
        in_sample: every measured prompt was one the profile ran (its traces were replayed).
        latency: the predicted per-request TTFT and TPOT on the same prompts.
        memory: the predicted memory of the configuration (with ``peak_memory``).
        speed_source: what measured the machine's speed the rates were rescaled to (:func:`_speeds`).
    """

    measurement: Measurement
    prediction: RunPrediction
    config: SpecConfig
    in_sample: bool = False
    latency: LatencyPrediction | None = None
    memory: MemoryBreakdown | None = None  # predicted, where the peak was measured (``peak_memory``)
    speed_source: str = SPEED_FROM_PROBE  # what gave the machine speed the rates were rescaled to

    @property
    def relative_error(self) -> float | None:
        """(predicted - measured) / measured tokens/s."""
        measured = self.measurement.tokens_per_s
        return None if measured <= 0 else (self.prediction.tokens_per_s - measured) / measured

    @property
    def ci95(self) -> tuple[float, float] | None:
        """The measured tokens/s 95% CI."""
        return self.measurement.ci95

    @property
    def inside_ci(self) -> bool | None:
        """Whether the predicted tokens/s lies inside the measured 95% CI."""
        ci = self.ci95
        return None if ci is None else ci[0] <= self.prediction.tokens_per_s <= ci[1]


def measure_predicted(
    db: Database,
    run_id: int,
    items: list[tuple[str | None, SpecConfig]],
    *,
    split: str | None = _DEFAULT,
    temperature: float = 0.0,
    max_prompts: int | None = None,
    repeats: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    threads: int | None = None,
    gpu_price: float | None = None,
    peak_memory: bool = False,
    shapes: Sequence[tuple[str, str]] | None = None,
) -> list[Validated]:
    """Predict, then measure (interleaved), each ``(draft, config)`` of run ``run_id``; store both.

    Args:
        db: the results database.
        run_id: a profile run.
        items: ``(draft, config)``; ``draft`` None is the run's first draft; a config with N = 0 (or
            draft ``"none"``) is plain decoding, measured in the same interleaved passes.
        split: ``tune`` | ``holdout`` | ``all`` | ``A:B`` (``specdec_tune.core.splits.split_prompts``);
            ``None`` is the run's own profiled prompts; the default is ``holdout`` for a run profiled
            on ``tune``, else the run's own prompts.
        temperature: 0 = greedy.
        max_prompts: the first prompts of the split only.
        repeats: interleaved passes (None: the profiler's default for the run's device, 3 or 5 on a GPU).
        seed: sampling seed.
        progress: progress sink.
        threads: intra-op threads (None: the profile's, lowered to the CPUs idle now).
        gpu_price: dollars per hour of the device (stored as $ per million tokens).
        peak_memory: measure each configuration's peak memory in a fresh process, next to its prediction.
        shapes: per item, ``(tree, staged)`` of its candidate (``("", "")``: a chain; default: all chains).

    Raises:
        NotFoundError: unknown run or draft.
        InputError: a configuration the run cannot predict (batch size, N beyond N_max) or run, a bad split.
    """
    if not items:
        raise InputError("no configuration to measure")
    run = get_run(db, run_id)
    if split == _DEFAULT:
        split = default_split(run.settings)
    split, prompts = chosen_prompts(run, split, max_prompts)  # a bad split fails before any model loads
    mode = "sampling" if temperature > 0 else "greedy"
    # A held-out prompt's length in tokens needs the target's tokenizer, which the measurement loads;
    # so the prediction for the measured prompts is made after it (from the profile only, below).
    planned = [_plan(db, run, draft, config, mode) for draft, config in items]
    shapes = list(shapes) if shapes is not None else [("", "")] * len(items)
    trees = [None if plain else _tree_plan(db, run, rp, c, shape) for (plain, rp, c), shape in zip(planned, shapes)]
    specs = [_measure_spec(plain, rp, c, t, shape) for (plain, rp, c), t, shape in zip(planned, trees, shapes)]
    measured = measure_configs(db, run_id, specs, split=split, temperature=temperature, max_prompts=max_prompts,
                               repeats=repeats, seed=seed, progress=progress, threads=threads, gpu_price=gpu_price,
                               peak_memory=peak_memory)
    return _predictions(db, run, planned, trees, measured, peak_memory)


def _predictions(db: Database, run: RunRecord, planned: list, trees: list, measured: list[Measurement],
                 peak_memory: bool) -> list[Validated]:
    """Each measured configuration with its prediction for the prompts it ran, made from the profile only."""
    mm = _memory(db, run, measured) if peak_memory else None
    specs = [_prompt_specs(run, m) for m in measured]
    raws = [_raw(rp, config, t, s) for (_, rp, config), t, s in zip(planned, trees, specs)]
    speeds = _speeds([plain for plain, _, _ in planned], measured, [rp for _, rp, _ in planned], raws)
    return [_predicted(db, m, rp, config, t, mm, raw, speed, s)
            for m, (_, rp, config), t, raw, speed, s in zip(measured, planned, trees, raws, speeds, specs)]


def _raw(rp: RunProfile, config: SpecConfig, tree: tuple[TreePlan, TreeData] | None,
         specs: list[PromptSpec]) -> RunPrediction:
    """The prediction for exactly the measured prompts (``specs``) at the profile's machine speed."""
    return predict_prompts(rp, config, specs) if tree is None else \
        predict_tree_prompts(rp, tree[1], config, tree[0], specs)


def _speeds(plain: Sequence[bool], measured: Sequence[Measurement], rps: Sequence[RunProfile],
            raws: Sequence[RunPrediction]) -> list[tuple[float, str]]:
    """How fast the machine ran during this measurement relative to the profile, per item, and what said so.

    Where plain decoding was measured in the same interleaved passes, it is the gauge for every other
    configuration: it runs the target's own forward on the same prompts at the same moments, so its
    measured over predicted tokens/s is the machine's speed now for this model (and the rescaled rates'
    errors are the speedups' errors). The machine probe (a 20-40 ms snapshot between turns) is the gauge
    otherwise, and for plain decoding itself. Of the three, plain decoding measured in the same
    passes puts stored predictions closest to measured (``benchmarks/speed_gauge.py``; docs/results.md,
    Latency fidelity). On a GPU it is also the one gauge that follows CUDA-graphed decoding (the probe is
    eager: ``tuner.model.machine_speed`` leaves a graphed run unscaled). A plain measurement flagged as not
    clean by the profiler's guards is never the gauge.
    """
    probe = [(machine_speed(rp, m.machine_probe_s), SPEED_FROM_PROBE) for m, rp in zip(measured, rps)]
    # A plain measurement that failed a guard (a capture or a new cache slot inside it: ``clean`` False)
    # would carry its one-off costs into every other configuration's prediction: it is no gauge.
    gauge = next((m.tokens_per_s / r.tokens_per_s for p, m, r in zip(plain, measured, raws)
                  if p and r.tokens_per_s > 0 and m.tokens_per_s > 0 and getattr(m, "clean", True)), None)
    if gauge is None:
        return probe
    return [own if p else (gauge, SPEED_FROM_PLAIN) for p, own in zip(plain, probe)]


def _predicted(db: Database, m: Measurement, rp: RunProfile, config: SpecConfig,
               tree: tuple[TreePlan, TreeData] | None, mm, raw: RunPrediction,
               speed: tuple[float, str], specs: list[PromptSpec]) -> Validated:
    """The prediction for exactly the measured prompts (throughput, latency and, with a memory model, memory),
    stored beside the measurement. Rates are predicted at the profile's machine speed and rescaled to the
    machine's speed during this measurement (:func:`_speeds`); speedups are unchanged. A tree's or staged
    drafter's latency distribution is not modelled (None)."""
    factor, source = speed
    prediction = at_machine_speed(raw, factor)
    latency = predict_latency(rp, config, specs).scaled(factor) if tree is None else None
    memory = None
    if mm is not None and m.peak_memory is not None:
        c = Candidate(m.draft, config.spec.num_speculative_tokens)  # N = 0: plain decoding, whatever m.draft
        memory = mm.breakdown(c, 1, m.peak_memory.prompt_tokens + m.peak_memory.new_tokens, m.peak_memory.prompt_tokens)
    _store_prediction(db, m, prediction, latency, memory, source)
    return Validated(m, prediction, config, in_sample=m.in_sample, latency=latency, memory=memory, speed_source=source)


def _memory(db: Database, run: RunRecord, measured: list[Measurement]):
    from specdec_tune.tuner.search._memory import memory_model

    return memory_model(db, run.id, max(m.peak_memory.prompt_tokens + m.peak_memory.new_tokens
                                        for m in measured if m.peak_memory is not None))


def _plan(db: Database, run: RunRecord, draft: str | None, config: SpecConfig,
          mode: str) -> tuple[bool, RunProfile, SpecConfig]:
    """(plain decoding?, the draft's profile, the configuration as measured); fails before anything runs."""
    if config.batch_size != 1:
        raise InputError(f"measure decodes one sequence at a time; --batch-size must be 1, got {config.batch_size}")
    plain = config.spec.is_plain or draft == NONE
    name = run.resolve_draft(None if plain else draft)
    config = replace(config, batch_size=1, mode=mode) if not plain else SpecConfig(0, mode=mode)  # type: ignore[arg-type]
    rp = load_run_profile(db, run.id, name)
    # Fails now (N beyond N_max, no traces) rather than after minutes of measuring.
    predict_prompts(rp, config, [(rp.prompts[0].prompt_tokens if rp.prompts else 8, None)])
    return plain, rp, config


def _tree_plan(db: Database, run: RunRecord, rp: RunProfile, config: SpecConfig,
               shape: tuple[str, str]) -> tuple[TreePlan, TreeData] | None:
    """The tree or staged plan of one item and its tree data (``None``: a chain); fails before anything runs."""
    tree, staged = shape
    if not tree and not staged:
        return None
    data = load_tree_data(db, run.id, rp.draft, config.mode)
    inner = load_run_profile(db, run.id, staged) if staged else None
    plan = tree_plan(tree, staged, data, inner)
    assert plan is not None and data is not None
    predict_tree_prompts(rp, data, config, plan, [PromptSpec(rp.prompts[0].prompt_tokens if rp.prompts else 8)])
    return plan, data


def _measure_spec(plain: bool, rp: RunProfile, config: SpecConfig, t: tuple[TreePlan, TreeData] | None,
                  shape: tuple[str, str]) -> MeasureSpec:
    """What the profiler measures for one item: its configuration with the profile's draft, and the item's
    tree or inner drafter (the measured tree is the predicted one; a Sequoia tree is shaped by the
    profile's per-rank acceptance)."""
    if plain:
        return MeasureSpec(PLAIN)
    tree, staged = shape if t is not None else ("", "")
    sequoia = t is not None and t[0].tree is not None and t[0].tree.kind == "sequoia"
    return MeasureSpec(replace(config.spec, drafter=rp.draft, tree=tree, staged=staged),
                       t[1].rank_accept if sequoia and t is not None else ())


def _store_prediction(db: Database, m: Measurement, prediction: RunPrediction, latency: LatencyPrediction | None,
                      memory: MemoryBreakdown | None = None, speed_source: str = SPEED_FROM_PROBE) -> None:
    """The prediction beside its measurement, with whether it lies inside the measured 95% CI."""
    if m.measured_id is None:
        return
    set_prediction(db, m.measured_id, predicted_tokens_per_s=prediction.tokens_per_s,
                   predicted_tau=prediction.expected_tokens_per_cycle,
                   predicted={"predicted_tpot_p50_s": _defined(latency.tpot(0.5)) if latency else None,
                              "predicted_tpot_p90_s": _defined(latency.tpot(0.9)) if latency else None,
                              "predicted_memory_bytes": None if memory is None else memory.total},
                   extra={"prediction_source": prediction.source, "prediction_in_sample": prediction.in_sample,
                          "prediction_machine_speed": prediction.machine_speed,
                          "prediction_machine_speed_source": speed_source,
                          "prediction_inside_ci": None if m.ci95 is None else
                          m.ci95[0] <= prediction.tokens_per_s <= m.ci95[1]})


def _defined(x: float) -> float | None:
    """None for a predicted statistic that is undefined (NaN: a TPOT of requests of one token)."""
    return None if math.isnan(x) else x


def _prompt_specs(run, m: Measurement) -> list[PromptSpec]:
    """The measured prompts for the model: profiled ones by index (exact), the others by length only.

    A held-out prompt contributes its length in tokens (the measurement tokenised it; a length is
    not a timing) and nothing else: its output length is assumed to be ``max_new_tokens``.
    """
    index = {pid: i for i, pid in enumerate(run.settings.prompt_ids)}
    lengths = m.prompt_tokens
    return [PromptSpec(lengths[k], None, index.get(pid)) for k, pid in enumerate(m.prompt_ids)]
