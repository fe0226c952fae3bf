"""Predicted next to measured: predict with the model, measure through the profiler, store the pair.

The profiler measures and never predicts; the tuner predicts and never times (ARCHITECTURE §2). A
command that wants the model's error asks for both here and stores the prediction beside the
measurement through ``db``. Predictions are made first, so a configuration the profile cannot
predict fails before anything runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec_tune.db import Database, get_run, set_prediction
from specdec_tune.errors import InputError
from specdec_tune.profiler.measure import Measurement, MeasureSpec, measure_configs
from specdec_tune.profiler.session import Progress
from specdec_tune.tuner.model import SpecConfig
from specdec_tune.tuner.profile_data import RunPrediction, load_run_profile, predict_config


@dataclass
class Validated:
    """One configuration measured and predicted on the same prompts."""

    measurement: Measurement
    prediction: RunPrediction
    config: SpecConfig

    @property
    def relative_error(self) -> float | None:
        """(predicted - measured) / measured tokens/s."""
        measured = self.measurement.tokens_per_s
        return None if measured <= 0 else (self.prediction.tokens_per_s - measured) / measured


def measure_predicted(
    db: Database,
    run_id: int,
    items: list[tuple[str | None, SpecConfig]],
    *,
    temperature: float = 0.0,
    max_prompts: int | None = None,
    repeats: int = 3,
    seed: int = 0,
    progress: Progress | None = None,
) -> list[Validated]:
    """Predict, then measure (interleaved), each ``(draft, config)`` of run ``run_id``; store both.

    Raises:
        NotFoundError: unknown run or draft.
        InputError: a configuration the run cannot predict (batch size, N beyond N_max) or run.
    """
    if not items:
        raise InputError("no configuration to measure")
    run = get_run(db, run_id)
    mode = "sampling" if temperature > 0 else "greedy"
    planned = []
    for draft, config in items:
        if config.batch_size != 1:
            raise InputError(f"measure decodes one sequence at a time; --batch-size must be 1, got {config.batch_size}")
        name = run.resolve_draft(draft)
        config = SpecConfig(config.num_speculative_tokens, config.threshold, config.schedule, 1, mode)
        planned.append((name, config, predict_config(load_run_profile(db, run_id, name), config, max_prompts)))
    specs = [MeasureSpec(name, c.num_speculative_tokens, c.threshold, c.schedule) for name, c, _ in planned]
    measured = measure_configs(db, run_id, specs, temperature=temperature, max_prompts=max_prompts,
                               repeats=repeats, seed=seed, progress=progress)
    out = []
    for m, (_, config, prediction) in zip(measured, planned):
        if m.measured_id is not None:
            set_prediction(db, m.measured_id, predicted_tokens_per_s=prediction.tokens_per_s,
                           predicted_tau=prediction.expected_tokens_per_cycle,
                           extra={"prediction_source": prediction.source})
        out.append(Validated(m, prediction, config))
    return out
