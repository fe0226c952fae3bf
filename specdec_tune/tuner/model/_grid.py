"""The ranking grid of N × θ that ``profile`` prints and the dashboard maps: the best predicted configurations."""
from __future__ import annotations

from collections.abc import Iterable

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model._predict import RunPrediction, predict_config
from specdec_tune.tuner.model._profile import RunProfile
from specdec_tune.tuner.model._throughput import SpecConfig

THRESHOLD_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def best_configs(
    rp: RunProfile,
    n_values: Iterable[int] | None = None,
    thresholds: Iterable[float] = THRESHOLD_GRID,
    batch_size: int = 1,
    mode: str = "greedy",
    top: int = 3,
) -> list[tuple[SpecConfig, RunPrediction]]:
    """The ``top`` configurations by predicted end-to-end tokens/s over N × θ (best first)."""
    n_max = rp.run.settings.n_max
    ns = list(n_values) if n_values is not None else list(range(1, n_max + 1))
    thetas = list(thresholds) if not rp.model_free else [0.0]  # model-free drafts: θ cuts nothing
    scored = []
    for n in ns:
        for theta in thetas:
            config = SpecConfig(n, theta, batch_size=batch_size, mode=mode)  # type: ignore[arg-type]
            try:
                scored.append((config, predict_config(rp, config)))
            except InputError:
                continue
    scored.sort(key=lambda cp: -cp[1].tokens_per_s)
    return scored[:top]
