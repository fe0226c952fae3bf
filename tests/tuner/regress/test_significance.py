"""Statistics and decision rule of ``regress`` on synthetic samples (no models, fast)."""
from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from specdec_tune.tuner.regress import (
    Cell,
    Rules,
    align,
    bh_adjust,
    compare_benchmark,
    decide,
    minimum_detectable_change,
    speed_test,
    two_proportion,
)


def _samples(times: dict[str, float], jitter: float = 0.0, seed: int = 0, scale: float = 1.0) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_id": p, "new_tokens": 32, "seconds": [t * scale * (1 + rng.gauss(0, jitter)) for _ in range(3)],
             "cycles": 0} for p, t in times.items()]


PROMPT_TIMES = {f"p{i}": 0.1 + 0.05 * (i % 7) for i in range(16)}  # prompts differ by up to 3x


def test_bh_matches_hand_computation():
    p = [0.01, 0.04, 0.03, 0.005, math.nan]
    adj = bh_adjust(p)
    # sorted: 0.005, 0.01, 0.03, 0.04 (m = 4) -> 0.02, 0.02, 0.04, 0.04
    assert adj[:4] == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert math.isnan(adj[4])


def test_two_proportion_is_the_pooled_z_test():
    t = two_proportion(80, 100, 60, 100)
    z = (0.6 - 0.8) / math.sqrt(0.7 * 0.3 * (2 / 100))
    assert t.p_value == pytest.approx(2 * stats.norm.sf(abs(z)))
    assert t.ratio == pytest.approx(0.75)
    assert two_proportion(50, 50, 40, 40).p_value == 1.0  # both always accepted: no difference


def test_speed_test_recovers_a_planted_ratio_despite_prompt_spread():
    base = {p: 32 / t for p, t in PROMPT_TIMES.items()}
    cur = {p: v / 1.10 for p, v in base.items()}  # every prompt 10 % slower
    t = speed_test(base, cur)
    assert t.ratio == pytest.approx(1 / 1.10, rel=1e-6)
    assert t.p_value < 1e-4
    # Without alignment the 3x spread between prompts would hide a 10 % shift entirely.
    assert stats.mannwhitneyu(list(cur.values()), list(base.values())).pvalue > 0.05


def test_minimum_detectable_change_grows_with_noise():
    mdc = [minimum_detectable_change(se) for se in (0.0, 0.001, 0.01, 0.05, 0.2, 1.0, 5.0)]
    assert mdc[0] == 0.0 and all(a < b for a, b in zip(mdc, mdc[1:])) and mdc[-1] < 1
    assert mdc[-1] == pytest.approx(1.0, abs=1e-6)  # a hopelessly noisy benchmark detects nothing short of -100 %
    assert math.isnan(minimum_detectable_change(math.nan)) and math.isnan(minimum_detectable_change(math.inf))


@pytest.mark.parametrize("se", [0.01, 0.05, 0.2])
def test_a_drop_of_the_minimum_detectable_change_is_found_with_80_percent_power(se):
    """What the number promises, checked by simulation: runs of tokens/s samples, log-normal, whose
    true median drops by exactly minimum_detectable_change(se), compared by a two-sided test at
    α = 0.01 on the log ratio whose standard error is se, are flagged 80 % of the time."""
    import numpy as np

    n, sims = 20, 20_000
    sigma = se / math.sqrt(2 / n)  # per-sample spread of log tokens/s that makes SE(log ratio) = se
    drop = minimum_detectable_change(se)
    rng = np.random.default_rng(7)
    base = rng.lognormal(math.log(100.0), sigma, (sims, n))
    cur = rng.lognormal(math.log(100.0 * (1 - drop)), sigma, (sims, n))
    z = (np.log(cur).mean(axis=1) - np.log(base).mean(axis=1)) / se
    power = float(np.mean(np.abs(z) > stats.norm.ppf(1 - 0.01 / 2)))
    assert power == pytest.approx(0.80, abs=0.015)  # ±0.015 is 5 binomial standard errors of 20 000 runs


