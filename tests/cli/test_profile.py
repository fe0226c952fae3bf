"""`specdec-tune profile`, `predict` and `measure` end to end on tiny saved models, and their bad input."""
from __future__ import annotations

import json
import shutil

import pytest

from specdec_tune.cli import main
from specdec_tune.db import get_run, list_measured, list_runs, open_database

TINY_FLAGS = ["--device", "cpu", "--repeats", "2", "--k-max", "3", "--n-max", "4", "--max-prompts", "2",
              "--max-new-tokens", "8", "--context-lens", "8,16"]


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def profiled(tiny_model_dirs, tmp_path_factory):
    """One profile run (model draft + n-gram) in a fresh database, made once for the module."""
    root = tmp_path_factory.mktemp("cli_profile")
    workload = root / "w.jsonl"
    workload.write_text('{"id": "a", "prompt": "def add(a, b):"}\n{"id": "b", "prompt": "class Point:"}\n'
                        '{"id": "c", "prompt": "for i in range(10):"}\n')
    url = f"sqlite:///{root / 'results.db'}"
    code = main(["profile", "--target", tiny_model_dirs["target"], "--draft", f"{tiny_model_dirs['draft']},ngram",
                 "--workload", str(workload), "--db", url, "--json", "--batch-sizes", "1,2", *TINY_FLAGS])
    assert code == 0
    return url, str(workload)


def _profile_json(url, capsys, run_id):
    from specdec_tune.cli.profile import profile_summary

    return profile_summary(open_database(url), run_id)


def test_profile_json_contract(profiled, tiny_model_dirs, capsys):
    url, _ = profiled
    db = open_database(url)
    (run_rec,) = list_runs(db)
    assert run_rec.status == "completed"
    summary = _profile_json(url, capsys, run_rec.id)
    assert summary["run_id"] == run_rec.id and summary["status"] == "completed"
    assert set(summary["verify_ms"]) == {"1", "2"} and set(summary["verify_ms"]["1"]) == {"1", "2", "3"}
    names = [d["name"] for d in summary["drafts"]]
    assert names == [tiny_model_dirs["draft"], "ngram"]
    model_draft = summary["drafts"][0]
    assert model_draft["draft_step_ms"]["1"] > 0 and len(model_draft["alpha"]) == 4
    assert model_draft["best"] and all(b["label"] == "predicted" for b in model_draft["best"])
    speeds = [b["tokens_per_s"] for b in model_draft["best"]]
    assert speeds == sorted(speeds, reverse=True)
    assert set(model_draft["best_n_per_batch_size"]) == {"1", "2"}
    assert summary["baseline"]["measured_tokens_per_s"] > 0 and summary["baseline"]["predicted_tokens_per_s"] > 0
    # the run records which forward it timed (tiny Llamas: the lean one), so measure runs the same
    settings = get_run(db, run_rec.id).settings
    assert settings.forward == "lean" and settings.draft_forwards == {tiny_model_dirs["draft"]: "lean"}


@pytest.mark.slow
def test_profile_human_output(tiny_model_dirs, tmp_path, capsys):
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"id": "a", "prompt": "def add(a, b):"}\n')
    code, out, err = run(["profile", "--target", tiny_model_dirs["target"], "--draft", "ngram", "--workload",
                          str(workload), "--db", f"sqlite:///{tmp_path / 'h.db'}", *TINY_FLAGS], capsys)
    assert code == 0, err
    assert "run 1" in out and "measured" in out and "predicted" in out and "T_v(1)" in out
    assert "best: N =" in out and "prefill included" in out


