"""What a token costs an operator: dollars per million tokens from a device's price per hour.

Shared by the profiler (a measured throughput) and the tuner (a predicted one); pure.
"""
from __future__ import annotations

import math


def check_price(price_per_hour: float | None) -> float | None:
    """``--gpu-price`` checked: a finite number of dollars per hour >= 0 (None: not given)."""
    if price_per_hour is not None and not (math.isfinite(price_per_hour) and price_per_hour >= 0):
        raise ValueError(f"--gpu-price must be a non-negative number of dollars per hour, got {price_per_hour!r}")
    return price_per_hour


def usd_per_million_tokens(price_per_hour: float, tokens_per_s: float) -> float:
    """Dollars per million generated tokens for a device rented at ``price_per_hour`` producing
    ``tokens_per_s``: price / 3600 / rate × 10^6 (infinite at rate 0)."""
    check_price(price_per_hour)
    return price_per_hour / 3600.0 / tokens_per_s * 1e6 if tokens_per_s > 0 else math.inf


def usd_ci(price_per_hour: float, rate_ci: tuple[float, float] | None) -> tuple[float, float] | None:
    """The 95% CI of dollars per million tokens from the throughput's CI (the bounds swap: a higher
    rate is a lower cost)."""
    if rate_ci is None:
        return None
    return usd_per_million_tokens(price_per_hour, rate_ci[1]), usd_per_million_tokens(price_per_hour, rate_ci[0])
