"""Interleaved measurement of candidates and plain decoding on a prompt split, with per-prompt times.

Used by ``tune`` while ``tuner.validate.measure_predicted`` takes no prompt split and cannot measure
plain decoding (issue 9 §3 adds both; ``tuner._measure`` switches to it as soon as it does). The
timing is the profiler's (:func:`specdec_tune.profiler.runs.measure_prompt`: one wall-clock decode
call, prefill included); this module only chooses prompts, interleaves, and stores each measurement
beside its prediction through ``db``.

Split: the workload's first half is the tuning part (a profile takes its first prompts), the second
half is held out; a profile never sees a held-out prompt.

Statistics: each prompt's time is the median of its repeats; tokens/s = Σ tokens / Σ times. The 95%
CIs are percentile bootstraps over prompts (``scipy.stats.bootstrap``); the speedup's is paired (the
same resampled prompts for both configurations, measured in the same passes).
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specdec_tune.db import Database, add_measured_run, get_run, set_prediction
from specdec_tune.errors import InputError


def split_ids(ids: Sequence[str], split: str) -> list[str]:
    """``tune`` = first half, ``holdout`` = second half (rounded so the tuning half is the larger)."""
    half = (len(ids) + 1) // 2
    if split == "tune":
        return list(ids[:half])
    if split == "holdout":
        return list(ids[half:])
    raise InputError(f"split must be 'tune' or 'holdout', got {split!r}")


@dataclass
class Timed:
    """One configuration measured: per-prompt median seconds and tokens."""

    drafter: str
    num_speculative_tokens: int
    threshold: float
    threshold_rule: str
    schedule: str
    seconds: list[float] = field(default_factory=list)  # [prompt] median over repeats
    tokens: list[int] = field(default_factory=list)  # [prompt]
    measured_id: int | None = None

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / sum(self.seconds) if self.seconds and sum(self.seconds) > 0 else 0.0


def _ratio_ci(num: np.ndarray, den: np.ndarray, num2: np.ndarray | None = None, den2: np.ndarray | None = None,
              seed: int = 0) -> tuple[float, float] | None:
    """95% percentile bootstrap CI over prompts of Σnum/Σden (or of the ratio of two such rates)."""
    from scipy.stats import bootstrap

    if len(num) < 2:
        return None
    data = (num, den) if num2 is None else (num, den, num2, den2)

    def stat(*xs, axis=-1):
        rate = np.sum(xs[0], axis=axis) / np.sum(xs[1], axis=axis)
        return rate if len(xs) == 2 else rate / (np.sum(xs[2], axis=axis) / np.sum(xs[3], axis=axis))

    res = bootstrap(data, stat, paired=True, vectorized=True, n_resamples=2000, confidence_level=0.95,
                    method="percentile", random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def tokens_per_s_ci(t: Timed) -> tuple[float, float] | None:
    return _ratio_ci(np.array(t.tokens, float), np.array(t.seconds, float))


def speedup_ci(a: Timed, base: Timed) -> tuple[float, float] | None:
    """Paired CI of (tokens/s of ``a``) / (tokens/s of ``base``) over the same prompts."""
    return _ratio_ci(np.array(a.tokens, float), np.array(a.seconds, float),
                     np.array(base.tokens, float), np.array(base.seconds, float))


def measure_interleaved(db: Database, run_id: int, configs: Sequence[Timed], *, split: str, max_prompts: int,
                        temperature: float, repeats: int, seed: int, progress, predicted: Sequence[float | None]) -> list[Timed]:
    """Decode the split's prompts with every configuration, interleaved; store each with its prediction."""
    import torch

    from specdec_tune.engine import DecodeConfig, check_compatible, load_model
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.runs import DraftSpec, encode_prompt, measure_prompt, warm_up

    run = get_run(db, run_id)
    s = run.settings
    if s.get("threads"):
        torch.set_num_threads(int(s["threads"]))
    prompts = load_workload(s.get("workload"))
    ids_all = [p.id for p in prompts]
    chosen = split_ids(ids_all, split)[:max_prompts]
    if split == "holdout" and set(chosen) & set(s.get("prompt_ids", [])):
        raise InputError(f"run {run_id} profiled prompts of the held-out half; profile at most half the workload")
    if not chosen:
        raise InputError(f"workload {s.get('workload')!r} has no {split} prompts")
    device, dtype, forward = s.get("device", "auto"), s.get("dtype", "auto"), s.get("forward", "auto")
    target = load_model(s.get("target", run.target.name), device, dtype, forward)
    specs: dict[str, DraftSpec] = {"none": DraftSpec("none"), "ngram": DraftSpec("ngram")}
    for c in configs:
        if c.drafter not in specs:
            loaded = load_model(c.drafter, target.device, target.dtype, s.get("draft_forwards", {}).get(c.drafter, forward))
            check_compatible(target, loaded)
            specs[c.drafter] = DraftSpec("model", loaded)
    by_id = {p.id: p for p in prompts}
    xs = [encode_prompt(target, by_id[i].prompt, i) for i in chosen]
    max_new = int(s.get("max_new_tokens", 64))

    def decode_config(c: Timed) -> DecodeConfig:
        return DecodeConfig(max_new_tokens=max_new, num_speculative_tokens=max(c.num_speculative_tokens, 1),
                            threshold=c.threshold, schedule=c.schedule, temperature=temperature,
                            eos_token_id=target.eos_token_id, threshold_rule=c.threshold_rule)

    decodes = [decode_config(c) for c in configs]
    times = [[[] for _ in xs] for _ in configs]
    progress.stage(f"measure {len(configs)} configurations on {len(xs)} {split} prompts", len(configs) * (1 + repeats * len(xs)))
    for c, d in zip(configs, decodes):
        warm_up(target, specs[c.drafter], xs[0], d)
        progress.advance()
    for r in range(repeats):  # every pass goes round all configurations, rotated, prompt by prompt
        order = list(range(len(configs)))
        order = order[r % len(order):] + order[:r % len(order)]
        for j, x in enumerate(xs):
            for k in order:
                m = measure_prompt(target, specs[configs[k].drafter], x, decodes[k], prompt_id=chosen[j], seed=seed + j)
                times[k][j].append(m.seconds)
                if r == 0:
                    configs[k].tokens.append(m.new_tokens)
                progress.advance()
    for c, t, p in zip(configs, times, predicted):
        c.seconds = [statistics.median(x) for x in t]
        c.measured_id = add_measured_run(
            db, run_id, draft=None if c.drafter == "none" else c.drafter,
            config={"num_speculative_tokens": c.num_speculative_tokens, "threshold": c.threshold,
                    "threshold_rule": c.threshold_rule, "schedule": c.schedule, "batch_size": 1,
                    "temperature": temperature, "max_new_tokens": max_new, "num_prompts": len(xs), "repeats": repeats,
                    "split": split, "prompt_ids": chosen, "per_prompt_seconds": c.seconds,
                    "throughput": "end to end, prefill included", "source": "tune"},
            measured_tokens_per_s=c.tokens_per_s, seconds=sum(c.seconds), new_tokens=sum(c.tokens),
            measured_tau=None)
        if p is not None:
            set_prediction(db, c.measured_id, predicted_tokens_per_s=p, predicted_tau=None,
                           extra={"prediction_source": "profiled tuning prompts"})
    return list(configs)
