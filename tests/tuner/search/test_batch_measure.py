"""Measured per batch size (issue 38): ``measure --batch-sizes`` decodes batches of prompts on the batched engine
against plain decoding at the same batch size, stores each with its batch model prediction; the batch model
replays the engine's own cycle structure (live rows, verify width, draft forwards)."""
from __future__ import annotations

import json

import pytest

from specdec_tune.cli import main
from specdec_tune.db import list_measured, open_database
from specdec_tune.engine import DecodeConfig
from specdec_tune.profiler import BatchClock, DraftSpec, ProfileSettings, decode_batch, encode_prompt, run_profile
from specdec_tune.tuner.model import SpecConfig, batch_cycles, load_run_profile
from specdec_tune.tuner.model._predict import simulate_config

PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
           "x = [i for i in range(3)]", "return a + b", "self.x = x", "def mul(a, b):", "class Line:"]


@pytest.fixture(scope="module")
def profiled(tiny_model_dirs, tmp_path_factory):
    """A profile of the tiny pair on the tuning half of 10 prompts, T_v(B, k) and T_s(B) at B = 1, 2, 4."""
    root = tmp_path_factory.mktemp("batch_measure")
    path = root / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    url = f"sqlite:///{root / 'r.db'}"
    settings = ProfileSettings(device="cpu", repeats=2, warmup=1, k_max=4, n_max=3, max_new_tokens=10,
                               context_lens=(8, 16), prefill_repeats=1, overhead_prompts=1, overhead_ns=(1,),
                               batch_sizes=(1, 2, 4), split="tune")
    run = run_profile(open_database(url), tiny_model_dirs["target"], [tiny_model_dirs["draft"]], str(path), settings)
    return url, run.run_id


def _run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_batch_model_replays_the_engines_cycles(profiled, tiny_model_dirs):
    """For profiled prompts decoded together, the model's batch cycles (live rows, widest verify, most draft
    forwards) are the cycles the batched engine ran, cycle by cycle, for every N."""
    from specdec_tune.engine import load_model

    url, run_id = profiled
    db = open_database(url)
    rp = load_run_profile(db, run_id)
    target, draft = load_model(tiny_model_dirs["target"], "cpu"), load_model(tiny_model_dirs["draft"], "cpu")
    ids = [encode_prompt(target, p) for p in PROMPTS[0:8:2]]  # the tuning half, in the profile's order
    for n in (1, 2, 3):
        config = DecodeConfig(10, num_speculative_tokens=n, eos_token_id=target.eos_token_id)
        clock = BatchClock(len(ids))
        decode_batch(target, DraftSpec("model", draft), ids, config, on_cycle=clock)
        engine = [(len(c.rows), c.width, c.draft_forwards) for c in clock.cycles]
        rows = [simulate_config(rp, SpecConfig(n), i) for i in range(len(ids))]
        assert batch_cycles(rows) == engine
        assert len({w for _, w, _ in engine}) > 1 or n == 1  # (the last cycles are cut by the limit)


def test_measure_batch_sizes_measures_each_band_against_plain_decoding(profiled, capsys):
    url, run_id = profiled
    code, out, err = _run(["measure", "--run", str(run_id), "-N", "2", "--batch-sizes", "1,2", "--repeats", "2",
                           "--db", url, "--json"], capsys)
    assert code == 0, err
    rows = json.loads(out)["per_batch_size"]
    assert [r["batch_size"] for r in rows] == [1, 2]
    one, two = rows
    assert two["batches"] == [["p1", "p3"], ["p5", "p7"]] and two["ci_unit"] == "batch"  # the held-out half, in pairs
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["plain"]["tokens_per_s"] > 0 and r["label"] == "measured"
        assert r["ci95"] and r["speedup_ci95"] and r["speedup_ci95"][0] <= r["speedup"] <= r["speedup_ci95"][1]
        assert r["predicted_tokens_per_s"] > 0 and r["unpredicted"] is None
    stored = {(m.config["batch_size"], m.draft is None): m for m in list_measured(open_database(url), run_id)}
    assert stored[(2, False)].config["batches"] == two["batches"] and stored[(2, True)].predicted_tokens_per_s
    assert stored[(2, False)].config["ci_unit"] == "batch"


def test_a_batch_size_the_profile_did_not_time_is_measured_without_a_prediction(profiled, capsys):
    """B = 5 lies past the profile's largest B = 4 (B = 3 would interpolate): measured, stored, no prediction."""
    url, run_id = profiled
    code, out, err = _run(["measure", "--run", str(run_id), "-N", "2", "--batch-sizes", "5", "--repeats", "1",
                           "--split", "all", "--db", url], capsys)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("B=5"))
    assert "measured" in line and "no prediction at B=5" in line and "outside the measured range" in line


