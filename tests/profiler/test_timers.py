"""CPU timers: warm-up kept apart, quantiles, setup outside the timed interval."""
from __future__ import annotations

import time

import pytest

from specdec_tune.profiler.timers import TimingSamples, time_callable


def test_quantiles_and_median():
    s = TimingSamples(samples=tuple(float(i) for i in range(11)))
    assert s.median == 5.0 and s.p10 == pytest.approx(1.0) and s.p90 == pytest.approx(9.0)


def test_time_callable_excludes_setup_and_counts_repeats():
    calls = []
    samples = time_callable(lambda: time.sleep(0.002), warmup=2, repeats=4, setup=lambda: (calls.append(1), time.sleep(0.02)))
    assert len(samples.samples) == 4 and len(samples.warmup) == 2 and len(calls) == 6
    assert 0.0015 < samples.median < 0.015  # the 20 ms setup is not inside the interval


def test_repeats_must_be_positive():
    with pytest.raises(ValueError):
        time_callable(lambda: None, repeats=0)
