"""Tests of the analytic throughput model against hand-computed values and independent simulations."""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

from specdec_tune.core.errors import InputError
from specdec_tune.core.schedules import next_num_speculative
from specdec_tune.tuner.model import (
    ModelProfile,
    SpecConfig,
    Trace,
    alphas_from_traces,
    baseline_tokens_per_s,
    best_n_per_batch_size,
    closed_form_tokens_per_cycle,
    draft_step_time,
    heuristic_stationary,
    predict,
    rank_configs,
    relative_error,
    replay,
    tokens_per_cycle_per_position,
    verify_time,
)

# A verify curve measured at every k the tests need, so no interpolation hides in the checks.
VERIFY = {k: 0.020 + 0.001 * k + 0.0002 * k * k for k in range(1, 13)}


def random_traces(rng: random.Random, count: int, n_max: int, short_fraction: float = 0.0) -> list[Trace]:
    """Traces whose confidence and acceptance are correlated, like a real draft's."""
    traces = []
    for _ in range(count):
        length = rng.randint(0, n_max - 1) if rng.random() < short_fraction else n_max
        conf = tuple(rng.betavariate(3, 1) for _ in range(length))
        accepted = 0
        while accepted < length and rng.random() < conf[accepted]:
            accepted += 1
        traces.append(Trace(conf, accepted))
    return traces


def tv_profile(alpha: float, t_s: float = 0.01, t_v: float = 0.1) -> ModelProfile:
    """Sampling-mode profile with constant acceptance and a flat verify cost (the seed's setting)."""
    return ModelProfile({1: t_s}, {1: {1: t_v, 2: t_v}}, sampling_acceptance=alpha)


# --- closed form and per-position form -------------------------------------------------------

def test_seed_hand_example() -> None:
    # Seed 000: P = 0.8, N = 4 -> E_0 + 1 = (1 - 0.8^5) / 0.2 = 1 + .8 + .64 + .512 + .4096.
    assert closed_form_tokens_per_cycle(0.8, 4) == pytest.approx(3.3616, abs=1e-12)


def test_seed_throughput_formula() -> None:
    # throughput = (E_0 + 1) / (N·T_s + T_v) with T_s = 10 ms, flat T_v = 100 ms.
    pred = predict(tv_profile(0.8), SpecConfig(4, mode="sampling"))
    assert pred.tokens_per_s == pytest.approx(3.3616 / (4 * 0.01 + 0.1), rel=1e-12)
    assert pred.speedup == pytest.approx(3.3616 / 0.14 * 0.1, rel=1e-12)
    assert pred.expected_draft_length == 4 and pred.expected_draft_forwards == 4
    assert pred.acceptance_per_position == pytest.approx((0.8,) * 4)
    assert pred.source == "tv" and pred.label == "predicted"


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.5, 0.8, 0.95, 0.999])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 12])
def test_per_position_equals_closed_form_for_constant_alpha(alpha: float, n: int) -> None:
    closed = closed_form_tokens_per_cycle(alpha, n)
    assert tokens_per_cycle_per_position([alpha] * n) == pytest.approx(closed, rel=1e-12)


def test_alpha_one_edge() -> None:
    assert closed_form_tokens_per_cycle(1.0, 5) == 6.0
    assert tokens_per_cycle_per_position([1.0] * 5) == 6.0
    assert closed_form_tokens_per_cycle(1.0 - 1e-9, 5) == pytest.approx(6.0, rel=1e-6)


def test_per_position_hand_value() -> None:
    # 1 + .9 + .9·.5 + .9·.5·.2 = 2.44
    assert tokens_per_cycle_per_position([0.9, 0.5, 0.2]) == pytest.approx(2.44, abs=1e-12)


