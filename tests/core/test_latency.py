"""Per-request latency (TTFT, decode-window TPOT, inter-token gaps), energy per token and cost per token,
measured by the profiler through the engine's on_cycle hook and stored per measured run."""
from __future__ import annotations

import json
import math
import time
import types

import pytest
import torch

from specdec_tune.core.costs import usd_ci, usd_per_million_tokens
from specdec_tune.core.speculative import PLAIN, SpeculativeConfig
from specdec_tune.db import list_measured, open_database
from specdec_tune.engine import DecodeConfig, LoadedModel
from specdec_tune.core.latency import (
    LatencySamples,
    RequestLatency,
    Slo,
    attainment,
    good_samples,
    latency_summary,
    slo_met,
)
from specdec_tune.profiler.runs import DraftSpec, measure_prompt
from specdec_tune.core.stats import RateSamples
from tests.support.tiny import tiny_llama

VOCAB = 48


# --------------------------------------------------------------------------- the definitions


def test_tpot_is_the_decode_window_not_the_mean_chunk_gap():
    """A speculative request: 1 token at 0.10 s, then bursts of 4 every 0.04 s (13 tokens). vLLM #51454:
    the inter-chunk mean (0.04 s) overstates the time per token; the decode window gives 0.12 / 12."""
    r = RequestLatency((0.10, 0.14, 0.18, 0.22), (1, 4, 4, 4))
    assert r.ttft_s == pytest.approx(0.10) and r.new_tokens == 13
    assert r.tpot_s == pytest.approx(0.12 / 12)
    assert r.chunk_gaps() == pytest.approx([0.04] * 3)
    gaps = r.token_gaps()  # one gap per token after the first: each burst's gap once, then zeros
    assert len(gaps) == 12 and gaps.count(0.0) == 9 and sum(gaps) == pytest.approx(0.12)
    wrong = sum(r.chunk_gaps()) / len(r.chunk_gaps())  # what a per-chunk mean would report
    assert wrong == pytest.approx(4 * r.tpot_s)


def test_first_chunk_of_several_tokens_and_single_token_requests():
    r = RequestLatency((0.05, 0.09), (3, 1))  # the first cycle emitted 3 tokens at once
    assert r.ttft_s == 0.05 and r.tpot_s == pytest.approx(0.04 / 3) and r.token_gaps() == pytest.approx([0, 0, 0.04])
    assert RequestLatency((0.2,), (1,)).tpot_s is None
    with pytest.raises(ValueError):
        RequestLatency((0.2, 0.1), (1, 1))


def test_slo_goodput_counts_only_requests_meeting_it():
    fast = RequestLatency((0.01, 0.02, 0.03), (1, 1, 1))  # TPOT 10 ms
    slow = RequestLatency((0.01, 0.05, 0.09), (1, 1, 1))  # TPOT 40 ms
    lat = LatencySamples(("a", "b"), ((fast,), (slow,)))
    rates = RateSamples(("a", "b"), ((3.0,), (3.0,)), ((0.03,), (0.09,)))
    slo = Slo(tpot_ms=20)
    assert attainment(slo, lat) == 0.5 and slo.meets(0.01, 0.01) and not slo.meets(0.01, 0.04)
    good = good_samples(rates, lat, slo)
    assert good.tokens_per_s == pytest.approx(3.0 / 0.12) and rates.tokens_per_s == pytest.approx(6.0 / 0.12)
    assert good_samples(rates, lat, Slo()).tokens_per_s == rates.tokens_per_s  # no bound: throughput
    assert slo_met(Slo(tpot_ms=50), [0.01], [0.01, 0.04]) is True
    assert slo_met(Slo(tpot_ms=20, percentile=50), [0.01], [0.01, 0.04]) is False  # median 25 ms
    assert slo_met(Slo(), [0.01], [0.04]) is None
    with pytest.raises(ValueError, match="slo-tpot-ms"):
        Slo(tpot_ms=-1)


