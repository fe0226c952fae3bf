"""Validation shared by CLI commands (one clear line naming the flag and what would be valid), and the
formatting of their summary lines."""
from __future__ import annotations

import math

from specdec_tune.cli._options import DEFAULT_THRESHOLD_KIND, DEFAULT_THRESHOLD_STEP
from specdec_tune.core.limits import MAX_SPECULATIVE_TOKENS, check_num_speculative
from specdec_tune.core.schedules import ADAPTIVE_BOUNDS, SCHEDULES, THRESHOLD_KINDS
from specdec_tune.core.errors import InputError


def check_num_speculative_tokens(n: int) -> int:
    return check_num_speculative(n, name="--num-speculative-tokens")


def check_threshold(theta: float) -> float:
    if not 0.0 <= theta < 1.0:
        raise InputError(f"--threshold must be in [0, 1) (0 disables), got {theta}")
    return theta


def check_threshold_kind(kind: str, step: float, threshold: float, rule: str = "before", schedule: str = "constant") -> str:
    """``--threshold-kind`` (and, for ``adaptive``, ``--threshold-step`` and θ's bounds) as one line each."""
    if kind not in THRESHOLD_KINDS:
        raise InputError(f"--threshold-kind must be one of {', '.join(THRESHOLD_KINDS)}, got {kind!r}")
    if kind != "per-token" and rule != "before":
        raise InputError(f"--threshold-kind {kind} needs --threshold-rule before, got {rule!r}")
    if kind == "adaptive":
        low, high = ADAPTIVE_BOUNDS
        if not 0.0 < step <= 1.0:
            raise InputError(f"--threshold-step must be in (0, 1], got {step}")
        if not low <= threshold <= high:
            raise InputError(f"--threshold (the adaptive θ's start) must be in [{low}, {high}], got {threshold}")
        if schedule != "constant":
            raise InputError(f"--threshold-kind adaptive runs with --schedule constant only, got {schedule!r}")
    return kind


def check_acceptance(acceptance: str, epsilon: float, temperature: float, source: str = "auto") -> str:
    """``--acceptance``, ``--epsilon`` and ``--acceptance-source`` as one line each."""
    if acceptance not in ("exact", "opt", "uno"):
        raise InputError(f"--acceptance must be one of exact, opt, uno, got {acceptance!r}")
    if not 0.0 <= epsilon <= 1.0:
        raise InputError(f"--epsilon must be in [0, 1], got {epsilon}")
    if acceptance == "exact" and epsilon != 0:
        raise InputError(f"--epsilon {epsilon} needs --acceptance opt or uno (exact acceptance has no over-acceptance)")
    if acceptance != "exact" and temperature <= 0:
        raise InputError(f"--acceptance {acceptance} is a sampling rule: give --temperature > 0")
    if source not in ("auto", "traces", "tv"):
        raise InputError(f"--acceptance-source must be traces or tv, got {source!r}")
    return acceptance


def check_temperature(t: float) -> float:
    if t < 0:
        raise InputError(f"--temperature must be >= 0 (0 = greedy), got {t}")
    return t


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise InputError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    return schedule


def check_max_new_tokens(m: int) -> int:
    if m < 1:
        raise InputError(f"--max-new-tokens must be >= 1, got {m}")
    return m


def int_list(text: str, flag: str) -> tuple[int, ...]:
    """``1,4,16`` as ``(1, 4, 16)``: integers >= 1, repeats dropped, order kept."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"{flag} must be comma-separated integers like 1,4,16, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise InputError(f"{flag} must be comma-separated integers >= 1, got {text!r}")
    return tuple(dict.fromkeys(values))


def format_alphas(alphas: list[float], limit: int = 8) -> str:
    """``[0.81, 0.66, ...]`` for a summary line."""
    shown = ", ".join(f"{a:.2f}" for a in alphas[:limit])
    return f"[{shown}{', ...' if len(alphas) > limit else ''}]"


def format_rate(x: float | None) -> str:
    """``0.81``, or ``–`` for a rate that is undefined (None or NaN)."""
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def parse_threads(value: str | int | None) -> int | None:
    """``--threads``: ``auto`` (or None) -> None, the profiler chooses; a whole number >= 1 -> itself.

    Raises:
        InputError: anything else (one line naming the valid values).
    """
    if value is None or str(value).strip().lower() == "auto":
        return None
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(f"--threads must be 'auto' or a whole number >= 1, got {value!r}")
    return n


def check_model_names(*names: str) -> None:
    """Every model name resolves (bundled, a local model folder, or a reachable hub id), in about a second
    and before torch is imported; ``none``, ``ngram`` and ``suffix`` are drafters, not models.

    Raises:
        ModelLoadError: one line naming the model, with the nearest bundled name.
    """
    from specdec_tune.engine import resolve_source

    for name in names:
        if name not in ("none", "ngram", "suffix"):
            resolve_source(name)


def with_suffix(config, draft: str | None, suffix: dict):  # noqa: ANN201 - a tuner SpecConfig
    """``config`` with suffix decoding's fields for ``--draft suffix`` (refused for another draft when set)."""
    from dataclasses import replace

    if config.spec.is_plain:
        return config
    fields = speculative_fields(draft or "", suffix, config.spec.num_speculative_tokens, None)
    return replace(config, spec=replace(config.spec, **fields)) if fields else config


