"""``regress --retune`` (tuning drift) on tiny saved models.

A study tuned with ``tune`` is re-tuned on a fresh profile, warm-started from its best trials; the
report, JSON and JUnit carry whether the best configuration moved and what the old one loses now,
and the exit code stays the regression run's own. Power: a planted slowdown (a sleep before every
forward of one model, the same kind of planted change as ``draft_delay_ms``) makes the old winner
wrong, and the re-tune must say it moved and measure the old winner slower.
"""
from __future__ import annotations

import json
import math
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from specdec_tune.cli import main

PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
           "x = [i for i in range(3)]", "return a + b", "self.x = x"]


def _workload(root: Path) -> str:
    path = root / "w.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return str(path)


def _tune(flags: tuple[str, ...], target: str, drafts: str, wl: str, root: Path, storage: str, study: str,
          trials: int = 8) -> None:
    code = main(["tune", "--target", target, "--drafts", drafts, "--workload", wl, "--db", f"sqlite:///{root / 't.db'}",
                 "--storage", storage, "--study", study, "--server", "vllm", "--trials", str(trials), "--json", *flags])
    assert code == 0


def _slow_forward(monkeypatch, folder: str, seconds: float) -> None:
    """Planted slowdown: every forward of the model loaded from ``folder`` sleeps ``seconds`` first
    (profile and measurement alike, as a slower machine would)."""
    from specdec_tune.engine import loading

    real = loading.wrap_forward

    def wrap(model, forward="auto", *args):
        out = real(model, forward, *args)
        if Path(model.name_or_path).resolve() == Path(folder).resolve():
            out.register_forward_pre_hook(lambda *_: time.sleep(seconds))
        return out

    monkeypatch.setattr(loading, "wrap_forward", wrap)


@pytest.fixture(scope="module")
def tuned(tiny_model_dirs, tune_flags, tmp_path_factory):
    root = tmp_path_factory.mktemp("drift")
    wl = _workload(root)
    storage = f"sqlite:///{root / 'studies.db'}"
    _tune(tune_flags, tiny_model_dirs["target"], f"{tiny_model_dirs['draft']},ngram", wl, root, storage, "old")
    return root, wl, storage, tiny_model_dirs


@pytest.mark.slow
def test_retune_warm_starts_from_the_study_and_reports_drift(tuned, capsys):
    import optuna
    from optuna.trial import TrialState

    from specdec_tune.tuner.model import TuningResult
    from specdec_tune.tuner.regress._drift import WARM_START_TRIALS

    root, wl, storage, dirs = tuned
    capsys.readouterr()
    suite = root / "suite.toml"
    suite.write_text(f'name = "drift"\nthreads = 1\n[[benchmark]]\nname = "winner"\ntarget = "{dirs["target"]}"\n'
                     f'workload = "{wl}"\nprompts = 4\nmax_new_tokens = 8\nrepeats = 2\nstudy = "old"\n'
                     f'study_storage = "{storage}"\n')
    junit, md = root / "j.xml", root / "r.md"
    code = main(["regress", "--suite", str(suite), "--db", f"sqlite:///{root / 't.db'}", "--retune",
                 "--retune-trials", "12", "--json", "--junit", str(junit), "--report-md", str(md)])
    cap = capsys.readouterr()
    out = json.loads(cap.out.strip().splitlines()[-1])
    assert code == 3 and out["exit_code"] == 3  # first run: no baseline; the drift check leaves the exit code alone
    (d,) = out["drift"]
    assert d["benchmark"] == "winner" and d["study"] == "old" and d["new_study"] == f"old/retune-{out['run_id']}"
    assert d["old_measured_tokens_per_s"] > 0 and d["plain_measured_tokens_per_s"] > 0
    assert d["old_predicted_tokens_per_s"] > 0 and d["new_predicted_tokens_per_s"] > 0
    old = optuna.load_study(study_name="old", storage=storage)
    new = optuna.load_study(study_name=d["new_study"], storage=storage)
    # the winners are the two studies' stored results, and "moved" says whether they differ
    old_winner = TuningResult.from_dict(old.user_attrs["result"]).candidate
    new_winner = TuningResult.from_dict(new.user_attrs["result"]).candidate
    assert d["old"] == old_winner.to_dict() and d["new"] == new_winner.to_dict()
    assert d["moved"] is (old_winner != new_winner)
    assert (d["loss_ci"] is not None) == d["moved"] and (d["moved"] or d["loss"] == 0.0)
    # warm start: the new study's first trials were enqueued (fixed parameters, not sampled) with the
    # old study's best distinct parameters, best first
    best_value: dict[tuple, float] = {}
    for t in old.trials:
        if t.state == TrialState.COMPLETE:
            key = tuple(sorted(t.params.items()))
            best_value[key] = max(best_value.get(key, -math.inf), t.value)
    k = min(WARM_START_TRIALS, 12, len(best_value))
    assert d["enqueued"] == k >= 2
    first = new.trials[:k]
    assert all(t.system_attrs.get("fixed_params") == t.params for t in first)
    keys = [tuple(sorted(t.params.items())) for t in first]
    assert len(set(keys)) == k and set(keys) <= set(best_value)
    values = [best_value[key] for key in keys]
    assert values == sorted(best_value.values(), reverse=True)[:k]  # the k best, in order
    assert not any(t.system_attrs.get("fixed_params") for t in new.trials[k:])
    assert k < len(new.trials) <= 12 and all(t.state.is_finished() for t in new.trials)  # none left waiting
    assert new.user_attrs["result"] and new.user_attrs["tune"]["request"]["trials"] == 12
    assert d["run_id"] != old.user_attrs["tune"]["run_id"]  # a fresh profile (the stored one matches)
    cases = [c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == "tuning_drift"]
    assert len(cases) == 1 and cases[0].find("failure") is None and cases[0].get("classname") == "drift.winner"
    props = {p.get("name"): p.get("value") for p in cases[0].iter("property")}
    assert props["moved"] == str(d["moved"]) and props["old"] == d["old_label"] and props["loss"].endswith("%")
    assert "## Tuning drift" in md.read_text() and d["new_study"] in md.read_text()