def test_monotone_in_alpha_and_draft_cost() -> None:
    alphas = [0.1, 0.3, 0.5, 0.7, 0.9, 1.0]
    for n in (1, 3, 6):
        tps = [predict(tv_profile(a), SpecConfig(n, mode="sampling")).tokens_per_s for a in alphas]
        assert all(x < y for x, y in zip(tps, tps[1:])), tps
        costs = [0.0, 0.001, 0.01, 0.05]
        tps = [predict(tv_profile(0.7, t_s=c), SpecConfig(n, mode="sampling")).tokens_per_s for c in costs]
        assert all(x > y for x, y in zip(tps, tps[1:])), tps


# --- traces ------------------------------------------------------------------------------------

def test_alphas_from_traces_reproduce_replay_at_zero_threshold() -> None:
    rng = random.Random(1)
    traces = random_traces(rng, 400, 8)
    alphas = alphas_from_traces(traces, 8)
    for n in range(0, 9):
        assert tokens_per_cycle_per_position(alphas[:n]) == pytest.approx(replay(traces, n, 0.0).mean_tau, rel=1e-12)


def test_alphas_from_traces_hand_counts() -> None:
    traces = [Trace((0.9, 0.9), 2), Trace((0.9, 0.9), 1), Trace((0.9, 0.9), 0), Trace((0.9, 0.9), 2)]
    # position 1: 3 of 4 accepted; position 2: reached by 3, accepted by 2.
    assert alphas_from_traces(traces, 2) == pytest.approx([0.75, 2 / 3])


def test_ratio_of_expectations_two_traces_by_hand() -> None:
    # Trace a: both tokens confident and accepted. Trace b: second token below θ = 0.5, first rejected.
    traces = [Trace((0.9, 0.9), 2), Trace((0.9, 0.1), 0)]
    profile = ModelProfile({1: 0.01}, {1: {1: 0.10, 2: 0.11, 3: 0.13}}, traces, cycle_overhead_s=0.002)
    pred = predict(profile, SpecConfig(2, threshold=0.5))
    # a: L = 2, 2 forwards, tau = 3, T = 0.02 + 0.13 + 0.002 = 0.152
    # b: L = 1, 2 forwards (the refused token's forward still ran), tau = 1, T = 0.02 + 0.11 + 0.002 = 0.132
    assert pred.expected_tokens_per_cycle == pytest.approx(2.0)
    assert pred.expected_draft_length == pytest.approx(1.5)
    assert pred.expected_draft_forwards == pytest.approx(2.0)
    assert pred.cycle_time_s == pytest.approx(0.142)
    assert pred.tokens_per_s == pytest.approx(4 / 0.284, rel=1e-12)
    mean_of_ratios = (3 / 0.152 + 1 / 0.132) / 2
    assert abs(pred.tokens_per_s - mean_of_ratios) / pred.tokens_per_s > 0.03  # the difference matters


def simulate_cycle(conf: tuple[float, ...], num_accepted: int, n: int, theta: float) -> tuple[int, int, int]:
    """The engine's cycle, step by step: draft one token per forward, stop on low confidence."""
    drafted = forwards = 0
    while drafted < n and drafted < len(conf):
        forwards += 1
        if conf[drafted] < theta:
            break
        drafted += 1
    accepted = 0
    while accepted < drafted and accepted < num_accepted:
        accepted += 1
    return drafted, accepted, forwards


@pytest.mark.parametrize("seed", range(6))
def test_replay_matches_direct_simulation(seed: int) -> None:
    rng = random.Random(seed)
    traces = random_traces(rng, 300, 10, short_fraction=0.1)
    n, theta, batch = rng.randint(1, 10), (0.0 if seed == 0 else rng.uniform(0.2, 0.9)), 1 + seed % 2
    t_s, overhead = 0.003, 0.0015
    # identical timings at B = 1 and 2: only the B·E[τ] factor may differ
    profile = ModelProfile({1: t_s, 2: t_s}, {1: VERIFY, 2: VERIFY}, traces, cycle_overhead_s=overhead)
    tau = length = forwards = 0
    time = 0.0
    for tr in traces:
        d, a, f = simulate_cycle(tr.confidences, tr.num_accepted, n, theta)
        tau += a + 1
        length += d
        forwards += f
        time += f * t_s + VERIFY[d + 1] + overhead
    stats = replay(traces, n, theta)
    assert stats.mean_tau == pytest.approx(tau / len(traces), rel=1e-12)
    assert stats.mean_draft_length == pytest.approx(length / len(traces), rel=1e-12)
    assert stats.mean_draft_forwards == pytest.approx(forwards / len(traces), rel=1e-12)
    pred = predict(profile, SpecConfig(n, threshold=theta, batch_size=batch))
    assert pred.tokens_per_s == pytest.approx(batch * tau / time, rel=1e-12)