def speculative_fields(draft: str, suffix: dict, n: int, tree: str | None) -> dict:
    """Suffix decoding's fields for ``--draft suffix`` (checked now, before anything loads, by building the
    configuration: one ``error:`` line naming the bad value), ``tree`` included; none for another draft, and
    a ``--suffix-*`` option given with another draft is refused."""
    from specdec_tune.core.speculative import SpeculativeConfig, with_fields

    if draft != "suffix":
        if suffix != {k: SpeculativeConfig.__dataclass_fields__[k].default for k in suffix}:
            raise InputError("--suffix-* options apply to --draft suffix only")
        return {}
    fields = {**suffix, "tree": tree or "", "drafter": "suffix"}
    with_fields(SpeculativeConfig("suffix", n), fields, "generate")
    return fields


def check_workload(workload: str, split: str | None = None) -> int:
    """The workload resolves and every line parses (one line naming the file and line where not) and ``split``
    of it has prompts, before torch and the models load; returns its number of prompts."""
    from specdec_tune.engine import load_workload
    from specdec_tune.core.splits import check_split_prompts

    prompts = load_workload(workload)
    if split is not None:
        check_split_prompts(prompts, split, workload)
    return len(prompts)


def check_measured_prompts(run, split: str | None, max_prompts: int | None, repeats: int | None) -> None:
    """What ``measure`` decodes exists: its prompts (an empty split: one line with the counts) and passes,
    before any model loads or a progress bar starts."""
    from specdec_tune.profiler import chosen_prompts

    if repeats is not None and repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {repeats}")
    chosen_prompts(run, split, max_prompts)


def parse_rates(text: str | None, flag: str = "--synthetic-acceptance") -> tuple[float, ...] | None:
    """``0.7`` or ``0.8,0.7,0.6`` (conditional α_1, α_2, ...; the last repeats) as a tuple; None for None.

    Raises:
        InputError: anything but numbers in [0, 1] (one line naming the flag).
    """
    if text is None:
        return None
    try:
        rates = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        rates = ()
    if not rates or any(not 0.0 <= a <= 1.0 for a in rates):
        raise InputError(f"{flag} must be acceptance rates in [0, 1], comma-separated (α_1, α_2, ...; the last "
                         f"repeats), got {text!r}")
    return rates


def synthetic_label(rates) -> str:
    """How every number that rests on given acceptance rates is labelled."""
    return "synthetic acceptance α = " + ", ".join(f"{a:g}" for a in rates) + " (given, not measured)"


LATEST = "latest"


def run_id(db, text: str | int, flag: str = "--run") -> int:
    """``--run ID|latest``: a run id as given, or ``latest``, the newest completed profile run (what a
    profile or tune in this folder just made, whatever ran before it).

    Raises:
        InputError: neither an integer nor ``latest``, or ``latest`` with no completed run stored.
    """
    given = str(text).strip()
    if given.lower() != LATEST:
        try:
            return int(given)
        except ValueError:
            raise InputError(f"{flag} must be a run id (an integer) or {LATEST!r}, got {given!r}") from None
    from specdec_tune.db import list_runs

    newest = list_runs(db, status="completed", limit=1)
    if not newest:
        raise InputError(f"{flag} {LATEST}: no completed profile run is stored yet; run `specdec-tune profile` "
                         "(or `specdec-tune tune`) first")
    return newest[0].id


def spec_config(n: int, threshold: float, schedule: str, batch_size: int, temperature: float,
                kind: str = DEFAULT_THRESHOLD_KIND, step: float = DEFAULT_THRESHOLD_STEP, acceptance: str = "exact",
                epsilon: float = 0.0, source: str = "auto"):
    """The configuration ``predict`` and ``measure`` name with their flags, each flag checked (one line naming it)."""
    from specdec_tune.tuner.model import SpecConfig

    check_acceptance(acceptance, epsilon, temperature, source)
    if not 0 <= n <= MAX_SPECULATIVE_TOKENS:
        raise InputError(f"--num-speculative-tokens must be an integer in 0..{MAX_SPECULATIVE_TOKENS} (0 = plain "
                         f"decoding), got {n}")
    check_threshold(threshold)
    check_schedule(schedule)
    check_threshold_kind(kind, step, threshold, schedule=schedule)
    check_temperature(temperature)
    if batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")
    return SpecConfig(n, threshold, schedule=schedule, threshold_kind=kind, threshold_step=step, acceptance=acceptance,
                      epsilon=epsilon, batch_size=batch_size, mode="sampling" if temperature > 0 else "greedy",
                      acceptance_source=source)