def test_latency_summary_percentiles_and_cis():
    rng = torch.Generator().manual_seed(0)
    requests = []
    for p in range(12):  # per-prompt TPOT of p ms (+ noise), 3 repeats
        row = []
        for _ in range(3):
            step = (p + 1) / 1000 * (1 + 0.01 * float(torch.randn(1, generator=rng)))
            row.append(RequestLatency(tuple(0.01 + step * i for i in range(9)), (1,) * 9))
        requests.append(tuple(row))
    s = latency_summary(LatencySamples(tuple(f"p{i}" for i in range(12)), tuple(requests)), resamples=500)
    p50 = s["tpot_s"]["p50"]
    assert p50["value"] == pytest.approx(0.0065, rel=0.02) and p50["ci"][0] <= p50["value"] <= p50["ci"][1]
    assert s["tpot_s"]["p90"]["value"] > p50["value"] and s["ttft_s"]["p50"]["value"] == pytest.approx(0.01)
    assert s["mean_burst"] == 1 and s["requests"] == 36


def test_cost_per_million_tokens():
    assert usd_per_million_tokens(3.6, 1000.0) == pytest.approx(1.0)  # $3.60/h at 1000 tokens/s: $1 per M
    assert usd_ci(3.6, (500.0, 2000.0)) == pytest.approx((0.5, 2.0))  # bounds swap
    with pytest.raises(ValueError, match="gpu-price"):
        usd_per_million_tokens(-1.0, 10.0)


# --------------------------------------------------------------------------- measured through the engine's hook


def _loaded(model: torch.nn.Module, name: str) -> LoadedModel:
    return LoadedModel(name=name, source=name, model=model, tokenizer=types.SimpleNamespace(decode=lambda *a, **k: ""),
                       device=torch.device("cpu"), dtype=torch.float64)


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(vocab=VOCAB, layers=2, seed=0, sharpness=4.0)
    draft = tiny_llama(vocab=VOCAB, layers=2, seed=0, sharpness=4.0)
    with torch.no_grad():
        draft.lm_head.weight.add_(0.3 * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(3),
                                                    dtype=torch.float64))
    return _loaded(target, "target"), _loaded(draft, "draft")


@pytest.mark.parametrize("kind", ["none", "model", "ngram"])
def test_arrivals_follow_the_cycles(pair, kind):
    target, draft = pair
    spec = DraftSpec(kind, draft if kind == "model" else None)
    ids = torch.randint(0, VOCAB, (7,), generator=torch.Generator().manual_seed(1))
    run = measure_prompt(target, spec, ids, DecodeConfig(max_new_tokens=20, num_speculative_tokens=4))
    lat = run.latency
    assert lat is not None and lat.new_tokens == run.new_tokens
    assert all(b >= a for a, b in zip(lat.times, lat.times[1:])) and lat.times[-1] <= run.seconds
    if kind == "none":
        assert lat.tokens == (1,) * run.new_tokens  # one arrival per token
    else:
        assert list(lat.tokens) == [c.emitted for c in run.result.cycles]  # one arrival per cycle: its burst
        assert run.result.cycles and max(lat.tokens) >= 1
    assert 0 < lat.ttft_s < run.seconds and lat.tpot_s > 0


@pytest.mark.slow
def test_measure_stores_latency_cost_and_no_energy_on_a_cpu(tiny_model_dirs, tmp_path):
    from specdec_tune.profiler import MeasureSpec, measure_configs
    from tests.profiler.test_session import TINY
    from specdec_tune.profiler.session import ProfileSession

    workload = _workload(tmp_path)
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    run_id = ProfileSession(db, tiny_model_dirs["target"], [tiny_model_dirs["draft"]], workload, TINY).run().run_id
    ms = measure_configs(db, run_id, [MeasureSpec(SpeculativeConfig(None, 3)), MeasureSpec(PLAIN)], repeats=2, split="all",
                         gpu_price=2.5)
    rows = {r.id: r for r in list_measured(db, run_id)}
    for m in ms:
        row = rows[m.measured_id]
        assert row.energy_j is None and row.joules_per_token is None and row.energy is None  # CPU: absent
        assert row.usd_per_million_tokens == pytest.approx(2.5 / 3600 / m.tokens_per_s * 1e6)
        assert row.gpu_price_usd_per_hour == 2.5
        assert row.tpot_p50_s > 0 and row.tpot_p90_s >= row.tpot_p50_s and row.tpot_p99_s >= row.tpot_p90_s
        back = LatencySamples.from_json(row.latency["requests"])
        assert back.prompt_ids == tuple(m.prompt_ids) and all(len(r) == 2 for r in back.requests)
        assert row.latency["summary"]["tpot_s"]["p50"]["value"] == pytest.approx(row.tpot_p50_s)