def test_threshold_on_constant_confidence_never_cuts() -> None:
    # An n-gram drafter reports confidence 1.0: θ has no effect, and the drafter costs nothing.
    traces = [Trace((1.0,) * 4, k) for k in range(5)]
    profile = ModelProfile({}, {1: VERIFY}, traces)
    a, b = predict(profile, SpecConfig(4, 0.0)), predict(profile, SpecConfig(4, 0.9))
    assert a == b
    assert a.tokens_per_s == pytest.approx(3.0 / VERIFY[5])


# --- heuristic schedule ---------------------------------------------------------------------------

def test_stationary_two_states_by_hand() -> None:
    # π1·g1 = π2·(1 - g2) -> π1 = (1 - g2) / (g1 + 1 - g2) = 0.75 / 1.25.
    assert heuristic_stationary([0.5, 0.25]) == pytest.approx([0.6, 0.4])
    assert heuristic_stationary([1.0, 1.0, 1.0]) == pytest.approx([0.0, 0.0, 1.0])
    assert heuristic_stationary([0.0, 0.0, 0.0]) == pytest.approx([1.0, 0.0, 0.0])


@pytest.mark.parametrize(("n", "theta"), [(6, 0.0), (5, 0.4)])
def test_heuristic_markov_chain_matches_monte_carlo(n: int, theta: float) -> None:
    rng = random.Random(7)
    traces = random_traces(rng, 500, 8)
    t_s = 0.003
    profile = ModelProfile({1: t_s}, {1: VERIFY}, traces, cycle_overhead_s=0.001)
    pred = predict(profile, SpecConfig(n, threshold=theta, schedule="heuristic"))
    n_cur, tau, length, time, cycles = n, 0, 0, 0.0, 100_000
    for _ in range(cycles):
        tr = traces[rng.randrange(len(traces))]
        d, a, f = simulate_cycle(tr.confidences, tr.num_accepted, n_cur, theta)
        tau += a + 1
        length += d
        time += f * t_s + VERIFY[d + 1] + 0.001
        n_cur = next_num_speculative("heuristic", n_cur, n, d, a)  # the engine's rule, not a copy
    assert pred.tokens_per_s == pytest.approx(tau / time, rel=0.015)
    assert pred.expected_tokens_per_cycle == pytest.approx(tau / cycles, rel=0.015)
    assert pred.expected_draft_length == pytest.approx(length / cycles, rel=0.02)
    # and the schedule is not just the constant-N prediction in disguise
    assert pred.expected_draft_length < predict(profile, SpecConfig(n, threshold=theta)).expected_draft_length


def test_heuristic_with_tv_number_uses_alpha_power_n() -> None:
    pred = predict(tv_profile(0.6), SpecConfig(3, schedule="heuristic", mode="sampling"))
    pi = heuristic_stationary([0.6, 0.36, 0.216])
    want_tau = sum(p * closed_form_tokens_per_cycle(0.6, k) for p, k in zip(pi, (1, 2, 3)))
    want_time = sum(p * (k * 0.01 + 0.1) for p, k in zip(pi, (1, 2, 3)))
    assert pred.tokens_per_s == pytest.approx(want_tau / want_time, rel=1e-9)


# --- verify curve, batch, baseline -------------------------------------------------------------