@pytest.mark.slow
def test_a_planted_slowdown_moves_the_optimum_and_the_old_winner_measures_slower(tiny_model_dirs, tune_flags,
                                                                                  tmp_path, monkeypatch):
    """Tuned with a slow target and a fast identical draft (speculation pays), re-tuned with that
    draft slow and the target fast (it does not): the winner must move and the old one lose."""
    import optuna

    from specdec_tune.db import open_database
    from specdec_tune.tuner.model import TuningResult
    from specdec_tune.tuner.regress import retune

    twin = str(shutil.copytree(tiny_model_dirs["target"], tmp_path / "twin"))  # acceptance ~1
    wl, storage = _workload(tmp_path), f"sqlite:///{tmp_path / 's.db'}"
    with monkeypatch.context() as m:
        _slow_forward(m, tiny_model_dirs["target"], 0.01)
        _tune(tune_flags, tiny_model_dirs["target"], twin, wl, tmp_path, storage, "slow-target")
    old = TuningResult.from_dict(optuna.load_study(study_name="slow-target", storage=storage).user_attrs["result"])
    assert old.candidate.drafter == twin and old.candidate.num_speculative_tokens >= 2, old  # the plant holds
    _slow_forward(monkeypatch, twin, 0.02)
    d = retune(open_database(f"sqlite:///{tmp_path / 't.db'}"), "b", "slow-target", storage, 6, run_id=7).to_dict()
    assert d["moved"] is True and d["new_study"] == "slow-target/retune-7"
    assert d["old_measured_tokens_per_s"] < d["new_measured_tokens_per_s"]
    assert d["loss"] < -0.3 and d["loss_ci"][1] < 0, d  # the old winner now loses, CI clear of zero
    assert d["old_predicted_tokens_per_s"] < d["new_predicted_tokens_per_s"]
    assert d["text"].startswith("best configuration moved:")


def test_drift_text_says_what_the_old_winner_loses():
    from specdec_tune.tuner.model import Candidate
    from specdec_tune.tuner.regress import Drift

    d = Drift("b", "s", "s/retune-1", Candidate("d", 4).to_dict(), Candidate("d", 6).to_dict(), True, 90.0, 97.0,
              50.0, 90.0 / 97.0 - 1, (-0.11, -0.031), 95.0, 99.0, 5, 1)
    assert d.loss_text() == "-7.2% (CI -11.0..-3.1%)"
    assert d.text().startswith("best configuration moved: d N=4 → d N=6; the old one loses -7.2% (CI -11.0..-3.1%)")
    same = Drift("b", "s", "s/retune-1", Candidate("d", 4).to_dict(), Candidate("d", 4).to_dict(), False, 90.0, 90.0,
                 50.0, 0.0, None, 95.0, 95.0, 5, 1)
    assert same.text().startswith("best configuration unchanged: d N=4") and same.loss_text() == "+0.0%"


def test_retune_without_a_study_is_a_notice_and_a_missing_study_one_line(tmp_path, tiny_model_dirs):
    from specdec_tune.core.errors import NotFoundError
    from specdec_tune.tuner.regress import load_suite, retune, run_drift

    suite = tmp_path / "s.toml"
    suite.write_text(f'name = "x"\n[[benchmark]]\nname = "a"\ntarget = "{tiny_model_dirs["target"]}"\n'
                     f'workload = "functions"\nnum_speculative_tokens = 2\ndraft = "ngram"\n')
    rows, notes = run_drift(load_suite(suite), None, 5)
    assert rows == [] and len(notes) == 1 and "nothing to re-tune" in notes[0]
    with pytest.raises(NotFoundError, match="cannot load study 'nope'"):
        retune(None, "a", "nope", f"sqlite:///{tmp_path / 'empty.db'}", 5)


@pytest.mark.slow
def test_a_study_without_a_stored_request_falls_back_to_its_profile_run(tuned, tmp_path):
    import optuna

    from specdec_tune.db import open_database
    from specdec_tune.core.errors import NotFoundError
    from specdec_tune.tuner.regress._drift import _old_request

    root, _, storage, _ = tuned
    attrs = optuna.load_study(study_name="old", storage=storage).user_attrs["tune"]
    older = {k: v for k, v in attrs.items() if k != "request"}  # as tuned before the request was stored
    got = _old_request(open_database(f"sqlite:///{root / 't.db'}"), "old", older)
    for key in ("target", "drafts", "workload", "server", "temperature", "batch_sizes", "n_max", "max_prompts",
                "max_new_tokens", "profile_repeats", "seed", "device"):
        assert got[key] == attrs["request"][key], key
    with pytest.raises(NotFoundError, match="stores no tune request"):
        _old_request(open_database(f"sqlite:///{tmp_path / 'other.db'}"), "old", older)