def _decide(base, cur, rules=Rules(), history=None):
    cells = compare_benchmark("b", base, cur, {"num_speculative_tokens": 0, "draft": "none"}, rules)
    return {c.metric: c for c in decide(cells, rules, history or {})}


def test_rule_flags_a_20_percent_slowdown_then_confirms_it():
    base = _samples(PROMPT_TIMES, jitter=0.02, seed=1)
    cur = _samples(PROMPT_TIMES, jitter=0.02, seed=2, scale=1.2)
    first = _decide(base, cur)
    assert first["tokens_per_s"].verdict == "suspicious" and first["latency"].verdict == "suspicious"
    assert first["tokens_per_s"].ci_high < 1.0
    second = _decide(base, cur, history={("b", "tokens_per_s"): 1, ("b", "latency"): 1})
    assert second["tokens_per_s"].verdict == "regression"


def test_rule_ignores_a_significant_change_below_min_drop():
    base = _samples(PROMPT_TIMES, jitter=0.001, seed=1)
    cur = _samples(PROMPT_TIMES, jitter=0.001, seed=2, scale=1.03)  # 3 %: significant, but small
    cells = _decide(base, cur)
    assert cells["tokens_per_s"].p_value < 0.001 and cells["tokens_per_s"].verdict == "ok"
    assert _decide(base, cur, Rules(min_drop=0.01))["tokens_per_s"].verdict == "suspicious"


def test_too_few_prompts_gives_no_verdict():
    few = dict(list(PROMPT_TIMES.items())[:4])
    cells = _decide(_samples(few), _samples(few, scale=2.0))
    assert cells["tokens_per_s"].verdict == "no_verdict" and "too few" in cells["tokens_per_s"].details["reason"]


def test_correctness_drift_always_fails():
    cur = [{"prompt_id": "a", "new_tokens": 2, "seconds": [0.1], "token_ids": [1, 2], "plain_token_ids": [1, 3]}]
    cells = compare_benchmark("b", None, cur, {"num_speculative_tokens": 4, "draft": "d", "temperature": 0.0}, Rules())
    assert [c.verdict for c in cells if c.metric == "correctness"] == ["fail"]
    ok = [dict(cur[0], plain_token_ids=[1, 2])]
    assert compare_benchmark("b", None, ok, {"num_speculative_tokens": 4, "draft": "d"}, Rules())[0].verdict == "ok"


def test_cell_direction():
    assert Cell("b", "tokens_per_s", "ok").higher_is_better
    assert not Cell("b", "latency", "ok").higher_is_better


def test_model_error_beyond_tolerance_is_flagged_and_persists():
    cur = [{"prompt_id": "a", "new_tokens": 2, "seconds": [0.1]}]
    cfg = {"num_speculative_tokens": 0, "draft": "none"}

    def run(predicted, history):
        cells = compare_benchmark("b", None, cur, cfg, Rules(), model_error=lambda: (predicted, 20.0))
        return {c.metric: c for c in decide(cells, Rules(), history)}["model_error"]

    assert run(21.0, {}).verdict == "ok"  # +5 % < 10 % tolerance
    assert run(25.0, {}).verdict == "suspicious" and run(25.0, {}).current_value == pytest.approx(0.25)
    assert run(25.0, {("b", "model_error"): 1}).verdict == "regression"
    cells = compare_benchmark("b", None, cur, cfg, Rules(), model_error=lambda: "no profile")
    me = [c for c in cells if c.metric == "model_error"][0]
    assert me.verdict == "no_verdict" and me.details["reason"] == "no profile"


