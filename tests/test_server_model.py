"""Server calibration math (issue 11 §2) on synthetic groups whose true time terms are known, and
on a recorded real vLLM run (tests/data/vllm_recorded_measure.json, when present): calibrate on some
configurations, predict the others."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from specdec_tune.errors import InputError
from specdec_tune.tuner.server_model import ServerModel, ServerPoint, calibrate, point_from_counts

TRUE = {1: dict(P=0.05, Pd=0.08, T=0.010, O=0.004, s=0.003), 4: dict(P=0.12, Pd=0.2, T=0.016, O=0.007, s=0.009)}
MAX_NEW = 48


def _group(rng: random.Random, b: int, n: int, tau: float, noise: float = 0.02) -> ServerPoint:
    t = TRUE[b]
    steps = (MAX_NEW - 1) / tau
    if n == 0:
        seconds, prefill = t["P"] + steps * t["T"], t["P"]
    else:
        seconds, prefill = t["Pd"] + steps * (t["T"] + t["O"] + t["s"] * n), t["Pd"]
    seconds *= rng.uniform(1 - noise, 1 + noise)
    return ServerPoint(b, "plain" if n == 0 else "model", seconds, steps, float(n), b * MAX_NEW, prefill)


def _tau(rng: random.Random, n: int) -> float:
    return 1.0 if n == 0 else rng.uniform(1.0 + 0.3 * n, 1.0 + 0.7 * n)


def _calibrated(rng: random.Random, ns=(0, 2, 5), groups=6) -> ServerModel:
    return calibrate([_group(rng, b, n, _tau(rng, n)) for b in TRUE for n in ns for _ in range(groups)])


def test_recovers_the_time_terms_and_predicts_configurations_it_was_not_fitted_on():
    rng = random.Random(1)
    model = _calibrated(rng)
    for b, t in TRUE.items():
        fit = model.times[b]
        assert fit.step_s == pytest.approx(t["T"], rel=0.05)
        assert fit.per_draft_token_s["model"] == pytest.approx(t["s"], rel=0.15)
        for n in (1, 3, 4, 7):  # out of sample: N never calibrated on
            tau = 1.0 + 0.5 * n
            truth = b * MAX_NEW / (t["Pd"] + (MAX_NEW - 1) / tau * (t["T"] + t["O"] + t["s"] * n))
            assert model.predict(b, "model", MAX_NEW, tau, n) == pytest.approx(truth, rel=0.03)


def test_a_model_without_the_per_token_term_is_caught():
    """Power: the same held-out check fails if the cost of a draft token is dropped from the fit."""
    model = _calibrated(random.Random(2))
    t = TRUE[1]
    bad = ServerModel({b: type(x)(x.batch_size, x.prefill_s, x.step_s, {"model": x.spec_step_s["model"]},
                                  {"model": 0.0}) for b, x in model.times.items()})
    n, tau = 8, 4.0
    truth = MAX_NEW / (t["Pd"] + (MAX_NEW - 1) / tau * (t["T"] + t["O"] + t["s"] * n))
    assert model.predict(1, "model", MAX_NEW, tau, n) == pytest.approx(truth, rel=0.03)
    assert abs(bad.predict(1, "model", MAX_NEW, tau, n) / truth - 1) > 0.2


def test_point_from_counts_counts_steps_from_the_server_counters():
    # 4 requests x 32 tokens: 4 first tokens from prefill, 60 accepted draft tokens, so 64 steps
    p = point_from_counts(4, "model", 1.0, 128, accepted=60, draft_tokens=192, prefill_s=0.1)
    assert p.steps == pytest.approx(16.0) and p.draft_len == pytest.approx(3.0)
    assert point_from_counts(1, "plain", 1.0, 32).steps == 31
    with pytest.raises(InputError):
        point_from_counts(1, "model", 1.0, 10, accepted=20)


def test_calibration_needs_plain_runs_and_two_values_of_n():
    rng = random.Random(3)
    with pytest.raises(InputError, match="plain"):
        calibrate([_group(rng, 1, 4, 2.0)])
    with pytest.raises(InputError, match="two or more"):
        calibrate([_group(rng, 1, 0, 1.0), _group(rng, 1, 4, 2.0), _group(rng, 1, 4, 2.5)])
    with pytest.raises(InputError, match="batch sizes"):
        _calibrated(rng).predict(16, "model", MAX_NEW, 2.0, 4)
    with pytest.raises(InputError, match="ngram"):
        _calibrated(rng).predict(1, "ngram", MAX_NEW, 2.0, 2.0)


def test_round_trips_through_json():
    model = _calibrated(random.Random(4))
    again = ServerModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.predict(4, "model", MAX_NEW, 2.5, 3) == pytest.approx(model.predict(4, "model", MAX_NEW, 2.5, 3))


RECORDED = Path(__file__).parent / "data" / "vllm_recorded_measure.json"


@pytest.mark.skipif(not RECORDED.exists(), reason="no recorded vLLM run (benchmarks/server_fidelity.py makes it)")
@pytest.mark.xfail(strict=True, reason=(
    "known failure, recorded data: the calibration runs (plain, N=2, N=5) were measured in a slower minute of "
    "the shared VM than the held-out runs (plain step 12.1 ms vs 9.1 ms) and N=2 and N=5 measured the same step "
    "time, so the per-draft-token cost fits to 0 and N=1 and N=8 miss by 16-22%. Calibration and validation must "
    "run in one interleaved session; see README 'vLLM server fidelity'"))
def test_recorded_vllm_run_out_of_sample():
    """Real vLLM runs recorded on this CPU by benchmarks/server_fidelity.py: calibrate on plain decoding
    and two values of N on the tuning prompts, predict the other values of N on the held-out prompts
    from their measured acceptance (so this checks the time terms, not the acceptance): within 15%
    each, median within 8%."""
    from specdec_tune.profiler.vllm_measure import ServerMeasurement
    from specdec_tune.tuner.server_calibration import points_of

    data = json.loads(RECORDED.read_text())
    ms = [ServerMeasurement.from_json(d) for d in data["measurements"]]
    fit = [m for m in ms if m.split == "tune"]
    held = [m for m in ms if m.split == "holdout" and m.config.num_speculative_tokens > 0]
    assert fit and held
    model = calibrate([p for m in fit for p in points_of(m)])
    errors = []
    for m in held:
        pts = points_of(m)
        tau = sum(p.new_tokens - p.batch_size for p in pts) / sum(p.steps * p.batch_size for p in pts)
        length = sum(p.draft_len * p.steps for p in pts) / sum(p.steps for p in pts)
        max_new = max(p.new_tokens for p in pts) // m.batch_size
        errors.append(model.predict(m.batch_size, "model", max_new, tau, length) / m.tokens_per_s - 1)
    assert max(abs(e) for e in errors) < 0.15, errors
    assert sorted(abs(e) for e in errors)[len(errors) // 2] < 0.08, errors