def test_verify_extrapolation_and_batch_interpolation() -> None:
    profile = ModelProfile({1: 0.01, 4: 0.02}, {1: {1: 1.0, 2: 1.1, 3: 1.3}, 4: {1: 2.0, 2: 2.4, 3: 2.8}})
    assert verify_time(profile, 1, 3) == 1.3
    assert verify_time(profile, 1, 5) == pytest.approx(1.7)  # last slope 0.2 per position
    assert verify_time(profile, 4, 4) == pytest.approx(3.2)
    assert verify_time(profile, 2, 2) == pytest.approx(1.1 + (2.4 - 1.1) / 3)
    assert verify_time(profile, 2, 5) == pytest.approx(1.7 + (3.6 - 1.7) / 3)
    assert draft_step_time(profile, 2) == pytest.approx(0.01 + 0.01 / 3)
    with pytest.raises(InputError, match="batch size: 8"):
        verify_time(profile, 8, 1)
    with pytest.raises(InputError, match="batch size: 8"):
        draft_step_time(profile, 8)
    flat = ModelProfile({}, {1: {1: 1.0, 2: 1.2, 3: 1.1}})
    assert verify_time(flat, 1, 6) == 1.1  # a noisy falling tail is held flat, never negative


def test_speedup_definition_and_plain_decoding() -> None:
    traces = random_traces(random.Random(3), 100, 4)
    profile = ModelProfile({1: 0.002}, {1: VERIFY}, traces, ar_overhead_s=0.004, cycle_overhead_s=0.003)
    assert baseline_tokens_per_s(profile) == pytest.approx(1 / (VERIFY[1] + 0.004))
    pred = predict(profile, SpecConfig(3))
    assert pred.speedup == pytest.approx(pred.tokens_per_s * (VERIFY[1] + 0.004))
    plain = predict(profile, SpecConfig(0, threshold=0.5))
    assert plain.speedup == 1.0 and plain.expected_tokens_per_cycle == 1.0 and plain.source == "baseline"


def test_batch_size_where_verify_cost_explodes_prefers_no_speculation() -> None:
    traces = random_traces(random.Random(4), 300, 8)
    # B = 1 is memory bound (verify almost flat in k); at B = 64 verify is compute bound (∝ k).
    verify = {1: {k: 0.020 + 0.0005 * k for k in range(1, 10)}, 64: {k: 0.05 * k for k in range(1, 10)}}
    profile = ModelProfile({1: 0.002, 64: 0.004}, verify, traces)
    best = best_n_per_batch_size(profile, [1, 16, 64], range(1, 9))
    assert best[1] > 0 and best[64] == 0
    b64 = predict(profile, SpecConfig(best[1], batch_size=64))
    assert b64.speedup < 1
    # at θ = 0, L = N always: T_cycle = 2·T_s(64) + T_v(64, 3)
    want = 64 * replay(traces, 2).mean_tau / (2 * 0.004 + 0.05 * 3)
    assert predict(profile, SpecConfig(2, batch_size=64)).tokens_per_s == pytest.approx(want, rel=1e-12)


def test_sampling_traces_preferred_over_tv_number() -> None:
    rng = random.Random(5)
    greedy, sampled = random_traces(rng, 200, 4), [Trace((0.5,) * 4, 0)] * 10
    profile = ModelProfile({1: 0.002}, {1: VERIFY}, greedy, sampling_acceptance=0.9, sampling_traces=sampled)
    pred = predict(profile, SpecConfig(4, mode="sampling"))
    assert pred.source == "sampling_traces" and pred.expected_tokens_per_cycle == 1.0
    assert predict(profile, SpecConfig(4)).source == "traces"