def _workload(tmp_path) -> str:
    path = tmp_path / "w.jsonl"
    lines = [{"id": f"p{i}", "prompt": text} for i, text in enumerate(["def add(a, b):", "class Point:", "for i in range(10):"])]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


def _fake_nvml(watts: float) -> types.SimpleNamespace:
    """An NVML whose energy counter grows at ``watts`` with the wall clock (millijoules)."""
    t0 = time.perf_counter()
    return types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: "h",
        nvmlDeviceGetTotalEnergyConsumption=lambda h: int((time.perf_counter() - t0) * watts * 1000))


@pytest.mark.slow
def test_energy_per_token_is_the_counter_delta_of_each_pass(tiny_model_dirs, tmp_path, monkeypatch):
    """A fake NVML counter at 100 W: joules per token must be 100 W × the metered passes' seconds per token
    (read around each configuration's own passes), so the machine probe and the other configurations'
    work are not charged; the metered passes decode what the timed passes decoded."""
    from specdec_tune.profiler import MeasureSpec, measure_configs
    from specdec_tune.profiler import energy as energy_mod
    from specdec_tune.profiler import measure as measure_mod
    from specdec_tune.profiler.session import ProfileSession
    from tests.profiler.test_session import TINY

    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    run_id = ProfileSession(db, tiny_model_dirs["target"], [tiny_model_dirs["draft"]], _workload(tmp_path),
                            TINY).run().run_id
    fake = _fake_nvml(100.0)
    monkeypatch.setattr(measure_mod, "open_energy_meter", lambda device: energy_mod.EnergyMeter(fake, 0))
    (m,) = measure_configs(db, run_id, [MeasureSpec(SpeculativeConfig(None, 3))], repeats=3, split="all")
    from specdec_tune.profiler.measure_passes import ENERGY_PASSES

    assert m.energy is not None and len(m.energy.joules) == len(m.energy.seconds) == ENERGY_PASSES
    assert m.energy.joules_per_token == pytest.approx(100.0 * sum(m.energy.seconds) / sum(m.energy.tokens), rel=0.05)
    assert sum(m.energy.tokens) == ENERGY_PASSES * sum(row[0] for row in m.samples.tokens)  # the same decodes
    (row,) = [r for r in list_measured(db, run_id) if r.id == m.measured_id]
    assert row.joules_per_token == pytest.approx(m.energy.joules_per_token) and row.energy_j > 0
    lo, hi = row.energy["joules_per_token_ci"]
    assert lo <= row.joules_per_token * 1.2 and hi >= row.joules_per_token * 0.8 and not math.isnan(lo)


def test_no_energy_meter_without_a_gpu_or_nvml(monkeypatch):
    from specdec_tune.profiler.energy import open_energy_meter

    assert open_energy_meter("cpu") is None


def test_dashboard_shows_energy_only_where_it_was_measured():
    import datetime as dt

    from specdec_tune.dashboard.operator import operator_info
    from specdec_tune.db import MeasuredRecord

    def rec(i: int, joules: float | None) -> MeasuredRecord:
        return MeasuredRecord(
            id=i, run_id=1, draft="d", config={"num_speculative_tokens": 3, "split": "holdout"},
            measured_tokens_per_s=100.0, predicted_tokens_per_s=None, measured_tau=2.0, predicted_tau=None, seconds=1.0,
            new_tokens=100, created_at=dt.datetime.now(dt.timezone.utc), ci_low=90.0, ci_high=110.0,
            tpot_p50_s=0.01, tpot_p90_s=0.012, tpot_p99_s=0.02, ttft_p50_s=0.1,
            latency={"summary": {"tpot_s": {"p50": {"value": 0.01, "ci": [0.009, 0.011]}}, "mean_burst": 2.5}},
            joules_per_token=joules, energy=None if joules is None else {"joules_per_token_ci": [0.4, 0.6]},
            gpu_price_usd_per_hour=3.6, usd_per_million_tokens=10.0)

    cpu = operator_info([rec(1, None)])
    assert not cpu.has_energy and cpu.has_cost and cpu.rows[0].tpot_p50_ci == (0.009, 0.011)
    assert cpu.rows[0].usd_ci == pytest.approx((3.6 / 3600 / 110 * 1e6, 3.6 / 3600 / 90 * 1e6))
    gpu = operator_info([rec(1, None), rec(2, 0.5)])
    assert gpu.has_energy and gpu.rows[1].joules_per_token_ci == (0.4, 0.6) and gpu.rows[0].joules_per_token is None


