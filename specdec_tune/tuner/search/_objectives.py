"""The user's objective in ``tune``'s later stages: per-batch-size schedules chosen under the SLO, the
objective's measured value (with its 95% CI) and whether the SLO was met, and what a memory budget
costs a configuration in batch.

Schedules (docs/architecture.md, The throughput model, 7): at each batch size B the N (0 = do not
speculate) with the best predicted value of the objective, end to end at B: goodput at B is the
predicted tokens/s at B times the share of requests whose predicted TPOT at B (the per-cycle time at B
over the replayed acceptance) meets the SLO. Speculation shortens TPOT at small B and lengthens it
where verify costs grow with B, so under an SLO the N at large B can differ from throughput's. A
per-context-length schedule is not made: no server in the capability table takes one (vLLM RFC
#48627 proposes a context-length axis; its PR #48944 is open).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specdec_tune.core.costs import usd_ci, usd_per_million_tokens
from specdec_tune.core.errors import InputError
from specdec_tune.core.latency import good_samples, slo_met
from specdec_tune.core.stats import tokens_per_s_ci
from specdec_tune.tuner.model import SEARCH_BASIS, Candidate, Evaluator, MemoryModel, Objective, better
from specdec_tune.tuner.model import predict_baseline
from specdec_tune.tuner.model import predict_config
from specdec_tune.tuner.model import predict_latency, predicted_value, profiled_specs, spec_config
from specdec_tune.tuner.search._measure import Measured


def _value_at(evaluator: Evaluator, c: Candidate, b: int) -> tuple[float, float]:
    """(the predicted value of the evaluator's objective, tokens/s) for ``c`` at batch size ``b``."""
    o = evaluator.objective
    rp = evaluator.profile(None if c.is_plain else c.drafter)
    config = spec_config(c, evaluator.mode, b)
    rate = _rate(rp, c, config)
    attainment = 1.0
    if o.slo.active:
        attainment = predict_latency(rp, config, profiled_specs(rp)).attainment(o.slo)
    return predicted_value(o.name, rate, attainment, None, o.gpu_price, o.watts), rate


def objective_schedule(evaluator: Evaluator, c: Candidate, batch_sizes: Sequence[int], n_max: int) -> dict[int, int]:
    """Best N per batch size for ``c``'s drafter and θ by the evaluator's objective (module docstring);
    N = 0 always competes; equal values go to the higher throughput (where no N meets an SLO, goodput
    is 0 for all), then to the smaller N.

    Raises:
        InputError: the profile lacks T_v(B, k) at a batch size asked (profile with --batch-sizes).
    """
    out: dict[int, int] = {}
    for b in batch_sizes:
        name = evaluator.objective.name
        best_n, (best_v, best_rate) = 0, _value_at(evaluator, Candidate("none", 0), b)
        if not c.is_plain:
            for n in range(1, n_max + 1):
                v, rate = _value_at(evaluator, Candidate(c.drafter, n, c.threshold, c.threshold_rule, c.schedule), b)
                if better(name, v, best_v) or (v == best_v and rate > best_rate):
                    best_n, best_v, best_rate = n, v, rate
        out[int(b)] = best_n
    return out


def measured_value(m: Measured, objective: Objective, name: str | None = None
                   ) -> tuple[float | None, tuple[float, float] | None]:
    """(value, 95% CI) of objective ``name`` (default: the objective's own) measured for ``m``;
    ``(None, None)`` where it was not measured (energy without NVML, memory without --memory)."""
    name = name or objective.name
    meas = m.validated.measurement
    if name == "throughput":
        return m.tokens_per_s, m.ci
    if name == "goodput":
        if meas.latency is None:
            return None, None
        good = good_samples(meas.samples, meas.latency, objective.slo)
        return good.tokens_per_s, tokens_per_s_ci(good)
    if name == "cost":
        return usd_per_million_tokens(objective.gpu_price or 0.0, m.tokens_per_s), usd_ci(objective.gpu_price or 0.0,
                                                                                          m.ci)
    if name == "energy":
        e = meas.energy
        return (None, None) if e is None else (e.joules_per_token, e.ci95())
    if name == "memory":
        peak = getattr(meas, "peak_memory", None)
        return (None, None) if peak is None else (peak.bytes, None)
    if name == "bias":  # measured per rule and ε on the profile's front, not per measured run
        return None, None
    raise InputError(f"unknown objective {name!r}")


def slo_outcome(m: Measured, objective: Objective) -> dict[str, Any] | None:
    """Whether the measured requests met the SLO: the SLO's percentile of per-prompt TTFT and TPOT
    (medians of repeats) against its bounds, with those percentiles (None without an SLO)."""
    slo = objective.slo
    lat = m.validated.measurement.latency
    if not slo.active or lat is None:
        return None
    ttft, tpot = lat.per_prompt("ttft_s"), lat.per_prompt("tpot_s")
    q = slo.percentile / 100.0
    import numpy as np

    return {"slo": slo.to_dict(), "describe": slo.describe(), "met": slo_met(slo, ttft, tpot),
            "tpot_s": float(np.quantile(tpot, q)) if tpot else None,
            "ttft_s": float(np.quantile(ttft, q)) if ttft else None, "percentile": slo.percentile,
            "label": "measured"}


def pick_measured(measured: Sequence[Measured], objective: Objective) -> Measured:
    """The best measured by the objective (throughput: the speedup over plain decoding measured in the same
    passes, which a machine that slows down during a pass does not move; the others by their measured value, with the
    speedup breaking ties and standing in where a value was not measured)."""
    def speed(m: Measured) -> float:
        return m.speedup if m.speedup is not None else m.tokens_per_s

    if objective.name == "throughput":
        return max(measured, key=speed)
    best = measured[0]
    for m in measured[1:]:
        a, b = measured_value(m, objective)[0], measured_value(best, objective)[0]
        if better(objective.name, a, b) or (a is not None and a == b and speed(m) > speed(best)):
            best = m
    return best


def at_load(evaluator: Evaluator, c: Candidate, batch: int) -> float | None:
    """Predicted tokens/s of ``c`` serving ``batch`` sequences (None: the profile cannot predict that batch)."""
    if batch < 1:
        return 0.0
    rp = evaluator.profile(None if c.is_plain else c.drafter)
    try:
        return _rate(rp, c, spec_config(c, evaluator.mode, batch))
    except InputError:
        return None


def _rate(rp: Any, c: Candidate, config: Any) -> float:
    """Predicted end-to-end tokens/s of ``c`` (plain decoding from the target-only profile)."""
    if c.is_plain:
        return predict_baseline(rp, config.batch_size).tokens_per_s
    return predict_config(rp, config).tokens_per_s


def budget_rows(evaluator: Evaluator, mm: MemoryModel, budget: float, candidates: Sequence[Candidate], context: int,
                load: int) -> list[dict[str, Any]]:
    """Per candidate at the memory budget (all predicted): its bytes at B = 1, the largest batch it serves,
    the sequences of batch its draft costs against plain decoding, and its tokens/s at a load of ``load``
    concurrent requests, served ``min(load, largest batch)`` at a time: where a draft's weights and
    cache cost it batch, n-gram lookup or plain decoding can serve more at high load."""
    rows = []
    for c in candidates:
        most = mm.max_batch_size(c, budget, context)
        served = min(load, most)
        rows.append({"label": c.label(), "bytes_b1": mm.bytes(c, 1, context), "max_batch_size": most,
                     "draft_cost_in_batch": mm.draft_cost_in_batch(c, budget, context), "load": load,
                     "served_batch": served, "tokens_per_s_at_load": at_load(evaluator, c, served),
                     "label_kind": "predicted"})
    return rows


def finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def mean_power_w(db: Any, run_id: int) -> float | None:
    """The device's mean power over the profile run (NVML samples; None on a CPU or without NVML)."""
    from specdec_tune.db import load_telemetry

    watts = [t.power_w for t in load_telemetry(db, run_id) if t.power_w is not None]
    return sum(watts) / len(watts) if watts else None


def engine_reasons(schedule: dict[int, int]) -> dict[int, str]:
    """Why each batch size's N is what it is, for a schedule our engine measured at B = 1 only: B = 1 is
    the measured (held-out) decision; every other batch size is the model's prediction from T_v(B, k)."""
    out = {}
    for b, n in sorted(schedule.items()):
        if b == 1:
            out[b] = "measured held out (the decision's numbers)"
        elif n == 0:
            out[b] = f"predicted: speculation does not pay at B={b} (not measured: our engine decodes one sequence)"
        else:
            out[b] = f"predicted N={n} at B={b} (not measured: our engine decodes one sequence)"
    return out


def _side(m: Measured, objective: Objective) -> dict[str, Any]:
    value, ci = measured_value(m, objective)
    return {"label": m.candidate.label(), "value": finite(value), "ci": None if ci is None else [finite(x) for x in ci],
            "measured": "held-out prompts" if m.heldout else "tuning prompts", "slo": slo_outcome(m, objective)}


def objective_report(objective: Objective, win: Measured, plain: Measured, searched: Any, req: Any) -> dict[str, Any]:
    """What was optimised and how the winner and plain decoding came out on the held-out prompts (the
    objective's measured value with its 95% CI, and whether the SLO was met), with the winner's
    predicted value; under a memory budget, what it costs each candidate in batch."""
    out: dict[str, Any] = {**objective.to_dict(), "describe": objective.describe(), "winner": _side(win, objective),
                           "plain": _side(plain, objective)}
    try:
        out["predicted"] = finite(searched.evaluator.score(win.candidate).value(objective.name, objective))
    except InputError:
        out["predicted"] = None
    out["predicted_basis"] = SEARCH_BASIS  # not the held-out prediction beside the measurement: say so
    if objective.memory_budget_bytes is not None:
        from specdec_tune.tuner.search._memory import memory_model

        ctx = searched.run.settings.max_prompt_tokens + req.max_new_tokens
        mm = memory_model(searched.evaluator.db, searched.run.id, ctx)
        n = max(win.candidate.num_speculative_tokens, 1)
        others = [Candidate(d, n) for d in req.drafts if d != win.candidate.drafter]
        out["budget"] = budget_rows(searched.evaluator, mm, objective.memory_budget_bytes,
                                    [win.candidate, plain.candidate, *others], ctx, max(req.batch_sizes))
    return out
