"""Machine-speed rescaling follows what the run decodes and ignores noise (issue 37, F6/R9): the eager probe does
not rescale a CUDA-graphed run (on the H200 it moved predictions by 0.82-0.98), a probe ratio within the probe's
own spread is noise, and a plain measurement that failed a guard is never the gauge. Pure Python."""
from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from specdec_tune.db import DraftRecord, HardwareRecord, ModelRecord, RunRecord, RunSettings, TimingRow
from specdec_tune.tuner.model import PromptInfo, build_run_profile, machine_speed
from specdec_tune.tuner.search._validate import SPEED_FROM_PLAIN, SPEED_FROM_PROBE, _speeds

MS = 1e-3


def _profile(probes: list[float], **settings):
    run = RunRecord(1, "completed", dt.datetime(2025, 1, 1), None, ModelRecord(1, "t"), HardwareRecord(1, "cpu", "x"),
                    None, (DraftRecord("d", 2),), RunSettings(prompt_tokens=(50,), typical_context=80, **settings))
    rows = [TimingRow("verify", 1, 1, 80, 2 * MS), TimingRow("verify", 2, 1, 80, 2.2 * MS)]
    rows += [TimingRow("machine_probe", 4, 1, 0, p) for p in probes]
    return build_run_profile(run, None, rows, [], prompts=[PromptInfo(50, 16)])


def test_a_probe_ratio_within_the_probes_noise_rescales_nothing():
    steady = _profile([20 * MS, 20.4 * MS, 19.6 * MS, 20.2 * MS, 19.8 * MS])  # 1.6 % spread
    assert steady.machine_probe_cv == pytest.approx(0.0158, abs=0.001)
    assert machine_speed(steady, 20.5 * MS) == 1.0  # 2.5 % slower: within 2 spreads
    assert machine_speed(steady, 25.0 * MS) == pytest.approx(0.8)  # 20 % slower: the machine changed
    assert machine_speed(steady, None) == 1.0


def test_the_eager_probe_does_not_rescale_a_graphed_gpu_run():
    probes = [20 * MS, 20.1 * MS, 19.9 * MS]
    graphed = _profile(probes, device="cuda", cuda_graphs_used="on")
    assert machine_speed(graphed, 25.0 * MS) == 1.0
    eager = _profile(probes, device="cuda", cuda_graphs_used="off")
    assert machine_speed(eager, 25.0 * MS) == pytest.approx(0.8)


def test_a_plain_measurement_that_failed_a_guard_is_not_the_gauge():
    rp = _profile([20 * MS, 20.1 * MS, 19.9 * MS])
    raw = SimpleNamespace(tokens_per_s=100.0)

    def measured(clean: bool | None) -> SimpleNamespace:
        m = SimpleNamespace(tokens_per_s=70.0, machine_probe_s=25.0 * MS)
        if clean is not None:
            m.clean = clean
        return m

    for clean, source in [(None, SPEED_FROM_PLAIN), (True, SPEED_FROM_PLAIN), (False, SPEED_FROM_PROBE)]:
        speeds = _speeds([True, False], [measured(clean), measured(clean)], [rp, rp], [raw, raw])
        assert speeds[1][1] == source, clean
        assert speeds[1][0] == pytest.approx(0.7 if source == SPEED_FROM_PLAIN else 20 / 25)
