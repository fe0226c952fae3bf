"""A cycle's draft forwards warm up one after another: the profile keeps each position's in-loop time and
the model charges a cycle of F forwards for the positions it ran, not F times the mean later forward."""
from __future__ import annotations

import pytest

from specdec_tune.core.errors import InputError

from specdec_tune.profiler.overhead import ForwardRecord, SequenceTimeline, in_loop_medians
from specdec_tune.tuner.model import ModelProfile, ReplayStats
from specdec_tune.tuner.model._calibration import MIN_IN_LOOP_SAMPLES, calibrate_b1, draft_warmup
from specdec_tune.tuner.model._throughput import draft_seconds, expected_draft_seconds

MS = 1e-3
POSITIONS = (0.80, 0.60, 0.50, 0.40, 0.25, 0.25)  # ms of the j-th draft forward of a cycle, as measured


def _timeline(cycles: int, drafts: int) -> SequenceTimeline:
    """Prefills, then ``cycles`` cycles of one verify followed by ``drafts`` draft forwards."""
    t, forwards = 0.0, []

    def add(role: str, tokens: int, seconds: float) -> None:
        nonlocal t
        forwards.append(ForwardRecord(role, tokens, 10, t, t + seconds))
        t += seconds + 0.01 * MS

    add("target", 10, 5 * MS)
    add("draft", 10, 1 * MS)
    for _ in range(cycles):
        add("target", drafts + 1, 6 * MS)
        for j in range(drafts):
            add("draft", 1, POSITIONS[j] * MS)
    return SequenceTimeline(0.0, t, forwards)


def test_the_profile_keeps_each_position_of_a_cycle():
    got = in_loop_medians([_timeline(10, 6), _timeline(10, 3)])
    means, counts = got["draft_position_mean_s"], got["draft_position_n"]
    assert counts == {1: 20, 2: 20, 3: 20, 4: 10, 5: 10, 6: 10}
    assert [round(means[j] / MS, 6) for j in sorted(means)] == list(POSITIONS)
    assert got["draft_first_mean_s"] == pytest.approx(means[1])  # position 1 is the first forward
    # the later forwards' mean is what T_s was before positions were kept: it undercounts a short cycle
    assert got["draft_rest_mean_s"] < means[2]


def test_calibration_turns_positions_into_excess_over_t_s():
    in_loop = in_loop_medians([_timeline(10, 6), _timeline(10, 3)])
    rest = in_loop["draft_rest_mean_s"]
    warm = draft_warmup(in_loop, rest)
    assert warm == pytest.approx([POSITIONS[j] * MS - rest for j in range(1, 6)])
    assert warm[0] > 0 > warm[-1]  # the second forward is slower than the mean later one, the last faster
    # positions seen fewer than MIN_IN_LOOP_SAMPLES times end the curve
    thin = {**in_loop, "draft_position_n": {**in_loop["draft_position_n"], 4: MIN_IN_LOOP_SAMPLES - 1}}
    assert len(draft_warmup(thin, rest)) == 2  # j = 2, 3
    # stored JSON has string keys; a profile from before positions were kept has none
    as_json = {**in_loop, "draft_position_mean_s": {str(k): v for k, v in in_loop["draft_position_mean_s"].items()},
               "draft_position_n": {str(k): v for k, v in in_loop["draft_position_n"].items()}}
    assert draft_warmup(as_json, rest) == warm
    assert draft_warmup({}, rest) == ()
    cal = calibrate_b1({1: 5 * MS, 7: 6 * MS}, 0.3 * MS, (), (), in_loop, [])
    assert cal.draft_warmup_s == warm


def _profile(warm: tuple[float, ...]) -> ModelProfile:
    return ModelProfile(draft_step_s={1: 0.3 * MS, 4: 0.5 * MS}, verify_s={1: {1: 5 * MS}, 4: {1: 8 * MS}},
                        draft_warmup_s=warm)


def test_a_cycle_pays_the_positions_it_ran():
    e2, e3 = 0.3 * MS, 0.1 * MS
    p = _profile((e2, e3))
    assert draft_seconds(p, 1, 0) == 0.0
    assert draft_seconds(p, 1, 1) == pytest.approx(0.3 * MS)
    assert draft_seconds(p, 1, 3) == pytest.approx(3 * 0.3 * MS + e2 + e3)
    assert draft_seconds(p, 1, 5) == pytest.approx(5 * 0.3 * MS + e2 + e3 + 2 * e3)  # the last excess holds on
    assert draft_seconds(p, 1, 2.5) == pytest.approx((draft_seconds(p, 1, 2) + draft_seconds(p, 1, 3)) / 2)
    assert draft_seconds(p, 4, 3) == pytest.approx(3 * 0.5 * MS)  # measured in the B = 1 loop only
    assert draft_seconds(_profile(()), 1, 3) == pytest.approx(3 * 0.3 * MS)
    stats = ReplayStats(2.0, 2.0, 2.0, {2: 1.0}, 0.0, (1.0, 1.0), (0.5, 0.5), draft_forwards_dist={1: 0.5, 3: 0.5})
    # E over F, not at E[F]: Σ excess is not linear in F
    assert expected_draft_seconds(p, stats, 1) == pytest.approx((draft_seconds(p, 1, 1) + draft_seconds(p, 1, 3)) / 2)
    assert expected_draft_seconds(p, stats, 1) != pytest.approx(draft_seconds(p, 1, 2))
    with pytest.raises(InputError, match="draft_warmup_s"):
        _profile((float("nan"),))
