"""The throughput model handles a GPU's overlap of host and device, shown on a CPU (issue 37, F3/F4/R7).

A simulated host thread and GPU stream (``tests/support/host_gpu_sim.py``) run plain decoding and speculative decoding
at θ = 0 and θ > 0 in three regimes (the host the bottleneck, the GPU the bottleneck, both alike). The profile
is taken through the profiler's own hooks, micro-benchmark runner and row builders, the model is the real one,
and its predictions are checked against the simulated wall time of unhooked calls, what ``measure`` times."""
from __future__ import annotations

import statistics

import pytest

from specdec_tune.tuner.model import SpecConfig, predict_baseline, predict_config
from specdec_tune.tuner.model._predict import simulate_config
from tests.support.host_gpu_profile import NEW_TOKENS, simulated_profile, simulated_seconds
from tests.support.host_gpu_sim import REGIMES, SimEvent

CONFIGS = [(n, theta) for theta in (0.0, 0.4) for n in (2, 3, 6, 12)]


@pytest.fixture(scope="module", params=REGIMES, ids=[r.name for r in REGIMES])
def simulated(request):
    return simulated_profile(request.param)


def _errors(run) -> dict[tuple[int, float], float]:
    out = {(0, 0.0): predict_baseline(run.baseline).seconds / simulated_seconds(run, 0, 0.0) - 1}
    for n, theta in CONFIGS:
        out[n, theta] = predict_config(run.profile, SpecConfig(n, theta)).seconds / simulated_seconds(run, n, theta) - 1
    return out


def test_the_simulated_world_is_what_the_model_replays(simulated):
    """The simulator's cycles are the greedy simulation's (the check is on time, not on acceptance)."""
    for n, theta in CONFIGS:
        for i, world in enumerate(simulated.worlds):
            mine = [(c.proposed, c.accepted, c.forwards) for c in world.cycles(n, theta, NEW_TOKENS)]
            assert mine == [tuple(c) for c in simulate_config(simulated.profile, SpecConfig(n, theta), i)]


def test_the_model_predicts_the_simulated_loop_within_2_percent(simulated):
    errors = _errors(simulated)
    worst = max(errors.items(), key=lambda kv: abs(kv[1]))
    assert abs(worst[1]) <= 0.02, f"{simulated.regime.name}: N, θ = {worst[0]} off by {worst[1]:+.2%} ({errors})"
    assert statistics.median(abs(e) for e in errors.values()) <= 0.005, errors


def test_the_profile_measures_what_theta_and_the_hooks_cost(simulated):
    """The θ pass gives a checked draft forward a cost (the simulator's: the confidence's kernels, a wait for
    the device, the host's work after it), and the hooks' tax is measured where the host pays for the marks."""
    rp, r = simulated.profile, simulated.regime
    assert rp.model.threshold_forward_s > r.theta.host_s + r.theta_host_s
    assert rp.plain_hook_tax_s > 0 and rp.hook_tax_s > 0
    assert rp.hook_tax_s <= 3 * r.mark_s  # at most the marks of a forward and its share of the cycle's


def test_the_recorder_makes_its_events_before_the_decode():
    """Each mark records a pre-made event (R7): none is made while a decode runs."""
    from specdec_tune.profiler.overhead import ForwardRecorder
    from tests.support.host_gpu_sim import installed, models, plain_call

    m = models(REGIMES[0])
    recorder = ForwardRecorder("cuda")
    with installed(m.sim), recorder.attach(m.target):
        for _ in range(2):
            recorder.begin()
            made = SimEvent.made
            plain_call(m, 100, 32)
            assert SimEvent.made == made
            assert len(recorder.finish().forwards) == 32