def test_profile_says_plainly_when_plain_decoding_is_predicted_faster(profiled):
    """A best speculative configuration predicted below 1× means plain decoding wins: profile says so on
    the draft's table (and once for the run when no draft pays), not only "best: ... 0.66×"."""
    import copy
    import io

    from rich.console import Console

    from specdec_tune.cli.profile import _print_summary, profile_summary

    url, _ = profiled
    summary = profile_summary(open_database(url), 1)
    assert all(d["plain_predicted_faster"] == (d["best"][0]["speedup"] < 1) for d in summary["drafts"] if d["best"])

    def printed(speedups: list[float]) -> str:
        s = copy.deepcopy(summary)
        for d, x in zip(s["drafts"], speedups):
            for b in d["best"]:
                b["speedup"] *= x / d["best"][0]["speedup"]  # the best at x, the others in proportion
        buf = io.StringIO()
        _print_summary(Console(file=buf, width=200), s)
        return buf.getvalue()

    slower = printed([0.66, 0.8])
    assert "plain decoding is predicted faster (the best above: 0.66× plain decoding)" in slower
    assert "plain decoding is faster than every draft profiled here" in slower
    mixed = printed([0.66, 1.3])
    assert mixed.count("plain decoding is predicted faster") == 1 and "every draft profiled" not in mixed
    assert "predicted faster" not in printed([1.3, 1.1])