def test_explanation_names_the_factor_that_changed():
    from specdec_tune.tuner.model import Trace
    from specdec_tune.tuner.regress import SideTerms, explain

    good = tuple(Trace((0.9,) * 4, 3) for _ in range(50))
    bad = tuple(Trace((0.9,) * 4, 1) for _ in range(50))  # positions 2-4 now rejected
    base = SideTerms(good, 0.001, 0.010, (1.0, 1.0, 1.0, 0.0), 4.0)
    assert "the draft got slower" in explain(base, SideTerms(good, 0.002, 0.010, base.alphas, 4.0), 4).text
    assert "verify step" in explain(base, SideTerms(good, 0.001, 0.013, base.alphas, 4.0), 4).text
    e = explain(base, SideTerms(bad, 0.001, 0.010, (1.0, 0.0, 0.0, 0.0), 2.0), 4, fallen_positions=[2, 3])
    assert "acceptance fell at positions 2-3" in e.text and e.shares["acceptance"] < 0
    assert e.shares["draft"] == pytest.approx(0.0, abs=1e-12) and e.model_ratio < 1


@pytest.mark.slow
def test_speed_test_keeps_its_false_positive_rate_on_aa_noise():
    """Pure noise, 8 prompts x 3 repeats: p < 0.01 in about 1 % of A/A comparisons, not more."""
    import numpy as np

    rng = np.random.default_rng(3)

    def rate(repeats: int) -> float:
        hits = 0
        for _ in range(200):
            base = {f"p{i}": list(t * np.exp(rng.normal(0, 0.05, repeats))) for i, t in enumerate(PROMPT_TIMES.values()) if i < 8}
            cur = {p: list(PROMPT_TIMES[p] * np.exp(rng.normal(0, 0.05, repeats))) for p in base}
            hits += speed_test(base, cur, resamples=200).p_value < 0.01
        return hits / 200

    assert rate(3) <= 0.03
    assert rate(1) <= 0.03  # one value per side: the per-prompt U is a sign, the test a sign test
    # Power of this test: pooling every prompt into one Mann-Whitney test (what the aligned values
    # invite) treats values tied together by their prompt as independent and cries wolf.
    pooled = 0
    for _ in range(200):
        base = {f"p{i}": [t * float(np.exp(rng.normal(0, 0.05)))] for i, t in enumerate(PROMPT_TIMES.values()) if i < 8}
        cur = {p: [PROMPT_TIMES[p] * float(np.exp(rng.normal(0, 0.05)))] for p in base}
        a, b = align(base, cur)
        pooled += stats.mannwhitneyu(b.ravel(), a.ravel()).pvalue < 0.01
    assert pooled / 200 > 0.04


def _paired(times: dict[str, float], seed: int, machine: float = 1.0, draft: float = 1.0, jitter: float = 0.02,
            plain: float = 1.0, probe: bool = False):
    """Speculative samples with their paired plain reference: ``machine`` scales both decodes and the
    machine probe (a slower machine), ``draft`` only the speculative decode (speculation itself got
    slower), ``plain`` both decodes but not the probe (the code got slower everywhere)."""
    rng = random.Random(seed)
    out = []
    for p, t in times.items():
        m = [machine * (1 + rng.gauss(0, jitter)) for _ in range(3)]  # shared by the pair: seconds apart
        s = {"prompt_id": p, "new_tokens": 32, "plain_new_tokens": 32, "cycles": 0,
             "seconds": [t * draft * plain * x * (1 + rng.gauss(0, jitter / 2)) for x in m],
             "plain_seconds": [2 * t * plain * x * (1 + rng.gauss(0, jitter / 2)) for x in m]}
        if probe:
            s["probe_seconds"] = [0.02 * x * (1 + rng.gauss(0, jitter / 2)) for x in m]
        out.append(s)
    return out


def _decide_spec(base, cur, calib=None, rules=Rules()):
    cfg = {"num_speculative_tokens": 0, "draft": "d"}
    return {c.metric: c for c in decide(compare_benchmark("b", base, cur, cfg, rules, calib=calib), rules, {})}