def test_0007_adds_the_operator_columns_keeps_older_rows_and_downgrades(tmp_path):
    import sqlalchemy as sa
    from alembic import command

    from specdec_tune.db import add_measured_run, upgrade
    from specdec_tune.db._migrate import alembic_config

    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert upgrade(url, "0004") == (None, "0004")
    with sa.create_engine(url).begin() as conn:
        conn.execute(sa.text("INSERT INTO hardware (fingerprint, created_at, device, device_name, device_count, extra) "
                             "VALUES ('h', '2026-01-01', 'cpu', 'c', 1, '{}')"))
        conn.execute(sa.text("INSERT INTO models (fingerprint, created_at, name, extra) VALUES ('m', '2026-01-01', "
                             "'t', '{}')"))
        conn.execute(sa.text("INSERT INTO profile_runs (target_model_id, hardware_id, settings, status, started_at) "
                             "VALUES (1, 1, '{}', 'completed', '2026-01-01')"))
        conn.execute(sa.text("INSERT INTO measured_runs (run_id, draft, config, measured_tokens_per_s, seconds, "
                             "new_tokens, created_at) VALUES (1, 'd', '{}', 80.0, 2.0, 160, '2026-01-01')"))
    assert upgrade(url, "0007") == ("0004", "0007")
    db = open_database(url)
    (old,) = list_measured(db, 1)
    assert old.measured_tokens_per_s == 80.0 and old.tpot_p50_s is None and old.joules_per_token is None
    new = add_measured_run(db, 1, draft=None, config={}, measured_tokens_per_s=10.0, seconds=1.0, new_tokens=10,
                           operator={"tpot_p50_s": 0.01, "latency": {"x": float("nan")}, "usd_per_million_tokens": 2.0})
    row = list_measured(db, 1)[-1]
    assert row.id == new and row.tpot_p50_s == 0.01 and row.latency == {"x": None} and row.energy_j is None
    with pytest.raises(Exception, match="unknown measured-run column"):
        add_measured_run(db, 1, draft=None, config={}, measured_tokens_per_s=1.0, seconds=1.0, new_tokens=1,
                         operator={"tpot": 1.0})
    db.close()
    with sa.create_engine(url).begin() as conn:
        command.downgrade(alembic_config(conn), "0004")
    columns = {c["name"] for c in sa.inspect(sa.create_engine(url)).get_columns("measured_runs")}
    assert "tpot_p50_s" not in columns and "measured_tokens_per_s" in columns


def test_percentile_ci_contains_its_point_with_right_skewed_repeats():
    """Each prompt has one slow repeat in three (a load burst): the median ignores it, and so must the
    percentile's CI (resampling the repeats put a p90's whole interval above the point estimate)."""
    requests = []
    for p in range(20):
        base = 0.005 + 0.0002 * p
        row = [RequestLatency(tuple(0.01 + step * i for i in range(9)), (1,) * 9) for step in (base, base, 4 * base)]
        requests.append(tuple(row))
    s = latency_summary(LatencySamples(tuple(f"p{i}" for i in range(20)), tuple(requests)), resamples=1000)
    for q in ("p50", "p90", "p99"):
        lo, hi = s["tpot_s"][q]["ci"]
        assert lo <= s["tpot_s"][q]["value"] <= hi, q
    assert s["tpot_s"]["p90"]["value"] < 0.0105  # the slow repeats do not reach the per-prompt medians


