"""What ``tune`` optimises: the user's objective, its latency SLO, the device's price and a memory budget.

- ``throughput``: tokens/s (maximise), what every tuner maximises today;
- ``goodput``: tokens/s of the requests that meet ``--slo-tpot-ms`` / ``--slo-ttft-ms``
  (:mod:`specdec_tune.core.latency`; SmartSpec's goodput with an SLO), maximise;
- ``cost``: dollars per million tokens at ``--gpu-price`` (minimise);
- ``energy``: joules per token (minimise), only where NVML measured the device's power;
- ``memory``: bytes the configuration holds (minimise), for a Pareto front;
- ``bias``: a lossy acceptance rule's mean TV per verified position (minimise), for the throughput ↔
  bias front of ``tune --max-bias`` (sampling only; 0 for exact acceptance).

Predicted values come from the model (:class:`Scored`); measured ones from real decoding. Predicted
energy assumes the device draws the profile's measured mean power whatever the configuration (the
model has no power term), so it ranks as throughput does; the measured confirmation ranks on each
configuration's own joules. Pure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specdec_tune.core.costs import usd_per_million_tokens
from specdec_tune.core.errors import InputError
from specdec_tune.core.latency import Slo

OBJECTIVES = ("throughput", "goodput", "cost", "energy", "memory", "bias")
FRONT_ONLY = ("memory", "bias")  # a Pareto front's second objective, never the one the winner is chosen by
MAXIMISE = ("throughput", "goodput")
UNITS = {"throughput": "tokens/s", "goodput": "tokens/s meeting the SLO", "cost": "$ per million tokens",
         "energy": "J/token", "memory": "bytes", "bias": "mean TV per verified position"}


def direction(name: str) -> str:
    """``maximize`` or ``minimize`` (Optuna's words)."""
    return "maximize" if name in MAXIMISE else "minimize"


@dataclass(frozen=True)
class Objective:
    """The user's objective and what it needs.

    Attributes:
        name: one of :data:`OBJECTIVES` (the one the winner is chosen by).
        slo: the latency SLO (goodput counts only requests meeting it; schedules are chosen under it).
        gpu_price: dollars per hour of the device (``cost``).
        memory_budget_bytes: configurations that do not fit are excluded (None: no budget).
        watts: the device's mean power while profiling, from NVML (``energy``; None on a CPU).
    """

    name: str = "throughput"
    slo: Slo = field(default_factory=Slo)
    gpu_price: float | None = None
    memory_budget_bytes: float | None = None
    watts: float | None = None

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES or self.name in FRONT_ONLY:
            raise InputError(f"--objective must be one of throughput, goodput, cost, energy, got {self.name!r}")
        if self.name == "goodput" and not self.slo.active:
            raise InputError("--objective goodput needs an SLO: --slo-tpot-ms and/or --slo-ttft-ms")
        if self.memory_budget_bytes is not None and not self.memory_budget_bytes > 0:
            raise InputError(f"--memory-budget must be a positive number of GiB, got {self.memory_budget_bytes!r}")
        self.check(self.name)

    def check(self, name: str) -> None:
        """Refuse an objective whose inputs are missing (one line naming the flag)."""
        if name == "cost" and self.gpu_price is None:
            raise InputError("the cost objective needs the device's price: --gpu-price USD_PER_HOUR")
        if name == "goodput" and not self.slo.active:
            raise InputError("the goodput objective needs an SLO: --slo-tpot-ms and/or --slo-ttft-ms")

    def check_energy(self, device: str) -> None:
        """Energy is measured by NVML on a GPU: refused elsewhere (an energy that was not measured is not
        invented)."""
        if self.watts is None:
            raise InputError(f"the energy objective needs NVML's power readings on a GPU; this profile ran on "
                             f"{device} and has none")

    @property
    def direction(self) -> str:
        return direction(self.name)

    def to_dict(self) -> dict[str, Any]:
        return {"objective": self.name, "slo": self.slo.to_dict(), "gpu_price_usd_per_hour": self.gpu_price,
                "memory_budget_bytes": self.memory_budget_bytes, "watts": self.watts}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Objective:
        d = d or {}
        return cls(d.get("objective", "throughput"), Slo.from_dict(d.get("slo")), d.get("gpu_price_usd_per_hour"),
                   d.get("memory_budget_bytes"), d.get("watts"))

    def describe(self) -> str:
        parts = [self.name]
        if self.slo.active:
            parts.append(f"SLO {self.slo.describe()}")
        if self.gpu_price is not None:
            parts.append(f"${self.gpu_price:g}/h")
        if self.memory_budget_bytes is not None:
            parts.append(f"memory budget {self.memory_budget_bytes / 2**30:g} GiB")
        return ", ".join(parts)


def predicted_value(name: str, tokens_per_s: float, attainment: float = 1.0, memory_bytes: float | None = None,
                    gpu_price: float | None = None, watts: float | None = None, bias: float | None = None) -> float:
    """The model's value of objective ``name`` for one configuration (predicted)."""
    if name == "throughput":
        return tokens_per_s
    if name == "goodput":
        return tokens_per_s * attainment
    if name == "cost":
        return usd_per_million_tokens(gpu_price or 0.0, tokens_per_s)
    if name == "energy":
        return (watts or math.nan) / tokens_per_s if tokens_per_s > 0 else math.inf
    if name == "memory":
        return float(memory_bytes if memory_bytes is not None else math.nan)
    if name == "bias":
        return float(bias or 0.0)
    raise InputError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVES)}")


def better(name: str, a: float | None, b: float | None) -> bool:
    """Whether value ``a`` beats ``b`` for objective ``name`` (a missing value never wins)."""
    if a is None or not math.isfinite(a):
        return False
    if b is None or not math.isfinite(b):
        return True
    return a > b if name in MAXIMISE else a < b


def format_value(name: str, v: float | None) -> str:
    """An objective's value with its unit (``–`` when missing)."""
    if v is None or not math.isfinite(v):
        return "–"
    return {"cost": f"${v:.4f} per million tokens", "energy": f"{v:.3f} J/token",
            "memory": f"{v / 2**20:.1f} MiB", "bias": f"bias {v:.4f}"}.get(name, f"{v:.1f} tokens/s")


def describe_side(name: str, side: dict[str, Any]) -> str:
    """One measured side of ``tune``'s objective report (``winner`` or ``plain``) in words: the value,
    its 95% CI, where it was measured and whether the SLO was met (what the CLI and the exports' README
    print)."""
    value, ci = side.get("value"), side.get("ci")
    if value is None:
        text = "not measured"
    else:
        text = format_value(name, value) + (f" (95% CI {format_value(name, ci[0])} – {format_value(name, ci[1])})"
                                            if ci and None not in ci else "")
        text += f", measured on {side.get('measured', '–')}"
    slo = side.get("slo")
    if slo:
        ms = lambda s: "–" if s is None or s != s else f"{s * 1e3:.1f} ms"  # noqa: E731 - None/NaN: no request had one
        text += (f"; SLO {slo.get('describe', '')} {'met' if slo['met'] else 'NOT met'}: measured p{slo['percentile']:g} "
                 f"TPOT {ms(slo.get('tpot_s'))}, TTFT {ms(slo.get('ttft_s'))}")
    return text
