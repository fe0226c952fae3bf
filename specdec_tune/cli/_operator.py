"""What operators pay for, as ``measure`` and ``tune`` print it: latency percentiles, energy, cost and
memory, each labelled measured (with its 95% CI) or predicted."""
from __future__ import annotations

import math
from typing import Annotated, Any

import typer

from specdec_tune.core.errors import InputError

GpuPriceOption = Annotated[float | None, typer.Option("--gpu-price", metavar="USD_PER_HOUR", help=(
    "What the device costs per hour: throughput is also reported (and stored) as dollars per million tokens."))]
MemoryOption = Annotated[bool, typer.Option("--memory", help=(
    "Also measure each configuration's own peak memory (one decode in a fresh process: max_memory_allocated on a "
    "GPU, the resident set over a warmed-up baseline on a CPU) next to the predicted memory."))]


def checked_price(price: float | None) -> float | None:
    from specdec_tune.core.costs import check_price

    try:
        return check_price(price)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _ms(entry: dict | None) -> str:
    if not entry or entry.get("value") is None:
        return "–"
    ci = entry.get("ci")
    inside = f" [{ci[0] * 1e3:.1f}-{ci[1] * 1e3:.1f}]" if ci else ""
    return f"{entry['value'] * 1e3:.1f} ms{inside}"


def plain_ms(entry: dict | None) -> str:
    """A latency summary entry's value in ms without its CI (``–`` where it has none)."""
    return "–" if not entry or entry.get("value") is None else f"{entry['value'] * 1e3:.1f} ms"


def _predicted_ms(seconds: float) -> str:
    return "–" if math.isnan(seconds) else f"{seconds * 1e3:.1f} ms"


def _missing(s: dict[str, Any]) -> str:
    """Why some latency value or CI is missing ("–" or no bracket), one clause per statistic."""
    names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "token_gap_s": "inter-token gap"}
    labels: dict[str, list[str]] = {}  # reason -> the statistics it applies to (one prompt: all of them)
    for key, label in names.items():
        why = next((e.get("why") for e in s[key].values() if e.get("why")), None)
        if why:
            labels.setdefault(why, []).append(label)
    return "".join(f"; {', '.join(stats)}: {why}" for why, stats in labels.items())


def latency_lines(measurement: Any, predicted: Any | None) -> list[str]:
    """TTFT, TPOT and inter-token gaps measured (p50 / p90 / p99, 95% CIs) and TPOT predicted; a statistic
    without a value or CI says why."""
    s = measurement.latency_summary
    if not s:
        return []
    tpot, ttft, gap = s["tpot_s"], s["ttft_s"], s["token_gap_s"]
    lines = [f"latency measured: TTFT p50 {_ms(ttft['p50'])}, p99 {_ms(ttft['p99'])}; TPOT (decode window) p50 "
             f"{_ms(tpot['p50'])}, p90 {_ms(tpot['p90'])}, p99 {_ms(tpot['p99'])}; inter-token gap p50 "
             f"{_ms(gap['p50'])}, p99 {_ms(gap['p99'])}; {s['mean_burst'] or 1:.2f} tokens per arrival{_missing(s)}"]
    if predicted is not None:
        lines.append(f"latency predicted: TTFT p50 {_predicted_ms(predicted.ttft(0.5))}; TPOT p50 "
                     f"{_predicted_ms(predicted.tpot(0.5))}, p90 {_predicted_ms(predicted.tpot(0.9))} "
                     f"({predicted.source})")
    return lines


