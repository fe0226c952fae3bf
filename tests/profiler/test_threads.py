"""The thread count a CPU measurement runs with: the rule, its calibration cache, and what is stored."""
from __future__ import annotations

import json

import pytest
import torch

from specdec_tune.core.cache import cache_dir
from specdec_tune.engine import load_model
from specdec_tune.core.errors import InputError
from specdec_tune.profiler import threads as th
from specdec_tune.core.stats import RateSamples, speedup_estimate


@pytest.fixture(scope="module")
def pair(tiny_model_dirs):
    return load_model(tiny_model_dirs["target"], "cpu"), load_model(tiny_model_dirs["draft"], "cpu")


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(th, "usable_cpus", lambda: 2)


def test_parse_threads():
    from specdec_tune.cli._checks import parse_threads

    assert parse_threads("auto") is None and parse_threads(None) is None and parse_threads("3") == 3
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(InputError, match="--threads must be 'auto'"):
            parse_threads(bad)


def test_idle_cpus_is_a_share_of_this_process_cpus():
    idle = th.idle_cpus(0.05)
    assert idle is None or 0.0 <= idle <= th.usable_cpus() + 1e-9


def test_auto_never_uses_more_threads_than_idle_cpus(pair, two_cpus, monkeypatch):
    """Calibrated 2, one CPU busy with another process: 1 thread, and the report says why."""
    monkeypatch.setattr(th, "_calibrated", lambda t, d: 2)
    monkeypatch.setattr(th, "idle_cpus", lambda window_s=th.WINDOW_S: 1.05)
    choice = th.choose_threads(None, *pair)
    assert (choice.threads, choice.calibrated, choice.source) == (1, 2, "calibrated, lowered to the idle CPUs")
    assert "threads: 1" in choice.text() and "1.1 of 2 CPUs idle" in choice.text()
    monkeypatch.setattr(th, "idle_cpus", lambda window_s=th.WINDOW_S: 1.95)  # a quiet machine keeps both
    assert th.choose_threads(None, *pair).threads == 2
    monkeypatch.setattr(th, "idle_cpus", lambda window_s=th.WINDOW_S: 1.6)  # a CPU 40 % busy is not free
    assert th.choose_threads(None, *pair).threads == 1


def test_a_measurement_starts_from_the_profiles_count(pair, two_cpus, monkeypatch):
    monkeypatch.setattr(th, "_calibrated", lambda t, d: pytest.fail("a measurement must not recalibrate"))
    monkeypatch.setattr(th, "idle_cpus", lambda window_s=th.WINDOW_S: 2.0)
    choice = th.choose_threads(None, *pair, profiled=2)
    assert (choice.threads, choice.source) == (2, "the profile's")
    monkeypatch.setattr(th, "idle_cpus", lambda window_s=th.WINDOW_S: 0.9)
    assert th.choose_threads(None, *pair, profiled=2).threads == 1


def test_an_explicit_count_is_kept_and_warned_about_on_a_busy_machine(pair, two_cpus, monkeypatch):
    monkeypatch.setattr(th, "idle_cpus", lambda window_s=th.WINDOW_S: 1.0)
    choice = th.choose_threads(2, *pair)
    assert choice.threads == 2 and choice.source == "--threads"
    assert "2 threads with 1.0 of 2 CPUs idle" in choice.warning and "--threads 1" in choice.warning
    monkeypatch.setattr(th, "idle_cpus", lambda window_s=th.WINDOW_S: 2.0)
    assert th.choose_threads(2, *pair).warning is None


@pytest.mark.parametrize(("times", "expected"), [({1: 1.0, 2: 0.95}, 1), ({1: 1.0, 2: 0.8}, 2),
                                                 ({1: 1.0, 2: 1.3}, 1)])
def test_calibration_takes_more_threads_only_where_they_clearly_pay(pair, two_cpus, monkeypatch, times, expected):
    calls = []
    monkeypatch.setattr(th, "calibrate", lambda t, d, counts, **kw: calls.append(list(counts)) or times)
    monkeypatch.setattr(th.platform, "node", lambda: f"host-{expected}-{sorted(times.items())}")  # a cache key per case
    assert th._calibrated(*pair) == expected
    assert th._calibrated(*pair) == expected and len(calls) == 1  # the second answer comes from the cache
    cached = json.loads((cache_dir() / th.CACHE_FILE).read_text())
    assert any(v["threads"] == expected for v in cached.values())


def test_calibration_times_a_cycle_at_each_count(pair):
    times = th.calibrate(*pair, [1, 2], repeats=2)
    assert set(times) == {1, 2} and all(t > 0 for t in times.values())
    assert torch.get_num_threads() == 1  # restored


def test_speedup_cancels_a_pass_the_whole_machine_ran_slower():
    """Pass 2 ran 3x slower for both: the ratio of per-prompt medians stays 2, as pass by pass would."""
    ids = ("a", "b")
    spec = RateSamples(ids, ((10, 10, 10), (10, 10, 10)), ((1.0, 3.0, 1.0), (1.0, 3.0, 1.0)))
    plain = RateSamples(ids, ((10, 10, 10), (10, 10, 10)), ((2.0, 6.0, 2.0), (2.0, 6.0, 2.0)))
    assert speedup_estimate(spec, plain).value == pytest.approx(2.0)
    uneven = RateSamples(ids, ((10, 10, 10), (10, 10, 10)), ((2.0, 2.0, 2.0), (2.0, 2.0, 2.0)))
    assert speedup_estimate(spec, uneven).value == pytest.approx(2.0)  # one slow pass of three: the median drops it
    with pytest.raises(ValueError):
        speedup_estimate(spec, RateSamples(("x", "y"), plain.tokens, plain.seconds))


def test_a_prediction_at_another_machine_speed_keeps_its_speedup():
    """Half the machine speed: every rate halves, every time doubles, the speedup and τ stay."""
    from specdec_tune.tuner.model import RunPrediction, at_machine_speed

    p = RunPrediction(tokens_per_s=200.0, speedup=1.6, baseline_tokens_per_s=125.0, expected_tokens_per_cycle=3.0,
                      expected_draft_length=4.0, expected_draft_forwards=4.0, cycle_time_s=0.02,
                      decode_tokens_per_s=220.0, seconds=10.0, new_tokens=2000)
    slow = at_machine_speed(p, 0.5)
    assert (slow.tokens_per_s, slow.baseline_tokens_per_s, slow.decode_tokens_per_s) == (100.0, 62.5, 110.0)
    assert (slow.seconds, slow.cycle_time_s, slow.machine_speed) == (20.0, 0.04, 0.5)
    assert (slow.speedup, slow.expected_tokens_per_cycle, slow.new_tokens) == (1.6, 3.0, 2000)
    assert slow.tokens_per_s / slow.baseline_tokens_per_s == pytest.approx(p.speedup)