def test_more_batch_than_prompts_is_refused_before_anything_runs(profiled, capsys):
    url, run_id = profiled
    before = len(list_measured(open_database(url), run_id))
    code, out, err = _run(["measure", "--run", str(run_id), "-N", "2", "--batch-sizes", "1,8", "--db", url], capsys)
    assert code == 2 and err.strip().startswith("error:") and "batch size 8 needs at least 8 prompts" in err
    assert len(err.strip().splitlines()) == 1
    assert len(list_measured(open_database(url), run_id)) == before


def test_each_band_is_measured_at_its_batch_size_or_says_why_not(profiled, tiny_model_dirs):
    """The bands of a schedule: B = 2 measured held out against plain decoding at B = 2 (2 batches of the 5
    held-out prompts, a paired CI), B = 4 not (one batch cannot give a CI), and the B = 1 rule decides each."""
    from specdec_tune.tuner.model import Candidate, decide_bands
    from specdec_tune.tuner.search._bands import band_evidence

    url, run_id = profiled
    c = Candidate(tiny_model_dirs["draft"], 3)
    schedule = {1: 3, 2: 2, 4: 1}
    evidence = band_evidence(open_database(url), run_id, {c: schedule}, heldout_prompts=5, temperature=0.0,
                             repeats=2, seed=0, progress=None)[c]
    two, four = evidence[2], evidence[4]
    assert two.batches == 2 and two.heldout and two.ci is not None and two.ci[0] <= two.speedup <= two.ci[1]
    assert four.speedup is None and "make 1 batch of 4" in four.why and "--heldout-prompts 8" in four.why
    ruled, reasons = decide_bands(c, schedule, evidence)
    assert ruled[1] == 3 and ruled[4] == 0
    assert "at B=2 (2 batches of 2 held-out prompts)" in reasons[2] and "95% CI" in reasons[2]
    assert ruled[2] == (2 if two.ci[0] >= 1 else 0)
    stored = [m for m in list_measured(open_database(url), run_id) if m.config.get("batch_size") == 2
              and m.config.get("split") == "holdout" and m.config.get("num_speculative_tokens") == 2]
    assert stored and stored[-1].config["batches"] == [["p1", "p3"], ["p5", "p7"]]


def test_bands_ship_only_with_measured_evidence():
    """The B = 1 rule per band: a CI lower bound >= 1 ships the band's N; below 1, or no CI, speculates 0 there
    and at every larger batch size, each with its reason; a band the model already turned off is left at 0."""
    from specdec_tune.tuner.model import BandEvidence, Candidate, decide_bands

    c = Candidate("draft", 4)
    good, weak = BandEvidence(1.3, (1.1, 1.5), True, 4), BandEvidence(1.1, (0.95, 1.3), True, 4)
    ruled, why = decide_bands(c, {1: 4, 4: 3, 16: 2, 64: 1}, {4: good, 16: weak, 64: good})
    assert ruled == {1: 4, 4: 3, 16: 0, 64: 0}
    assert why[4].startswith("N=3: at B=4") and "lower bound is below 1" in why[16] and "turned off from B=16" in why[64]
    ruled, why = decide_bands(c, {1: 4, 4: 0, 16: 2}, {})
    assert ruled == {1: 4, 4: 0, 16: 0} and "does not pay at B=4" in why[4] and "not measured at B=16" in why[16]
    tuning = BandEvidence(1.5, (1.3, 1.7), False, 4)
    assert decide_bands(c, {1: 4, 4: 2}, {4: tuning})[0] == {1: 4, 4: 0}  # tuning prompts are no evidence


def test_tune_decides_every_speculating_servers_bands_from_one_measurement(profiled, tiny_model_dirs):
    """``measured_schedules``: the winner's schedule and each speculating server's are decided band by band from
    one measurement per (configuration, batch size), plain decoding once; a server that ships plain decoding
    is left as it was."""
    from specdec_tune.tuner.model import Candidate, ServerDecision
    from specdec_tune.tuner.search._bands import measured_schedules

    url, run_id = profiled
    db = open_database(url)
    c = Candidate(tiny_model_dirs["draft"], 3)
    schedule = {1: 3, 2: 2, 4: 1}
    decided = {"vllm": ServerDecision("vllm", c, "speculate", "measured", per_batch_size=dict(schedule)),
               "hf": ServerDecision("hf", c, "plain", "CI below 1", per_batch_size=dict(schedule))}
    before = len(list_measured(db, run_id))
    out, own, reasons = measured_schedules(db, run_id, c, schedule, decided, heldout_prompts=5, temperature=0.0,
                                           repeats=1, seed=0, progress=None)
    new = list_measured(db, run_id)[before:]
    assert sorted((m.config["batch_size"], m.config["num_speculative_tokens"]) for m in new) == [(2, 0), (2, 2)]
    assert out["vllm"].per_batch_size == own and own[4] == 0 and own[2] in (0, 2) and own[1] == 3
    assert out["vllm"].per_batch_size_reasons == reasons and "at B=2 (2 batches of 2 held-out prompts)" in reasons[2]
    assert out["hf"] == decided["hf"]