def cost_lines(measurement: Any) -> list[str]:
    """Energy per token (only where NVML measured it) and dollars per million tokens."""
    from specdec_tune.core.costs import usd_ci

    e = measurement.energy
    lines = []
    if e is not None and e.joules_per_token is not None:
        ci = e.ci95()
        lines.append(f"energy measured: {e.joules_per_token:.3f} J/token"
                     + (f" (95% CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else "") + f", {e.total_j:.1f} J over the passes")
    else:
        lines.append("energy: – (not measured: no NVML energy counter on this device)")
    price = measurement.gpu_price
    if price is not None:
        ci = usd_ci(price, measurement.ci95)
        lines.append(f"cost measured: ${measurement.usd_per_million_tokens:.4f} per million tokens at ${price:g}/h"
                     + (f" (95% CI {ci[0]:.4f}-{ci[1]:.4f})" if ci else ""))
    return lines


def memory_lines(measurement: Any, predicted: Any | None) -> list[str]:
    peak = getattr(measurement, "peak_memory", None)
    if peak is None:
        return []
    line = f"memory measured: {peak.bytes / 2**20:.1f} MiB peak ({peak.method})"
    if predicted is not None:
        err = (predicted.total - peak.bytes) / peak.bytes * 100
        parts = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in predicted.to_dict().items() if k != "total" and v)
        line += f"; predicted {predicted.total / 2**20:.1f} MiB ({parts}; error {err:+.1f}%)"
    return [line]


def operator_json(measurement: Any, predicted_latency: Any | None, predicted_memory: Any | None) -> dict[str, Any]:
    """The ``--json`` fields of the lines above."""
    e = measurement.energy
    peak = getattr(measurement, "peak_memory", None)
    return {
        "latency": {"measured": measurement.latency_summary,
                    "predicted": None if predicted_latency is None else predicted_latency.summary()},
        "joules_per_token": None if e is None else e.joules_per_token,
        "joules_per_token_ci": None if e is None or e.ci95() is None else list(e.ci95()),
        "gpu_price_usd_per_hour": measurement.gpu_price, "usd_per_million_tokens": measurement.usd_per_million_tokens,
        "peak_memory_bytes": None if peak is None else peak.bytes,
        "predicted_memory": None if predicted_memory is None else predicted_memory.to_dict(),
    }


ObjectiveOption = Annotated[str, typer.Option("--objective", help=(
    "What the winner is chosen by: throughput | goodput (tokens/s of requests meeting the SLO) | cost ($ per "
    "million tokens, needs --gpu-price) | energy (J/token, NVML on a GPU)."))]
SloTpotOption = Annotated[float | None, typer.Option("--slo-tpot-ms", metavar="MS", help=(
    "Latency SLO: a request's time per output token (decode window) at most this; goodput counts only requests "
    "meeting it, schedules are chosen under it."))]
SloTtftOption = Annotated[float | None, typer.Option("--slo-ttft-ms", metavar="MS", help=(
    "Latency SLO: a request's time to first token at most this."))]
SloPercentileOption = Annotated[float, typer.Option("--slo-percentile", help=(
    "The SLO is met when this percentile of requests meets the bounds (99: a p99 SLO)."))]
MemoryBudgetOption = Annotated[float | None, typer.Option("--memory-budget", metavar="GIB", help=(
    "Exclude configurations whose predicted memory (weights, packed copies, both KV caches, graph pools) does not "
    "fit; report each one's largest batch within it."))]


def _value(name: str, v: float | None) -> str:
    from specdec_tune.tuner.model import format_value

    return format_value(name, v)


def objective_lines(report: dict[str, Any]) -> list[str]:
    """``tune``'s objective section: what was optimised, the held-out measured value with its CI and
    whether the SLO was met, for the winner and plain decoding; the budget table."""
    if not report:
        return []
    from specdec_tune.tuner.model import describe_side

    name = report["objective"]
    lines = [f"objective: {report['describe']}"]
    for key in ("winner", "plain"):
        side = report.get(key) or {}
        lines.append(f"  {key} ({side.get('label', '')}): {describe_side(name, side)}")
    if report.get("predicted") is not None:
        basis = report.get("predicted_basis")
        lines.append(f"  winner predicted: {_value(name, report['predicted'])}" + (f" (for {basis})" if basis else ""))
    for row in report.get("budget") or []:
        rate = row["tokens_per_s_at_load"]
        lines.append(f"  at the {report['memory_budget_bytes'] / 2**30:g} GiB budget (predicted): {row['label']}: "
                     f"{row['bytes_b1'] / 2**20:.1f} MiB at B=1, at most B={row['max_batch_size']} (the draft costs "
                     f"{row['draft_cost_in_batch']} sequences), {'–' if rate is None else f'{rate:.1f}'} tokens/s "
                     f"serving B={row['served_batch']} of a load of {row['load']}")
    return lines


def reason_lines(reasons: dict[int, str]) -> list[str]:
    return [f"  B={b}: {r}" for b, r in sorted(reasons.items())]
