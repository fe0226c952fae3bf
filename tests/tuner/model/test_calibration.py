"""A calibration that one bad sample cannot poison (issue 37, F2; DIAGNOSIS §2.1): the in-loop anchors of
T_v(k) come only from the verify widths the profile's passes designed (or from many samples), their means
leave one-off costs out, and an in-loop ÷ isolated ratio outside 0.5-2× is clamped with a warning.

The shapes are the H200 run's: the passes verified k = 2, 5, 9 and 17 hundreds of times, and k = 3 and 4
eight times each at the ends of sequences, where one 25 ms graph capture (k = 3) and two (k = 4) landed.
Pure Python, no model."""
from __future__ import annotations

import datetime as dt

import pytest

from specdec_tune.core.stats import robust_mean
from specdec_tune.db import DraftRecord, HardwareRecord, ModelRecord, RunRecord, RunSettings, TimingRow
from specdec_tune.profiler.overhead import ForwardRecord, SequenceTimeline, in_loop_medians
from specdec_tune.tuner.model import PromptInfo, SpecConfig, build_run_profile, predict_config
from specdec_tune.tuner.model._calibration import RATIO_BOUNDS, calibrate_b1

MS = 1e-3
COUNTS = {2: 300, 3: 8, 4: 8, 5: 160, 9: 110, 17: 150}  # in-loop verifies per width, as in the H200 profile
CAPTURE = 25 * MS
TYPICAL = 332


def isolated(k: int) -> float:
    return (0.95 + 0.01 * k) * MS


def in_loop_time(k: int) -> float:
    return 1.05 * isolated(k)  # the loop pays 5 % more than the micro-benchmark, at every width


def _timelines(poison: dict[int, int]) -> list[SequenceTimeline]:
    """One timeline per width: prefills, then cycles of k - 1 draft forwards and a verify of k tokens; the
    first ``poison[k]`` verifies of width k hold a capture."""
    out = []
    for k, count in COUNTS.items():
        t, forwards = 0.0, []

        def add(role: str, tokens: int, seconds: float) -> None:
            nonlocal t
            forwards.append(ForwardRecord(role, tokens, TYPICAL, t, t + seconds))
            t += seconds + 0.01 * MS

        add("target", 300, 5 * MS)
        add("draft", 300, 1 * MS)
        for i in range(count):
            for _ in range(k - 1):
                add("draft", 1, 0.1 * MS)
            add("target", k, CAPTURE if i < poison.get(k, 0) else in_loop_time(k))
        out.append(SequenceTimeline(0.0, t, forwards))
    return out


def _profile(in_loop: dict):
    settings = RunSettings(n_max=16, overhead_ns=(1, 4, 8), max_new_tokens=64, prompt_tokens=(300,) * 4,
                           typical_context=TYPICAL, synthetic_acceptance=(0.8,), k_max=17)
    run = RunRecord(1, "completed", dt.datetime(2025, 1, 1), None, ModelRecord(1, "t"), HardwareRecord(1, "cuda", "x"),
                    None, (DraftRecord("d", 2),), settings)
    rows = [TimingRow("verify", k, 1, TYPICAL, isolated(k)) for k in range(1, 18) for _ in range(3)]
    rows += [TimingRow("draft_step", 1, 1, TYPICAL, 0.1 * MS, draft="d")]
    return build_run_profile(run, "d", rows, [], prompts=[PromptInfo(300, 64)] * 4, in_loop=in_loop)


def test_robust_mean_leaves_one_offs_out_and_keeps_a_real_spread():
    assert robust_mean([1.0] * 7 + [25.0]) == pytest.approx(1.0)
    assert robust_mean([1.0] * 297 + [25.0] * 3) == pytest.approx(1.0)  # rare: at most 2 % of the samples, or one
    # a frequent slow tail is a cost the loop pays (a loaded CPU's preemptions): kept, with the 1 % trim
    assert robust_mean([1.0] * 6 + [25.0] * 2) == pytest.approx(7.0)
    assert robust_mean([1.0] * 90 + [5.0] * 10) == pytest.approx((90 + 45) / 99)
    # equal samples with a real second mode 20 % higher: nothing is dropped (the spread floor)
    assert robust_mean([1.0] * 7 + [1.2] * 3) == pytest.approx(1.06)
    noisy = [1.0, 1.1, 0.9, 1.3, 1.05, 0.95, 1.2, 1.15]
    assert robust_mean(noisy) == pytest.approx(sum(noisy) / len(noisy))
    with pytest.raises(ValueError):
        robust_mean([])


def test_captures_at_rare_widths_do_not_poison_the_calibration():
    clean = _profile(in_loop_medians(_timelines({})))
    poisoned = _profile(in_loop_medians(_timelines({3: 1, 4: 2})))
    tv = poisoned.model.verify_s[1]
    line = {k: tv[2] + (tv[5] - tv[2]) * (k - 2) / 3 for k in (3, 4)}
    for k in (3, 4):
        assert tv[k] == pytest.approx(line[k], rel=0.05), (k, tv[k] / MS)
        assert tv[k] == pytest.approx(in_loop_time(k), rel=0.05)
    # predicted N = 2 and N = 3 stay on the clean curve (the H200's 0.21× and 0.14× came from these anchors)
    for n in (2, 3, 5):
        p, q = predict_config(poisoned, SpecConfig(n)), predict_config(clean, SpecConfig(n))
        assert p.speedup == pytest.approx(q.speedup, rel=0.05), (n, p.speedup, q.speedup)
    assert not poisoned.calibration_warnings


def test_a_rare_width_seen_often_enough_anchors_and_its_mean_is_robust():
    """A width outside the design anchors when it was seen >= 30 times, and a capture among them is left out."""
    counts = {3: 40, 5: 160}
    in_loop = {"verify_n": counts, "verify_robust_s": {3: 1.5 * isolated(3), 5: in_loop_time(5)}}
    cal = calibrate_b1({k: isolated(k) for k in range(1, 8)}, None, (), (), in_loop, [], designed={5})
    assert cal.verify_s[3] == pytest.approx(1.5 * isolated(3))
    thin = {**in_loop, "verify_n": {3: 29, 5: 160}}
    cal = calibrate_b1({k: isolated(k) for k in range(1, 8)}, None, (), (), thin, [], designed={5})
    assert cal.verify_s[3] == pytest.approx(isolated(3) * in_loop_time(5) / isolated(5))


def test_an_in_loop_time_far_from_the_isolated_one_is_clamped_and_warned():
    """The H100 run's draft ran eagerly in the loop at 30× its isolated time and nothing flagged it."""
    lo, hi = RATIO_BOUNDS
    in_loop = {"verify_n": {2: 300, 5: 160}, "verify_robust_s": {2: 3.0 * isolated(2), 5: in_loop_time(5)}}
    cal = calibrate_b1({k: isolated(k) for k in range(1, 8)}, None, (), (), in_loop, [], designed={2, 5})
    assert cal.verify_s[2] == pytest.approx(hi * isolated(2))
    assert len(cal.warnings) == 1 and "T_v(2)" in cal.warnings[0] and "3.00×" in cal.warnings[0]
    low = {**in_loop, "verify_robust_s": {2: 0.2 * isolated(2), 5: in_loop_time(5)}}
    assert calibrate_b1({k: isolated(k) for k in range(1, 8)}, None, (), (), low, [],
                        designed={2, 5}).verify_s[2] == pytest.approx(lo * isolated(2))