# --------------------------------------------------------------------------- CIs where some prompts have no value


def _one_chunk(t: float = 0.02, n: int = 8) -> RequestLatency:
    return RequestLatency((t,), (n,))  # every token in one cycle: no chunk gap


def _chunks(step: float, n: int = 4) -> RequestLatency:
    return RequestLatency(tuple(0.01 + step * i for i in range(n)), (2,) * n)


def test_gap_ci_when_most_prompts_have_no_gap():
    """Issue 35 row 3: tune crashed with an IndexError in the gaps' bootstrap when a resample drew only
    requests whose tokens came in one chunk (np.quantile of nothing). A prompt without a gap is no
    observation of a gap percentile: the bootstrap resamples the prompts that have gaps, and from one such
    prompt there is no CI (said why); the point is the quantile of every gap measured."""
    rows = [(_chunks(0.004), _chunks(0.004))] + [(_one_chunk(), _one_chunk())] * 5
    s = latency_summary(LatencySamples(tuple(f"p{i}" for i in range(6)), tuple(rows)), resamples=500)
    gap = s["chunk_gap_s"]["p50"]
    assert gap["value"] == pytest.approx(0.004) and gap["ci"] is None
    assert gap["why"] == "no 95% CI from 1 of 6 prompts: a CI over prompts needs >= 2"
    assert s["ttft_s"]["p50"]["ci"] is not None and s["ttft_s"]["p50"]["why"] is None  # every prompt has a TTFT

    rows = [(_chunks(0.002 * (i + 1)),) for i in range(3)] + [(_one_chunk(),)] * 9
    s = latency_summary(LatencySamples(tuple(f"p{i}" for i in range(12)), tuple(rows)), resamples=500)
    for q in ("p50", "p90", "p99"):
        lo, hi = s["chunk_gap_s"][q]["ci"]
        assert 0.002 - 1e-12 <= lo <= s["chunk_gap_s"][q]["value"] <= hi <= 0.006 + 1e-12, q  # only the gaps there


def test_repeats_of_a_prompt_are_one_cluster_and_one_prompt_has_no_ci():
    """Five repeats of one prompt decode the same tokens: they say nothing about other prompts, so no CI
    (the gaps' CI treated each request as a cluster and gave one; TTFT and TPOT gave a zero-width one)."""
    row = tuple(_chunks(0.003 + 0.0001 * r) for r in range(5))
    s = latency_summary(LatencySamples(("p0",), (row,)), resamples=200)
    for name in ("ttft_s", "tpot_s", "token_gap_s", "chunk_gap_s"):
        entry = s[name]["p50"]
        assert entry["value"] is not None and entry["ci"] is None, name
        assert entry["why"] == "no 95% CI from 1 prompt: a CI over prompts needs >= 2", name


def test_requests_of_one_token_have_no_tpot_and_say_why():
    one = RequestLatency((0.02,), (1,))
    s = latency_summary(LatencySamples(("a", "b"), ((one, one), (one, one))), resamples=200)
    assert s["ttft_s"]["p50"]["value"] == pytest.approx(0.02) and s["ttft_s"]["p50"]["ci"] is not None
    for name in ("tpot_s", "token_gap_s", "chunk_gap_s"):
        assert s[name]["p99"]["value"] is None and s[name]["p99"]["ci"] is None, name
    assert s["tpot_s"]["p50"]["why"].startswith("no request emitted 2 or more tokens")


def test_predicted_tpot_leaves_out_requests_of_one_token():
    """A predicted TPOT is as undefined for a one-token request as a measured one (it was 0 or one step)."""
    from specdec_tune.tuner.model import LatencyPrediction

    p = LatencyPrediction((0.01, 0.01, 0.01), (math.nan, 0.002, 0.004), (1.0, 5.0, 5.0), "simulation")
    assert p.tpot(0.5) == pytest.approx(0.003)
    assert math.isnan(LatencyPrediction((0.01,), (math.nan,), (1.0,), "baseline").tpot(0.5))
    assert p.attainment(Slo(tpot_ms=3.0)) == pytest.approx(6 / 11)  # the one-token request meets a TPOT bound