def test_speedup_ignores_a_slower_machine_that_tokens_per_s_sees():
    base = _paired(PROMPT_TIMES, 1)
    cells = _decide_spec(base, _paired(PROMPT_TIMES, 2, machine=1.2))
    assert cells["tokens_per_s"].verdict == "suspicious"  # the machine drifted: absolute speed fell
    assert cells["speedup"].verdict == "ok" and abs(cells["speedup"].effect - 1) < 0.03


def test_speedup_catches_speculation_getting_slower():
    cells = _decide_spec(_paired(PROMPT_TIMES, 1), _paired(PROMPT_TIMES, 2, draft=1.15))
    assert cells["speedup"].verdict == "suspicious" and cells["speedup"].effect == pytest.approx(1 / 1.15, rel=0.03)


def test_calibrated_noise_floor_silences_drift_inside_it_not_beyond():
    base = _paired(PROMPT_TIMES, 1)
    floor = {("b", "tokens_per_s"): 0.25, ("b", "latency"): 0.25}
    inside = _decide_spec(base, _paired(PROMPT_TIMES, 2, machine=1.2), calib=floor)
    assert inside["tokens_per_s"].verdict == "ok" and inside["tokens_per_s"].mdc == 0.25
    beyond = _decide_spec(base, _paired(PROMPT_TIMES, 2, machine=1.6), calib=floor)
    assert beyond["tokens_per_s"].verdict == "suspicious"


def test_noise_floor_takes_the_run_to_run_drift():
    from specdec_tune.tuner.regress import noise_floor, noise_spread

    assert noise_spread([0.01, -0.01, 0.0], [0.2, -0.2]) == pytest.approx(0.2)  # drift dominates
    assert noise_spread([0.1, -0.1], []) == pytest.approx(math.sqrt(0.02))
    assert math.isnan(noise_spread([], []))
    assert noise_floor([], [0.2, -0.2]) == pytest.approx(minimum_detectable_change(0.2))
    assert noise_floor([], [0.01], [0.05]) == pytest.approx(minimum_detectable_change(0.05))


def test_machine_probe_divides_a_slower_machine_out_of_absolute_speed():
    base = _paired(PROMPT_TIMES, 1, probe=True)
    slower_machine = _paired(PROMPT_TIMES, 2, machine=1.2, probe=True)
    cells = _decide_spec(base, slower_machine)
    assert cells["tokens_per_s"].verdict == "ok" and abs(cells["tokens_per_s"].effect - 1) < 0.03
    assert cells["latency"].verdict == "ok" and abs(cells["latency"].effect - 1) < 0.03
    assert cells["tokens_per_s"].details["machine_ratio"] == pytest.approx(1.2, rel=0.03)
    assert cells["tokens_per_s"].details["raw_ratio"] == pytest.approx(1 / 1.2, rel=0.03)
    # Power: the same samples compared raw flag the machine's drift as a regression.
    raw = {c.metric: c for c in decide(compare_benchmark("b", base, slower_machine, {"num_speculative_tokens": 0,
                                                                                   "draft": "d"}, Rules(),
                                                         machine=False), Rules(), {})}
    assert raw["tokens_per_s"].verdict == "suspicious" and raw["latency"].verdict == "suspicious"


def test_machine_probe_keeps_a_slowdown_of_the_code():
    cells = _decide_spec(_paired(PROMPT_TIMES, 1, probe=True), _paired(PROMPT_TIMES, 2, plain=1.15, probe=True))
    assert cells["tokens_per_s"].verdict == "suspicious"
    assert cells["tokens_per_s"].effect == pytest.approx(1 / 1.15, rel=0.03)
    assert cells["latency"].verdict == "suspicious"
    assert cells["speedup"].verdict == "ok"  # both decodes slowed alike: speculation buys the same


def test_samples_without_probe_timings_are_compared_raw_and_say_so():
    cells = _decide_spec(_paired(PROMPT_TIMES, 1), _paired(PROMPT_TIMES, 2, machine=1.2, probe=True))
    assert cells["tokens_per_s"].verdict == "suspicious"
    assert "no machine-probe" in cells["tokens_per_s"].details["machine"]
