"""What the decode loop costs beyond its θ = 0 steady terms (issue 37): the θ > 0 check per draft forward, the
hooks' tax, plain decoding's M - 1 forwards, a decode's first cycle, prefills paired by length. Pure Python."""
from __future__ import annotations

import datetime as dt

import pytest

from specdec_tune.db import DraftRecord, HardwareRecord, ModelRecord, RunRecord, RunSettings, TimingRow
from specdec_tune.profiler.overhead import ForwardRecord, SequenceTimeline, in_loop_medians
from specdec_tune.tuner.model import ModelProfile, ReplayStats, SpecConfig, build_run_profile, predict, predict_baseline
from specdec_tune.tuner.model import PromptInfo, Trace
from specdec_tune.tuner.model._calibration import calibrate_b1
from specdec_tune.tuner.model._greedy_sim import SimulatedCycle
from specdec_tune.tuner.model._predict import cycle_s
from specdec_tune.tuner.model._throughput import draft_seconds, expected_draft_seconds

MS = 1e-3
CHECK = 0.07 * MS


TRACES = tuple(Trace(c, a) for c, a in [((0.9, 0.2, 0.8, 0.6), 1), ((0.95, 0.9, 0.5, 0.1), 4),
                                         ((0.3, 0.9, 0.9, 0.9), 0)])


def _model(check: float = CHECK) -> ModelProfile:
    return ModelProfile(draft_step_s={1: 0.3 * MS}, verify_s={1: {1: 1.0 * MS, 2: 1.1 * MS, 5: 1.4 * MS}},
                        cycle_overhead_s=0.2 * MS, threshold_forward_s=check, traces=TRACES)


def test_the_theta_term_is_paid_only_when_theta_checks_the_draft():
    m = _model()
    assert draft_seconds(m, 1, 3) == pytest.approx(3 * 0.3 * MS)
    assert draft_seconds(m, 1, 3, checked=True) == pytest.approx(3 * (0.3 * MS + CHECK))
    stats = ReplayStats(2.0, 2.0, 2.0, {2: 1.0}, 0.0, (1.0, 1.0), (0.5, 0.5), draft_forwards_dist={1: 0.5, 3: 0.5})
    assert expected_draft_seconds(m, stats, 1, checked=True) - expected_draft_seconds(m, stats, 1) == \
        pytest.approx(2 * CHECK)
    # the analytic prediction: θ = 0 does not pay it, θ > 0 does
    zero, none = predict(m, SpecConfig(4)), predict(_model(0.0), SpecConfig(4))
    assert zero.cycle_time_s == pytest.approx(none.cycle_time_s)
    checked, unchecked = predict(m, SpecConfig(4, 0.3)), predict(_model(0.0), SpecConfig(4, 0.3))
    assert checked.cycle_time_s - unchecked.cycle_time_s == pytest.approx(checked.expected_draft_forwards * CHECK)


def test_a_simulated_cycle_pays_the_check_per_draft_forward():
    class Rp:  # what cycle_s reads of a RunProfile
        model, cycle_overhead_s, typical_context = _model(), 0.2 * MS, 0

        def context_cost(self, k, context):
            return 0.0

    c = SimulatedCycle(proposed=2, accepted=1, forwards=3)  # θ cut the draft: one forward more than proposed
    assert cycle_s(Rp(), c, 1, checked=True) - cycle_s(Rp(), c, 1) == pytest.approx(3 * CHECK)


def test_the_theta_term_is_fitted_to_what_the_theta_pass_paid_beyond_theta_0():
    from specdec_tune.tuner.model._loop_costs import threshold_forward_s

    m, o_c, tax = _model(0.0), 0.2 * MS, 0.01 * MS
    cycles = []
    for f, length in [(1, 0), (2, 1), (3, 2), (4, 4), (5, 4)]:
        zero = draft_seconds(m, 1, f) + m.verify_s[1][min(length + 1, 5)] if length + 1 in m.verify_s[1] else None
        if zero is None:
            continue
        cycles.append([f, length, zero + o_c + f * CHECK + tax * (f + 1), 300])
    got = threshold_forward_s(cycles, m, o_c, lambda k, ctx: 0.0, tax)
    assert got == pytest.approx(CHECK)
    assert threshold_forward_s([], m, o_c, lambda k, ctx: 0.0) == 0.0
    cheaper = [[f, length, wall - 2 * f * CHECK, ctx] for f, length, wall, ctx in cycles]
    assert threshold_forward_s(cheaper, m, o_c, lambda k, ctx: 0.0, tax) == 0.0  # never below 0


