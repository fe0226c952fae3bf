"""The user's objective on vLLM (``tune --backend vllm --objective ...``): measured values of a server
measurement, the predicted value used to choose what to measure, and the per-batch-size guard.

Measured (what decides): throughput is the group throughput; goodput counts the tokens of the requests
whose TPOT and TTFT, from their token arrivals (``profiler.backends._vllm_measure``: engine steps as a streaming
client sees them), meet the SLO, over the seconds of every group; cost is the price over the
throughput; energy is NVML's joules of the calls (a GPU only). Each has a bootstrap 95% CI over
groups and repeats (``specdec_tune.core.stats``).

Predicted (what to measure first): the calibrated server throughput (``tuner.servers.predict_server``)
times the share of requests meeting the SLO, with each request's TPOT from the engine's latency model
scaled by the server's predicted throughput over the engine's: an approximation that only orders the
confirmation; the winner is the best measured.

The guard (docs/servers.md, Exports): a batch size whose held-out speedup's paired 95% CI lower bound
is below 1 speculates 0 there and at every larger batch size, and the reason names the numbers
(TensorRT-LLM's ``draft_len_schedule`` takes no N above the smallest batch size's, and speculation
pays less as batches grow).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specdec_tune.core.costs import usd_ci, usd_per_million_tokens
from specdec_tune.core.stats import RateSamples, tokens_per_s_ci
from specdec_tune.tuner.model import MIN_LOWER, Candidate, Evaluator, Objective, predict_latency, predicted_value
from specdec_tune.tuner.model import profiled_specs, spec_config


def _good(m: Any, objective: Objective) -> RateSamples | None:
    """The measurement's samples with each group's tokens cut to those of its requests meeting the SLO."""
    keys = list(dict.fromkeys(g.prompt_ids for g in m.groups))
    rows: dict[tuple, list[Any]] = {k: [g for g in m.groups if g.prompt_ids == k] for k in keys}
    if any(len(g.arrivals) != len(g.prompt_ids) for g in m.groups):
        return None
    slo = objective.slo
    tokens = tuple(tuple(float(sum(r.new_tokens for r in g.arrivals if slo.meets(r.ttft_s, r.tpot_s))) for g in rows[k])
                   for k in keys)
    return RateSamples(tuple("+".join(k) for k in keys), tokens, tuple(tuple(g.seconds for g in rows[k]) for k in keys))


def server_value(m: Any, objective: Objective) -> tuple[float | None, tuple[float, float] | None]:
    """(measured value, 95% CI) of the objective for one ``ServerMeasurement`` (None where not measured)."""
    name = objective.name
    if name == "throughput":
        return m.tokens_per_s, m.ci95
    if name == "goodput":
        good = _good(m, objective)
        return (None, None) if good is None else (good.tokens_per_s, tokens_per_s_ci(good))
    if name == "cost":
        price = objective.gpu_price or 0.0
        return usd_per_million_tokens(price, m.tokens_per_s), usd_ci(price, m.ci95)
    if name == "energy":
        e = m.energy
        return (None, None) if e is None else (e.joules_per_token, e.ci95())
    return None, None


def server_slo(m: Any, objective: Objective) -> dict[str, Any] | None:
    """Whether a server measurement met the SLO (per-prompt medians' percentile, as ``tune`` reports it)."""
    from specdec_tune.core.latency import slo_met, quantile

    lat = m.latency
    if not objective.slo.active or lat is None:
        return None
    ttft, tpot = lat.per_prompt("ttft_s"), lat.per_prompt("tpot_s")
    q = objective.slo.percentile / 100.0
    return {"describe": objective.slo.describe(), "met": slo_met(objective.slo, ttft, tpot),
            "tpot_s": quantile(tpot, q), "ttft_s": quantile(ttft, q), "percentile": objective.slo.percentile,
            "label": "measured"}


def sort_key(objective: Objective):
    """Best first by the measured value (a value not measured sorts last), then throughput."""
    sign = -1.0 if objective.direction == "maximize" else 1.0

    def key(m: Any) -> tuple[float, float]:
        v = server_value(m, objective)[0]
        return (sign * v if v is not None and math.isfinite(v) else math.inf, -m.tokens_per_s)

    return key


def predicted_server_value(objective: Objective, evaluator: Evaluator, c: Candidate, server_tokens_per_s: float,
                           batch_size: int) -> float:
    """The predicted value of ``c`` on the server (module docstring)."""
    attainment = 1.0
    if objective.slo.active:
        rp = evaluator.profile(None if c.is_plain else c.drafter)
        config = spec_config(c, evaluator.mode, batch_size)
        engine = evaluator.score(c).predicted_tokens_per_s if batch_size == 1 else None
        lat = predict_latency(rp, config, profiled_specs(rp))
        if engine and server_tokens_per_s > 0:
            lat = lat.scaled(server_tokens_per_s / engine)  # the server's speed, the engine's spread
        attainment = lat.attainment(objective.slo)
    return predicted_value(objective.name, server_tokens_per_s, attainment, None, objective.gpu_price, objective.watts)


def guard_schedule(schedule: dict[int, int], rows: Sequence[dict[str, Any]]) -> tuple[dict[int, int], dict[int, str]]:
    """The schedule with every batch size whose held-out speedup CI's lower bound is below 1 (and every
    larger one) set to 0, and why each batch size's N is what it is (module docstring)."""
    out, reasons, off = dict(schedule), {}, None
    for row in sorted(rows, key=lambda r: r["batch_size"]):
        b = int(row["batch_size"])
        run = row.get("schedule") or row.get("constant")
        if off is not None:
            out[b] = 0
            reasons[b] = f"0: speculation turned off from B={off} (measured no faster there)"
            continue
        if not out.get(b) or run is None:
            reasons[b] = "0: plain decoding measured best here (tuning prompts)" if not out.get(b) else "not measured"
            ci = (row.get("schedule") or {}).get("speedup_ci")
            if not out.get(b) and ci and ci[1] < MIN_LOWER:  # vLLM pays for speculation configured at N = 0
                reasons[b] += (f"; the server running this schedule measured {row['schedule']['speedup']:.2f}× plain "
                               f"decoding here held out (95% CI {ci[0]:.2f}–{ci[1]:.2f}): speculation configured "
                               "but off still costs per step, a plain server is faster at this batch size")
            continue
        ci = run.get("speedup_ci")
        text = f"measured {run['speedup']:.2f}× over plain decoding held out (95% CI {ci[0]:.2f}–{ci[1]:.2f})"
        if ci[0] < MIN_LOWER:
            off = b
            out[b] = 0
            reasons[b] = f"0: N={schedule[b]} {text}: the CI's lower bound is below {MIN_LOWER:g}, may be slower"
        else:
            reasons[b] = f"N={out[b]}: {text}"
    return out, reasons
