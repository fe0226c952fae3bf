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
