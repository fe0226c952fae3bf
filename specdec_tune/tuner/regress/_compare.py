"""Compare one run's per-prompt samples with a baseline's: the cells of a regression verdict.

A *cell* is one (benchmark, metric): ``speedup`` (per prompt, speculative tokens/s over the paired
plain decode's, measured seconds apart: what speculation buys, robust to a slower or faster
machine), ``tokens_per_s`` and ``latency`` (absolute speed; all three on per-prompt samples,
Mann-Whitney U + bootstrap CI of the ratio of medians), ``acceptance@i`` (per-position accepted /
reached counts, two-proportion test), ``correctness`` (greedy output equals plain decoding's) and
``model_error`` (prediction vs measurement, when the benchmark names a profile run). The absolute
cells divide out the machine's own speed: each side's samples are scaled by the machine probe timed
in the same repeat (``profiler.machine_probe``: a fixed synthetic decoder step that neither our code
nor a model can move; :func:`machine_factors`), so a night on which the whole machine ran 8 % slower
moves the probe and the decode alike and leaves the cell's ratio at 1. :func:`decide`
applies the rule across all cells of a run: a drop larger than ``min_drop`` (and, for a speed metric
with a calibrated noise floor, larger than that floor: the minimum detectable change that
``regress --calibrate`` measured between runs) whose Benjamini-Hochberg adjusted p-value is at most
``q`` is flagged; flagged in ``persist`` consecutive runs = regression.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from specdec_tune.core.consistency import Consistency, judge, overall
from specdec_tune.db import CellVerdict
from specdec_tune.tuner.regress._explain import explain, side_terms
from specdec_tune.tuner.regress._significance import bh_adjust, median_ratio, minimum_detectable_change, proportion_mdc
from specdec_tune.tuner.regress._significance import speed_test, two_proportion
from specdec_tune.tuner.regress._suite import Rules

SPEED_METRICS = ("speedup", "tokens_per_s", "latency")
FLAGGED = ("suspicious", "regression")


@dataclass(frozen=True)
class Cell(CellVerdict):
    """A verdict on one (benchmark, metric), as stored (``db.CellVerdict``); ``effect`` = current / baseline."""

    @property
    def higher_is_better(self) -> bool:
        return self.metric != "latency" and self.metric != "model_error"


def machine_factors(samples: Sequence[dict]) -> list[float] | None:
    """Per repeat, the median over the benchmark's prompts of the machine probe's seconds (the
    machine's speed during that pass); None unless every prompt has one probe timing per repeat."""
    if not samples or any(len(s.get("probe_seconds") or []) != len(s.get("seconds") or []) for s in samples):
        return None  # no probe, or not one per repeat: cannot be paired with the decodes
    n = len(samples[0]["probe_seconds"])
    if n == 0 or any(len(s["probe_seconds"]) != n for s in samples):
        return None
    return [statistics.median(s["probe_seconds"][i] for s in samples) for i in range(n)]


def _adjusted(values: dict[str, list[float]], factors: list[float], ref: float, what: str) -> dict[str, list[float]]:
    """Values in the reference machine speed ``ref`` (seconds of the probe): tokens/s scale with the
    probe's seconds, latency against them."""
    if what == "latency":
        return {k: [v * ref / f for v, f in zip(vs, factors)] for k, vs in values.items()}
    return {k: [v * f / ref for v, f in zip(vs, factors)] for k, vs in values.items()}


def _per_prompt(samples: Sequence[dict], what: str) -> dict[str, list[float]]:
    """prompt id -> one value per repeat (tokens/s, or latency in ms)."""
    out: dict[str, list[float]] = {}
    for s in samples:
        if what == "speedup":  # paired per repeat: the plain decode ran right after the speculative one
            pairs = [(x, y) for x, y in zip(s.get("seconds") or [], s.get("plain_seconds") or []) if x > 0 and y > 0]
            if pairs and s.get("new_tokens") and s.get("plain_new_tokens"):
                out[s["prompt_id"]] = [(s["new_tokens"] / x) / (s["plain_new_tokens"] / y) for x, y in pairs]
            continue
        secs = [x for x in s.get("seconds") or [] if x > 0]
        if not secs or not s.get("new_tokens"):
            continue
        out[s["prompt_id"]] = [s["new_tokens"] / x if what == "tokens_per_s" else 1e3 * x for x in secs]
    return out


def _median_of_prompts(values: dict[str, list[float]]) -> float | None:
    return statistics.median(statistics.median(v) for v in values.values()) if values else None


def _speed_cells(name: str, base: Sequence[dict], cur: Sequence[dict], rules: Rules, no_speed: str | None,
                 calib: Mapping[tuple[str, str], float], machine: bool = True) -> list[Cell]:
    cells = []
    fb, fc = (machine_factors(base), machine_factors(cur)) if machine else (None, None)
    for metric in SPEED_METRICS:
        b, c = _per_prompt(base, metric), _per_prompt(cur, metric)
        bval, cval = _median_of_prompts(b), _median_of_prompts(c)
        extra: dict[str, Any] = {}
        if metric != "speedup":  # the speedup is a ratio of two decodes on the same machine already
            if fb and fc:
                ref = statistics.median(fb)
                raw = median_ratio(b, c) if b and c else None
                b, c = _adjusted(b, fb, ref, metric), _adjusted(c, fc, ref, metric)
                extra = {"machine_ratio": statistics.median(fc) / ref, "raw_ratio": raw,
                         "machine": "divided out (probe seconds current/baseline = machine_ratio)"}
            else:
                extra = {"machine": "not divided out: " + ("off" if not machine else "a side has no machine-probe timings")}
        if metric == "speedup" and not (b and c):
            cells.append(Cell(name, metric, "no_verdict", bval, cval, details={"reason": (
                "no paired plain reference: a plain-decoding benchmark, or a side measured before references")}))
            continue
        if no_speed:
            cells.append(Cell(name, metric, "no_verdict", bval, cval, details={"reason": no_speed}))
            continue
        t = speed_test(b, c, resamples=rules.bootstrap)
        if t.n_current < rules.min_samples:
            reason = f"too few prompts on both sides ({t.n_current} < min_samples {rules.min_samples})"
            cells.append(Cell(name, metric, "no_verdict", bval, cval, details={"reason": reason}))
            continue
        mdc, src = calib.get((name, metric)), "calibration"
        if mdc is None:
            mdc, src = minimum_detectable_change(t.se_log), "this run's bootstrap"
        cells.append(Cell(name, metric, "pending", bval, cval, t.ratio, t.ci[0], t.ci[1], t.p_value, mdc=mdc,
                          details={"n": t.n_current, "se_log": t.se_log, "mdc_source": src,
                                   "unit": {"tokens_per_s": "tokens/s", "speedup": "× plain decoding"}.get(
                                       metric, "ms per prompt"), **extra}))
    return cells


def _sum_counts(samples: Sequence[dict], key: str, i: int) -> int:
    return sum(s[key][i] for s in samples if len(s.get(key) or []) > i)


def _acceptance_cells(name: str, base: Sequence[dict], cur: Sequence[dict], positions: int, rules: Rules,
                      calib: Mapping[tuple[str, str], float]) -> list[Cell]:
    cells = []
    for i in range(positions):
        metric = f"acceptance@{i + 1}"
        k1, n1 = _sum_counts(base, "accepted", i), _sum_counts(base, "reached", i)
        k2, n2 = _sum_counts(cur, "accepted", i), _sum_counts(cur, "reached", i)
        if min(n1, n2) < rules.min_reached:
            reason = f"too few cycles reach position {i + 1} ({min(n1, n2)} < min_reached {rules.min_reached})"
            cells.append(Cell(name, metric, "no_verdict", k1 / n1 if n1 else None, k2 / n2 if n2 else None,
                              details={"reason": reason, "counts": [k1, n1, k2, n2]}))
            continue
        t = two_proportion(k1, n1, k2, n2)
        mdc = calib.get((name, metric), proportion_mdc(t.baseline_rate, min(n1, n2)))
        cells.append(Cell(name, metric, "pending", t.baseline_rate, t.current_rate, t.ratio, mdc=mdc,
                          p_value=t.p_value, details={"counts": [k1, n1, k2, n2], "diff_ci": list(t.ci),
                                                      "rate": "α_i conditional"}))
    return cells


def _correctness_cell(name: str, cur: Sequence[dict], temperature: float) -> Cell:
    """Greedy outputs against plain decoding's under the consistency rule (``specdec_tune.core.consistency``):
    float32 must be identical; in bfloat16/float16 an output may part only at a near-tie."""
    checked = [s for s in cur if s.get("plain_token_ids") is not None]
    if temperature > 0 or not checked:
        why = "sampling: outputs are random" if temperature > 0 else "plain decoding (nothing to compare)"
        return Cell(name, "correctness", "no_verdict", details={"reason": f"not checked: {why}"})
    verdicts = {s["prompt_id"]: _judged(s) for s in checked}
    bad = [pid for pid, v in verdicts.items() if v.status == "differ"]
    ties = {pid: v.position for pid, v in verdicts.items() if v.status == "near-tie"}
    dtypes = sorted({v.dtype for v in verdicts.values()})
    return Cell(name, "correctness", "fail" if bad else "ok", 0.0, len(bad) / len(checked), details={
        "prompts": len(checked), "differing_prompts": bad[:10],
        "verdict": overall([v.status for v in verdicts.values()]),
        "near_ties": dict(list(ties.items())[:10]), "parted_share": (len(bad) + len(ties)) / len(checked),
        "reasons": {pid: verdicts[pid].reason for pid in (bad + list(ties))[:10]}, "dtype": ", ".join(dtypes),
        "rule": "greedy speculative output equals plain decoding's (float32), or parts from it only at a near-tie "
                "of the target's logits (bfloat16/float16)"})


def _judged(sample: Mapping[str, Any]) -> Consistency:
    """The consistency rule on one stored sample (samples stored before the rule are float32)."""
    parted = sample.get("parted") or {}
    return judge(sample["plain_token_ids"], sample["token_ids"], sample.get("dtype") or "float32",
                 parted.get("margin"), parted.get("top_logit"))


def _resume_cell(name: str, cur: Sequence[dict], rules: Rules) -> Cell | None:
    """A schedule benchmark's check (``profiler.schedule_check``): after speculation resumes, acceptance
    at least (1 - ``resume_tolerance``) x a fresh drafter's on the same continuations (TensorRT-LLM #16888)."""
    checks = [s["resume"] for s in cur if s.get("resume")]
    if not checks:
        return None
    resumed = [c for c in checks if c.get("resume_cycle") is not None and c.get("fresh_drafted")]
    if not resumed:
        return Cell(name, "resume_acceptance", "no_verdict", details={
            "reason": "the load trace never turned speculation off and back on (or nothing was left to decode)"})
    rate = sum(c["accepted"] for c in resumed) / max(sum(c["drafted"] for c in resumed), 1)
    fresh = sum(c["fresh_accepted"] for c in resumed) / sum(c["fresh_drafted"] for c in resumed)
    ratio = rate / fresh if fresh > 0 else 1.0
    verdict = "fail" if ratio < 1.0 - rules.resume_tolerance else "ok"
    return Cell(name, "resume_acceptance", verdict, 1.0, ratio, details={
        "acceptance_after_resume": rate, "fresh_acceptance": fresh, "prompts": len(resumed),
        "rule": f"acceptance after speculation resumes >= {1 - rules.resume_tolerance:.2f} x a fresh drafter's"})


def compare_benchmark(name: str, base: Sequence[dict] | None, cur: Sequence[dict], config: Mapping[str, Any],
                      rules: Rules, *, no_speed: str | None = None,
                      calib: Mapping[tuple[str, str], float] | None = None,
                      model_error: Callable[[], tuple[float, float] | str] | None = None,
                      missing: str = "the baseline has no such benchmark", machine: bool = True) -> list[Cell]:
    """Cells of one benchmark (verdicts of testable cells stay ``pending`` until :func:`decide`).

    Args:
        base: the baseline's samples (``None``: the baseline lacks this benchmark).
        cur: this run's samples.
        config: the resolved benchmark (``num_speculative_tokens``, ``temperature``, ``draft``).
        no_speed: when set, the reason speed cells give no verdict (fingerprint changed).
        calib: calibrated minimum detectable changes by (benchmark, metric).
        model_error: returns (predicted, measured) tokens/s, or a reason why no prediction exists.
        missing: the reason speed cells give when ``base`` is None.
        machine: divide the machine probe's speed out of tokens/s and latency (when both sides
            have probe timings and ``rules.machine_probe`` is on); False compares raw absolute speed.
    """
    calib = calib or {}
    cells = [_correctness_cell(name, cur, float(config.get("temperature", 0.0)))]
    resume = _resume_cell(name, cur, rules)
    if resume is not None:  # needs no baseline: the same run's fresh drafter is the reference
        cells.append(resume)
    if model_error is not None:  # needs no baseline: prediction vs this run's measurement
        got = model_error()
        if isinstance(got, str):
            cells.append(Cell(name, "model_error", "no_verdict", details={"reason": got}))
        else:
            predicted, measured = got
            err = predicted / measured - 1.0
            verdict = "pending_tol" if abs(err) > rules.model_error_tolerance else "ok"
            cells.append(Cell(name, "model_error", verdict, None, err, details={
                "predicted_tokens_per_s": predicted, "measured_tokens_per_s": measured,
                "tolerance": rules.model_error_tolerance}))
    if base is None:
        return cells + [Cell(name, m, "no_verdict", details={"reason": missing}) for m in SPEED_METRICS]
    cells += _speed_cells(name, base, cur, rules, no_speed, calib, machine and rules.machine_probe)
    n = int(config.get("num_speculative_tokens") or 0)
    if config.get("draft", "none") != "none" and n > 0:
        cells += _acceptance_cells(name, base, cur, n, rules, calib)
    return cells


def decide(cells: Sequence[Cell], rules: Rules, flagged_before: Mapping[tuple[str, str], int]) -> list[Cell]:
    """Apply the rule across all cells of a run.

    Args:
        flagged_before: (benchmark, metric) -> number of consecutive previous runs that flagged it.
    """
    testable = [i for i, c in enumerate(cells) if c.verdict == "pending"]
    qs = bh_adjust([cells[i].p_value if cells[i].p_value is not None else math.nan for i in testable])
    out = list(cells)
    for i, q in zip(testable, qs):
        c = cells[i]
        floor = rules.min_drop
        if c.metric in SPEED_METRICS and c.details.get("mdc_source") == "calibration" and c.mdc and math.isfinite(c.mdc):
            floor = max(floor, c.mdc)  # a change inside the measured run-to-run noise is not a verdict
        worse = c.effect < 1 - floor if c.higher_is_better else c.effect > 1 + floor
        better = c.effect > 1 + floor if c.higher_is_better else c.effect < 1 - floor
        significant = not math.isnan(q) and q <= rules.q
        if worse and significant:
            verdict = _persisted(c, rules, flagged_before)
        else:
            verdict = "improved" if better and significant else "ok"
        out[i] = replace(c, verdict=verdict, q_value=q)
    for i, c in enumerate(out):
        if c.verdict == "pending_tol":  # model error beyond tolerance: flagged, persistence applies
            out[i] = replace(c, verdict=_persisted(c, rules, flagged_before))
    return out


def _persisted(c: Cell, rules: Rules, flagged_before: Mapping[tuple[str, str], int]) -> str:
    return "regression" if flagged_before.get((c.benchmark, c.metric), 0) >= rules.persist - 1 else "suspicious"


def explain_benchmark(cells: Sequence[Cell], base: Sequence[dict], cur: Sequence[dict], n: int) -> str | None:
    """The model's explanation of a flagged speed or acceptance change (None when neither is flagged)."""
    flagged = [c for c in cells if (c.metric in SPEED_METRICS or c.metric.startswith("acceptance@"))
               and c.verdict in FLAGGED]
    if not flagged:
        return None
    if n <= 0:
        return "plain decoding: the target's decode step itself got slower (no speculative terms to split)"
    positions = max(n, 1)
    b, c = side_terms(base, positions), side_terms(cur, positions)
    if b is None or c is None:
        return "no speculative cycles recorded on one side: cannot split the change"
    fallen = [int(x.metric.split("@")[1]) for x in cells
              if x.metric.startswith("acceptance@") and x.verdict in FLAGGED]
    return explain(b, c, n, fallen).text