def test_rank_configs_and_relative_error() -> None:
    traces = random_traces(random.Random(6), 200, 8)
    profile = ModelProfile({1: 0.002}, {1: VERIFY}, traces)
    configs = [SpecConfig(n, t) for n in (0, 1, 2, 4, 8) for t in (0.0, 0.3, 0.6)]
    ranked = rank_configs(profile, configs)
    assert len(ranked) == len(configs)
    speeds = [p.tokens_per_s for _, p in ranked]
    assert speeds == sorted(speeds, reverse=True)
    assert ranked[0][1].tokens_per_s == max(predict(profile, c).tokens_per_s for c in configs)
    assert relative_error(105.0, 100.0) == pytest.approx(0.05)
    assert relative_error(90.0, 100.0) == pytest.approx(0.10)


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"num_speculative_tokens": -1}, "-1"),
        ({"num_speculative_tokens": 2.5}, "2.5"),
        ({"num_speculative_tokens": True}, "True"),
        ({"num_speculative_tokens": 2, "threshold": 1.0}, "1.0"),
        ({"num_speculative_tokens": 2, "threshold": -0.1}, "-0.1"),
        ({"num_speculative_tokens": 2, "schedule": "dynamic"}, "dynamic"),
        ({"num_speculative_tokens": 2, "batch_size": 0}, "batch_size=0"),
        ({"num_speculative_tokens": 2, "mode": "beam"}, "beam"),
    ],
)
def test_spec_config_validation(kwargs: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        SpecConfig(**kwargs)


def test_other_input_errors() -> None:
    with pytest.raises(InputError, match="num_accepted=3"):
        Trace((0.5, 0.5), 3)
    with pytest.raises(InputError, match="1.5"):
        Trace((1.5,), 0)
    with pytest.raises(InputError, match=r"verify_s\[1\]\[2\]"):
        ModelProfile({}, {1: {1: 0.1, 2: -0.1}})
    with pytest.raises(InputError, match="lacks k=1"):
        ModelProfile({}, {1: {2: 0.1}})
    with pytest.raises(InputError, match="sampling_acceptance=1.2"):
        ModelProfile({}, {1: {1: 0.1}}, sampling_acceptance=1.2)
    with pytest.raises(InputError, match="no greedy traces"):
        predict(tv_profile(0.5), SpecConfig(2))
    with pytest.raises(InputError, match="threshold=0.3"):
        predict(tv_profile(0.5), SpecConfig(2, threshold=0.3, mode="sampling"))
    profile = ModelProfile({1: 0.01}, {1: {1: 0.1}}, [Trace((0.9, 0.9), 1)])
    with pytest.raises(InputError, match="N=3 exceeds"):
        predict(profile, SpecConfig(3))
    with pytest.raises(InputError, match="outside the measured range 1..1"):
        predict(profile, SpecConfig(2))  # only T_v(1) measured: no curve to extrapolate
    with pytest.raises(InputError, match="measured=0"):
        relative_error(1.0, 0.0)
    with pytest.raises(InputError, match="alpha=1.5"):
        closed_form_tokens_per_cycle(1.5, 2)


@pytest.mark.slow
def test_model_imports_without_torch() -> None:
    # The model must stay usable where torch is absent (dashboard, CI): importing it must not load torch.
    code = "import sys, specdec_tune.tuner.model; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_steep_noisy_context_line_never_makes_a_verify_cost_negative() -> None:
    """The context slope is capped where the line would cost a verify over no context less than nothing: a
    tiny model's timings under load once measured 0.2 ms at 128 and 2.5 ms at 512 against 1 ms at the typical
    323, and the uncapped least-squares line (6.0 µs/token) predicted short requests' TPOT below 0."""
    from specdec_tune.db import TimingRow
    from specdec_tune.tuner.model._timings import Timings as _Timings

    typical = 323
    rows = [TimingRow("verify", 2, 1, typical, 1.0e-3, None)]
    rows += [TimingRow("verify_context", 2, 1, c, s, None) for c, s in ((128, 0.2e-3), (512, 2.5e-3))]
    slope = _Timings(rows).context_slopes(typical)[2]
    assert 1.0e-3 + slope * (0 - typical) >= 0.0  # the verify at context 0
    assert slope == pytest.approx(1.0e-3 / typical)  # capped exactly there (the raw line is twice as steep)
    # a line that keeps its intercept positive is left as measured
    gentle = [rows[0]] + [TimingRow("verify_context", 2, 1, c, s, None) for c, s in ((128, 0.9e-3), (512, 1.1e-3))]
    assert _Timings(gentle).context_slopes(typical)[2] < 1.0e-3 / typical