def test_the_hooks_tax_is_taken_off_only_where_it_stands_clear_of_the_noise():
    from specdec_tune.tuner.model._loop_costs import hook_tax

    assert hook_tax([8e-6, 9e-6, 8.5e-6, 9.5e-6]) == pytest.approx(8.75e-6)
    assert hook_tax([20e-6, -18e-6, 5e-6, -9e-6]) == 0.0  # a shared CPU's spread: nothing is subtracted
    assert hook_tax([8e-6]) == 0.0  # one pair says nothing about the noise
    assert hook_tax([-8e-6, -9e-6, -8.5e-6]) == 0.0  # hooks never make a decode faster


def _run(prompts: tuple[int, ...]) -> RunRecord:
    settings = RunSettings(n_max=4, overhead_ns=(1,), max_new_tokens=16, prompt_tokens=prompts, typical_context=100)
    return RunRecord(1, "completed", dt.datetime(2025, 1, 1), None, ModelRecord(1, "t"), HardwareRecord(1, "cpu", "x"),
                     None, (DraftRecord("d", 2),), settings)


def test_plain_decoding_runs_m_minus_one_forwards_after_its_prefill():
    """The prefill gives the first token's logits: M tokens take M - 1 forwards and M picks (the old model
    charged M forwards, one T_ar too many per request); the call's set-up is its own term."""
    t_ar, per_token, prefill, setup, m = 2.0 * MS, 0.1 * MS, 5.0 * MS, 0.4 * MS, 16
    rows = [TimingRow("verify", 1, 1, 100, t_ar), TimingRow("prefill", 99, 1, 0, prefill)]
    rows += [TimingRow("autoregressive", 1, 1, 100, t_ar) for _ in range(m - 1)]
    rows += [TimingRow("overhead", 1, 1, 100, per_token), TimingRow("first_cycle", 1, 1, 100, prefill + setup)]
    rp = build_run_profile(_run((100,)), None, rows, [], prompts=[PromptInfo(100, m)])
    assert predict_baseline(rp).seconds == pytest.approx(prefill + setup + m * per_token + (m - 1) * t_ar)


def test_each_in_loop_prefill_is_compared_with_its_own_prompts_micro_benchmark():
    """The first prompts run several passes, so in-loop prefills in order do not line up with the prompts."""
    micro = {50: 1.0 * MS, 300: 6.0 * MS}
    order = [50, 50, 50, 300]  # prompt 0's three passes, then prompt 1's one
    in_loop = {"target_prefill_s": [micro[n] for n in order], "target_prefill_tokens": order}
    cal = calibrate_b1({1: 1.0 * MS}, None, (micro[50], micro[300]), (), in_loop, [], prompt_tokens=[51, 301])
    assert cal.prefill_target_s == pytest.approx((micro[50], micro[300]))  # in-loop = isolated: ratio 1


def test_a_decodes_first_cycle_is_not_a_steady_one():
    """Its verify and draft forwards overlap the prefills' work: left out of the in-loop means."""
    def timeline(first_verify: float) -> SequenceTimeline:
        t, forwards = 0.0, []
        for role, tokens, seconds in [("target", 99, 5 * MS), ("draft", 100, 1 * MS), ("draft", 1, 0.3 * MS),
                                      ("target", 3, first_verify)] + [("draft", 1, 0.3 * MS), ("draft", 1, 0.3 * MS),
                                                                      ("target", 3, 1.0 * MS)] * 4:
            forwards.append(ForwardRecord(role, tokens, 100, t, t + seconds))
            t += seconds
        return SequenceTimeline(0.0, t, forwards)

    got = in_loop_medians([timeline(0.1 * MS)] * 3)
    assert got["verify_n"] == {3: 12} and got["verify_robust_s"][3] == pytest.approx(1.0 * MS)
    assert got["draft_position_n"] == {1: 12, 2: 12}


def test_terms_fitted_to_a_few_noisy_decodes_are_taken_only_where_they_stand_clear_of_the_noise():
    """On a loaded CPU the θ pass's few cycles and first cycles scatter by more than the effect."""
    from specdec_tune.tuner.model._loop_costs import first_cycle_terms, threshold_forward_s

    m, o_c = _model(0.0), 0.2 * MS
    zero = draft_seconds(m, 1, 2) + m.verify_s[1][2] + o_c
    noisy = [[2, 1, zero + 2 * CHECK + noise, 300] for noise in (3 * MS, -2.5 * MS, 0.5 * MS, -1.2 * MS)]
    assert threshold_forward_s(noisy, m, o_c, lambda k, ctx: 0.0) == 0.0
    steady = [1.0 * MS, 1.1 * MS, 0.9 * MS, 1.05 * MS, 0.95 * MS]
    assert first_cycle_terms(steady, [3.0 * MS, 3.1 * MS, 2.9 * MS]) == pytest.approx((1.0 * MS, 3.0 * MS))
    assert first_cycle_terms(steady, [1.2 * MS, -0.9 * MS, 3.0 * MS]) == (pytest.approx(1.0 * MS), None)
    assert first_cycle_terms([], [3.0 * MS, 3.1 * MS]) == (None, None)