def test_predict_json_contract(profiled, tiny_model_dirs, capsys):
    url, _ = profiled
    code, out, _ = run(["predict", "--run", "1", "-N", "3", "--threshold", "0.2", "--db", url, "--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    for key in ("run_id", "draft", "num_speculative_tokens", "threshold", "schedule", "batch_size", "tokens_per_s",
                "speedup", "expected_tokens_per_cycle", "expected_draft_length"):
        assert key in obj
    assert obj["run_id"] == 1 and obj["draft"] == tiny_model_dirs["draft"] and obj["label"] == "predicted"
    assert obj["tokens_per_s"] > 0 and 1 <= obj["expected_tokens_per_cycle"] <= 4
    assert obj["speedup"] == pytest.approx(obj["tokens_per_s"] / obj["baseline_tokens_per_s"])
    code, out, _ = run(["predict", "--run", "1", "-N", "2", "--draft", "ngram", "--db", url], capsys)
    assert code == 0 and out.startswith("predicted:") and "ngram" in out
    code, out, _ = run(["predict", "--run", "1", "-N", "2", "--batch-size", "2", "--db", url, "--json"], capsys)
    two = json.loads(out)
    assert code == 0 and two["batch_size"] == 2 and two["tokens_per_s"] > 0
    code, _, err = run(["predict", "--run", "1", "-N", "2", "--batch-size", "3", "--db", url], capsys)
    _one_line_error(code, err, "--batch-size 3 is outside run 1's profiled batch sizes 1, 2")


@pytest.mark.slow
def test_measure_stores_measured_next_to_predicted(profiled, capsys):
    url, _ = profiled
    # --split tune: the profiled prompts themselves (in-sample: their traces are replayed exactly)
    code, out, _ = run(["measure", "--run", "1", "-N", "2", "--threshold", "0.3", "--split", "tune", "--db", url,
                        "--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    assert obj["split"] == "tune" and obj["in_sample"] is True and obj["prompt_ids"] == ["a", "c"]
    assert obj["label"] == "measured" and obj["run_id"] == 1
    assert obj["tokens_per_s"] == pytest.approx(obj["new_tokens"] / obj["seconds"])
    assert obj["relative_error"] == pytest.approx((obj["predicted_tokens_per_s"] - obj["tokens_per_s"]) / obj["tokens_per_s"])
    # greedy: the simulation replays the same prompts, so tokens per cycle are predicted exactly
    assert obj["predicted_tokens_per_cycle"] == pytest.approx(obj["mean_tokens_per_cycle"])
    stored = [m for m in list_measured(open_database(url), 1) if m.id == obj["measured_id"]]
    assert stored and stored[0].predicted_tokens_per_s == pytest.approx(obj["predicted_tokens_per_s"])
    assert stored[0].config["num_speculative_tokens"] == 2 and stored[0].config["threshold"] == 0.3
    code, out, _ = run(["measure", "--run", "1", "-N", "1", "--draft", "ngram", "--db", url], capsys)
    assert code == 0 and "measured:" in out and "predicted:" in out


@pytest.mark.slow
def test_measure_defaults_to_held_out_prompts_with_a_ci(profiled, capsys):
    url, _ = profiled
    db = open_database(url)
    assert get_run(db, 1).settings.split == "tune" and get_run(db, 1).settings.prompt_ids == ("a", "c")
    code, out, _ = run(["measure", "--run", "1", "-N", "2", "--repeats", "3", "--db", url, "--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    assert obj["split"] == "holdout" and obj["prompt_ids"] == ["b"] and obj["in_sample"] is False
    # one held-out prompt: no CI over prompts (its three repeats say nothing about other prompts), and why
    assert obj["ci95"] is None and obj["prediction_inside_ci"] is None and "from 1 prompt" in obj["ci95_why"]
    assert obj["speedup"]["ci95"] is None and "from 1 prompt" in obj["speedup"]["ci95_why"]
    (stored,) = [m for m in list_measured(db, 1) if m.id == obj["measured_id"]]
    assert stored.ci95 is None and stored.config["prompt_ids"] == ["b"]
    assert stored.config["in_sample"] is False and stored.config["prediction_in_sample"] is False
    assert len(stored.samples["seconds"]) == 1 and len(stored.samples["seconds"][0]) == 3
    code, out, _ = run(["measure", "--run", "1", "-N", "2", "--repeats", "3", "--split", "all", "--db", url, "--json"],
                       capsys)
    assert code == 0
    obj = json.loads(out)
    lo, hi = obj["ci95"]
    assert lo <= obj["tokens_per_s"] <= hi and obj["ci95_why"] is None
    assert obj["prediction_inside_ci"] == (lo <= obj["predicted_tokens_per_s"] <= hi)
    (stored,) = [m for m in list_measured(db, 1) if m.id == obj["measured_id"]]
    assert stored.ci95 == pytest.approx((lo, hi)) and stored.config["prompt_ids"] == ["a", "b", "c"]
    from specdec_tune.core.stats import tokens_per_s_ci

    assert tokens_per_s_ci(stored.samples) == pytest.approx((lo, hi))  # recomputable from what is stored
    code, out, _ = run(["measure", "--run", "1", "-N", "0", "--split", "0:3", "--repeats", "1", "--db", url], capsys)
    assert code == 0 and "measured:" in out and "95% CI" in out and "side the measured 95% CI" in out
    assert "2 of 3 prompts profiled" in out  # split 0:3 mixes profiled (a, c) and held-out (b) prompts


@pytest.mark.parametrize("split", ["50:10", "bogus", "3:3", "-1:2", "0:99"])
@pytest.mark.parametrize("command", ["measure", "profile"])
def test_bad_split_is_one_line_exit_2(profiled, tiny_model_dirs, command, split, capsys):
    url, workload = profiled
    args = (["measure", "--run", "1", "-N", "1"] if command == "measure" else
            ["profile", "--target", tiny_model_dirs["target"], "--draft", "ngram", "--workload", workload, *TINY_FLAGS])
    before = len(list_runs(open_database(url))), len(list_measured(open_database(url)))
    code, out, err = run([*args, "--split", split, "--db", url], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "split" in err
    assert (len(list_runs(open_database(url))), len(list_measured(open_database(url)))) == before


def test_measure_configs_interleaved_store_each_with_its_prediction(profiled):
    from specdec_tune.tuner.model import SpecConfig
    from specdec_tune.tuner.model import load_run_profile, machine_speed
    from specdec_tune.tuner.search import measure_predicted

    url, _ = profiled
    db = open_database(url)
    before = len(list_measured(db, 1))
    items = [(None, SpecConfig(3, 0.0)), ("ngram", SpecConfig(2, 0.0)), (None, SpecConfig(1, 0.0))]
    got = measure_predicted(db, 1, items, repeats=2)
    assert [(v.measurement.draft.endswith("draft"), v.config.spec.num_speculative_tokens) for v in got] == [(True, 3), (False, 2), (True, 1)]
    for v in got:
        m = v.measurement
        assert len(m.per_repeat_tokens_per_s) == 2 and m.tokens_per_s > 0
        if m.draft != "ngram":  # greedy with a model draft: the cycle simulation is exact
            assert v.prediction.expected_tokens_per_cycle == pytest.approx(m.mean_tokens_per_cycle)
        else:  # n-gram: an i.i.d. replay of the recorded cycles, not exact; it must still be close
            print(f"ngram tau predicted {v.prediction.expected_tokens_per_cycle:.3f} measured {m.mean_tokens_per_cycle:.3f}")
            assert v.prediction.expected_tokens_per_cycle == pytest.approx(m.mean_tokens_per_cycle, rel=0.15)
    stored = {m.id: m for m in list_measured(db, 1)}
    assert len(stored) == before + 3
    for v in got:
        row = stored[v.measurement.measured_id]
        assert row.config["num_speculative_tokens"] == v.config.spec.num_speculative_tokens
        assert row.predicted_tokens_per_s == pytest.approx(v.prediction.tokens_per_s)
        assert row.config["prediction_source"] == v.prediction.source
        # the machine probe ran between turns (every configuration keeps each reading), and the
        # prediction was rescaled to the speed it saw
        assert len(row.config["probe_seconds"]) >= 2 and row.config["machine_probe_s"] > 0
        assert row.config["probe_seconds"] == stored[got[0].measurement.measured_id].config["probe_seconds"]
        # the probe's ratio, or 1.0 where it lies within the probe's own noise during the profile
        assert v.prediction.machine_speed == pytest.approx(machine_speed(load_run_profile(db, 1),
                                                                         row.config["machine_probe_s"]))
        assert row.config["prediction_machine_speed"] == pytest.approx(v.prediction.machine_speed)
        assert row.config["threads"] == row.config["thread_choice"]["threads"] >= 1


def test_plain_decoding_in_the_same_passes_gauges_the_machine_speed(profiled):
    """With plain decoding measured alongside, every other configuration's prediction is rescaled by
    plain decoding's measured ÷ predicted tokens/s (the target itself at the same moments), not the
    probe; plain decoding's own prediction keeps the probe's factor."""
    from specdec_tune.tuner.model import SpecConfig, load_run_profile
    from specdec_tune.tuner.search import measure_predicted

    url, _ = profiled
    db = open_database(url)
    spec, plain = measure_predicted(db, 1, [(None, SpecConfig(2, 0.0)), ("none", SpecConfig(0, 0.0))], repeats=2)
    raw_plain = plain.prediction.tokens_per_s / plain.prediction.machine_speed
    gauge = plain.measurement.tokens_per_s / raw_plain
    assert spec.prediction.machine_speed == pytest.approx(gauge) and spec.speed_source.startswith("plain decoding")
    from specdec_tune.tuner.model import machine_speed

    rp = load_run_profile(db, 1)
    probe = rp.machine_probe_s / plain.measurement.machine_probe_s
    # the probe's factor, or 1.0 where the ratio lies within the probe's own noise (issue 37, F6)
    assert plain.prediction.machine_speed == pytest.approx(machine_speed(rp, plain.measurement.machine_probe_s))
    assert plain.prediction.machine_speed in (pytest.approx(probe), 1.0) and plain.speed_source == "the machine probe"
    row = {m.id: m for m in list_measured(db, 1)}[spec.measurement.measured_id]
    assert row.config["prediction_machine_speed_source"] == spec.speed_source
    assert row.config["prediction_machine_speed"] == pytest.approx(gauge)
    # speedups are untouched by the rescaling: predicted speedup = rescaled rate ÷ (gauge × raw plain rate)
    assert spec.prediction.tokens_per_s / plain.measurement.tokens_per_s == pytest.approx(spec.prediction.speedup, rel=1e-6)


def _one_line_error(code, err, needle):
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err


@pytest.mark.parametrize("command", ["predict", "measure"])
def test_unknown_run_and_draft(profiled, command, capsys):
    url, _ = profiled
    before = len(list_measured(open_database(url)))
    code, _, err = run([command, "--run", "99", "-N", "2", "--db", url], capsys)
    _one_line_error(code, err, "no profile run with id 99")
    code, _, err = run([command, "--run", "1", "-N", "2", "--draft", "nope", "--db", url], capsys)
    _one_line_error(code, err, "'nope' is not in run 1")
    assert "ngram" in err
    code, _, err = run([command, "--run", "1", "-N", "9", "--db", url], capsys)
    _one_line_error(code, err, "N_max=4")
    assert len(list_measured(open_database(url))) == before


@pytest.mark.parametrize("command", [["predict", "--run", "1", "-N", "2"], ["measure", "--run", "1", "-N", "2"]])
def test_bad_databases(command, tmp_path, capsys):
    code, _, err = run([*command, "--db", "nosuchdialect://x/y"], capsys)
    _one_line_error(code, err, "nosuchdialect")
    code, _, err = run([*command, "--db", f"sqlite:///{tmp_path / 'missing_dir' / 'x.db'}"], capsys)
    _one_line_error(code, err, "does not exist")
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    code, _, err = run([*command, "--db", f"sqlite:///{text}"], capsys)
    _one_line_error(code, err, "not a SQLite database")
    assert text.read_text() == "not a database\n"


def test_read_only_database(profiled, world_dir, cli_as_unprivileged):
    """A database file the user may not write: one line naming it, the file untouched. Runs as root
    too: ``cli_as_unprivileged`` runs the CLI as an unprivileged user there (root ignores mode 444)."""
    url, _ = profiled
    path = world_dir / "results.db"
    shutil.copyfile(url.removeprefix("sqlite:///"), path)
    before = path.read_bytes()
    path.chmod(0o444)
    code, err = cli_as_unprivileged(["measure", "--run", "1", "-N", "2", "--db", f"sqlite:///{path}"])
    _one_line_error(code, err, "read-only")
    assert str(path) in err and path.read_bytes() == before


def test_profile_bad_input_stores_nothing(profiled, tiny_model_dirs, tmp_path, capsys):
    url, workload = profiled
    before = [r.id for r in list_runs(open_database(url))]
    base = ["profile", "--target", tiny_model_dirs["target"], "--workload", workload, "--db", url, *TINY_FLAGS]
    code, _, err = run([*base, "--draft", "ngram", "--batch-sizes", "1,x"], capsys)
    _one_line_error(code, err, "--batch-sizes")
    code, _, err = run([*base, "--draft", tiny_model_dirs["other"]], capsys)
    _one_line_error(code, err, "do not share a vocabulary")
    code, _, err = run([*base, "--draft", "ngram,ngram"], capsys)
    _one_line_error(code, err, "twice")
    code, _, err = run(["profile", "--target", tiny_model_dirs["target"], "--draft", "ngram", "--workload",
                        "no-such-workload", "--db", url, *TINY_FLAGS], capsys)
    _one_line_error(code, err, "unknown workload")
    assert [r.id for r in list_runs(open_database(url))] == before
    assert get_run(open_database(url), before[0]).status == "completed"


@pytest.mark.slow
def test_sampling_profile_predict_measure(tiny_model_dirs, tmp_path, capsys):
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"id": "a", "prompt": "def add(a, b):"}\n{"id": "b", "prompt": "class Point:"}\n')
    url = f"sqlite:///{tmp_path / 's.db'}"
    code, out, err = run(["profile", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"],
                          "--workload", str(workload), "--temperature", "0.7", "--db", url, "--json", *TINY_FLAGS], capsys)
    assert code == 0, err
    from specdec_tune.db import load_acceptance, load_traces

    db = open_database(url)
    (rec,) = load_acceptance(db, 1, mode="sampling")
    assert rec.temperature == 0.7 and rec.cycles > 0 and 0 < rec.one_minus_tv <= 1
    assert load_traces(db, 1, tiny_model_dirs["draft"], "sampling")
    code, out, _ = run(["predict", "--run", "1", "-N", "3", "--temperature", "0.7", "--db", url, "--json"], capsys)
    assert code == 0 and json.loads(out)["mode"] == "sampling" and json.loads(out)["source"] == "sampling_traces"
    code, out, _ = run(["measure", "--run", "1", "-N", "3", "--temperature", "0.7", "--db", url, "--json"], capsys)
    obj = json.loads(out)
    assert code == 0 and obj["temperature"] == 0.7 and obj["tokens_per_s"] > 0 and obj["predicted_tokens_per_s"] > 0
    code, _, err = run(["measure", "--run", "1", "-N", "3", "--temperature", "0.5", "--db", url], capsys)
    _one_line_error(code, err, "--temperature 0.7")
