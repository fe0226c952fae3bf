"""Small but legal settings end to end through the real CLI (issue 35, rows 3 and 5): every run either finishes
(exit 0), saying which statistic it could not compute and why, or is refused before it profiles (exit 2, one
`error:` line, no run stored)."""
from __future__ import annotations

import json

import pytest

from specdec_tune.cli import main
from specdec_tune.db import list_measured, list_runs, open_database
from specdec_tune.core.latency import LatencySamples

PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
           "x = [i for i in range(3)]", "return a + b", "self.x = x"]


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def workload(folder, n: int) -> str:
    path = folder / f"w{n}.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(PROMPTS[:n])))
    return str(path)


@pytest.mark.slow
def test_measure_where_some_requests_arrive_in_one_chunk(tiny_model_dirs, tmp_path, capsys):
    """Row 3: with --max-new-tokens 8 and N = 8 a request whose 8 tokens are all accepted arrives in one
    chunk and has no chunk gap; the gaps' bootstrap then drew resamples of such requests only and crashed
    (IndexError in latency._pooled_ci) after the whole measurement. Synthetic acceptance 0.9 makes some
    prompts arrive in one chunk and some in several, as the bundled mini models did."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    code, _, err = run(["profile", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"],
                        "--workload", workload(tmp_path, 8), "--db", url, "--device", "cpu", "--repeats", "1",
                        "--k-max", "9", "--n-max", "8", "--max-prompts", "2", "--max-new-tokens", "8",
                        "--context-lens", "8", "--synthetic-acceptance", "0.9"], capsys)
    assert code == 0, err
    code, out, err = run(["measure", "--run", "1", "-N", "8", "--split", "all", "--repeats", "1", "--db", url,
                          "--json"], capsys)
    assert code == 0, err
    db = open_database(url)
    row = next(m for m in list_measured(db, 1) if m.config.get("num_speculative_tokens") == 8 and m.latency)
    requests = LatencySamples.from_json(row.latency["requests"]).requests
    chunks = [len(r.tokens) for prompt in requests for r in prompt]
    assert min(chunks) == 1 and max(chunks) > 1, chunks  # the case of row 3: some requests have no chunk gap
    gaps = json.loads(out)["latency"]["measured"]["chunk_gap_s"]
    for entry in gaps.values():
        assert entry["value"] is not None and (entry["ci"] is not None or "prompt" in entry["why"]), entry


# --------------------------------------------------------------------------- tune at the edges of its flags

TUNE = ("--device", "cpu", "--profile-repeats", "1", "--n-max", "3", "--measure-top", "1", "--batch-sizes", "1",
        "--trials", "2", "--json")


def _tune(tiny_model_dirs, folder, prompts: int, max_prompts, measure_prompts, heldout_prompts, max_new_tokens,
          repeats, *extra) -> list[str]:
    return ["tune", "--target", tiny_model_dirs["target"], "--drafts", f"{tiny_model_dirs['draft']},ngram",
            "--workload", workload(folder, prompts), "--db", f"sqlite:///{folder / 'r.db'}", *TUNE,
            "--max-prompts", str(max_prompts), "--measure-prompts", str(measure_prompts),
            "--heldout-prompts", str(heldout_prompts), "--max-new-tokens", str(max_new_tokens), "--repeats", str(repeats),
            *extra]


def _refused_before_profiling(folder, code: int, out: str, err: str, *words: str) -> None:
    """Exit 2, one `error:` line (no progress: nothing was loaded or measured), no run and no study stored."""
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert all(w in err for w in words), err
    db = folder / "r.db"
    assert not db.exists() or list_runs(open_database(f"sqlite:///{db}")) == []
    assert not (folder / "r-studies.db").exists()


# (workload prompts, --max-prompts, --measure-prompts, --heldout-prompts, --max-new-tokens, --repeats, what it names)
REFUSED = [
    pytest.param(1, 2, 2, 2, 8, 1, ("has 1 prompt", "0 held out"), id="row5-one-prompt"),
    pytest.param(2, 1, 1, 2, 2, 2, ("has 2 prompts", "1 for tuning", "1 held out"), id="two-prompts"),
    pytest.param(3, 99, 99, 99, 8, 1, ("has 3 prompts", "2 for tuning", "1 held out"), id="three-prompts-caps"),
    pytest.param(8, 2, 2, 1, 8, 1, ("--heldout-prompts 1", "held-out split has 4"), id="heldout-1"),
]


@pytest.mark.parametrize("prompts, max_p, measure_p, heldout_p, new_tokens, repeats, words", REFUSED)
def test_tune_refuses_what_it_cannot_finish_before_profiling(tiny_model_dirs, tmp_path, capsys, prompts, max_p,
                                                              measure_p, heldout_p, new_tokens, repeats, words):
    """Row 5: a one-prompt workload was refused only after 85 s of profiling, with a profile run left stored.
    A held-out speedup's CI needs 2 held-out prompts, and what every server's file carries rests on it."""
    code, out, err = run(_tune(tiny_model_dirs, tmp_path, prompts, max_p, measure_p, heldout_p, new_tokens, repeats),
                         capsys)
    _refused_before_profiling(tmp_path, code, out, err, *words)


def test_tune_refuses_a_tpot_slo_on_one_token_requests(tiny_model_dirs, tmp_path, capsys):
    code, out, err = run(_tune(tiny_model_dirs, tmp_path, 8, 2, 2, 2, 1, 1, "--slo-tpot-ms", "50"), capsys)
    _refused_before_profiling(tmp_path, code, out, err, "--slo-tpot-ms needs --max-new-tokens >= 2")


FINISHED = [
    pytest.param(4, 1, 1, 2, 1, 1, id="every-minimum"),
    pytest.param(4, 99, 99, 99, 2, 2, id="more-than-the-workload-has"),
    pytest.param(5, 1, 2, 99, 2, 1, id="five-prompts"),
    pytest.param(8, 99, 1, 2, 8, 2, id="one-measured-prompt"),
]


@pytest.mark.slow
@pytest.mark.parametrize("prompts, max_p, measure_p, heldout_p, new_tokens, repeats", FINISHED)
def test_tune_finishes_at_the_edges_and_says_what_it_could_not_compute(tiny_model_dirs, tmp_path, capsys, prompts,
                                                                       max_p, measure_p, heldout_p, new_tokens, repeats):
    code, out, err = run(_tune(tiny_model_dirs, tmp_path, prompts, max_p, measure_p, heldout_p, new_tokens, repeats),
                         capsys)
    assert code == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["heldout"] is True and report["speedup_ci"] is not None  # >= 2 held-out prompts: a decision
    notes = " | ".join(report["notes"])
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    (profiled,) = list_runs(db)
    tuning = (prompts + 1) // 2  # even positions
    assert len(profiled.settings.prompt_ids) == min(max_p, tuning)  # a cap beyond the workload takes it all
    confirmed = {m.config["prompts"] for m in list_measured(db, profiled.id) if m.config.get("split") == "tune"}
    assert confirmed == {min(measure_p, tuning)}
    one_prompt = "no 95% CIs on the tuning prompts" in notes
    assert one_prompt == (confirmed == {1}), notes  # said exactly when it happened ...
    assert all((row["measured_ci"] is None) == one_prompt for row in report["confirmation"]), report["confirmation"]
    assert ("no TPOT" in notes) == (new_tokens == 1), notes  # ... and so is a one-token request's missing TPOT
    for flag, value in (("--max-prompts", max_p), ("--measure-prompts", measure_p), ("--heldout-prompts", heldout_p)):
        assert (f"{flag} {value}: the workload's" in notes) == (value == 99), notes  # a cap beyond the workload


# --------------------------------------------------------------------------- profile and measure, the same checks


def test_profile_and_measure_refuse_an_empty_split_before_loading(tiny_model_dirs, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    one = workload(tmp_path, 1)
    profile = ["profile", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"], "--workload", one,
               "--db", url, "--device", "cpu", "--repeats", "1", "--k-max", "3", "--n-max", "2", "--context-lens", "8"]
    code, out, err = run([*profile, "--split", "holdout"], capsys)
    _refused_before_profiling(tmp_path, code, out, err, "--split holdout", "has 1 prompt", "has none")
    code, out, err = run([*profile, "--split", "0:2"], capsys)
    _refused_before_profiling(tmp_path, code, out, err, "--split 0:2", "only 1 prompts")
    # the smallest legal profile: one prompt (of 1), one new token, one repeat, more prompts asked than there are
    code, _, err = run([*profile, "--max-prompts", "99", "--max-new-tokens", "1"], capsys)
    assert code == 0, err
    db = open_database(url)
    code, out, err = run(["measure", "--run", "1", "-N", "2", "--db", url], capsys)  # default: the held-out half
    assert code == 2 and out == "" and err.count("\n") == 1 and "held-out split (odd positions) has none" in err, err
    assert list_measured(db, 1) == [m for m in list_measured(db, 1) if m.draft is None]  # the profile's baseline only
    code, out, err = run(["measure", "--run", "1", "-N", "2", "--split", "tune", "--max-prompts", "99",
                          "--repeats", "1", "--db", url, "--json"], capsys)
    assert code == 0, err
    obj = json.loads(out)
    assert obj["prompts"] == 1 and obj["ci95"] is None and "from 1 prompt" in obj["ci95_why"]
    tpot = obj["latency"]["measured"]["tpot_s"]["p50"]
    assert tpot["value"] is None and tpot["why"].startswith("no request emitted 2 or more tokens")
    assert obj["latency"]["predicted"]["tpot_p50_s"] is None  # one token: no TPOT predicted either


def test_energy_with_one_pass_finishes_with_a_note():
    """Energy per token's CI is over passes (profiler.energy): one repeat leaves it without one, said up front."""
    from specdec_tune.tuner.search import TuneRequest, check_prompts

    req = TuneRequest("t", ("d",), "w.jsonl", objective="energy", repeats=1, heldout_prompts=2)
    assert "--repeats 1: energy per token has no 95% CI" in " | ".join(check_prompts(req, 8))
    assert not any("energy" in n for n in check_prompts(TuneRequest("t", ("d",), "w.jsonl", repeats=1), 8))
