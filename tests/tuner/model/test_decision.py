"""Nothing ships unmeasured: each server's pick is measured held out, and its file carries it only when the
speedup's 95% CI lower bound is at least 1; the README states what the files carry.

The measurement is replaced by a synthetic one (each configuration a known speed factor over plain decoding,
per-prompt and per-pass noise), so the confirmation logic runs in milliseconds; `tests/cli/test_tune.py`
runs the same path on real tiny models.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specdec_tune.core.stats import RateSamples
from specdec_tune.tuner.model import NGRAM, Candidate, Scored, ServerDecision, TuningResult, decide, decisions
from specdec_tune.tuner.search import _confirm
from specdec_tune.tuner.servers import write_exports
from tests.support.readme_check import mismatches, read_files, readme_section

HEUR = Candidate("mini-draft-2l", 6, schedule="heuristic")  # HF only (heuristic schedule)
THETA = Candidate("mini-draft-1l", 6, 0.3)  # llama.cpp only (θ, rule before)
THETA_LESS = Candidate("mini-draft-1l", 5, 0.2)  # llama.cpp only, slower than THETA
CONST = Candidate("mini-draft-1l", 8)  # every server; vLLM's, SGLang's and TensorRT-LLM's best
PLAIN = Candidate("none", 0)


# ------------------------------------------------------------------------------------------ the rule


@pytest.mark.parametrize("ci, verdict", [((1.0, 1.2), "speculate"), ((1.05, 1.3), "speculate"),
                                         ((0.999, 1.2), "plain"), ((0.7, 0.9), "plain")])
def test_decide_ships_only_a_ci_lower_bound_of_at_least_one(ci, verdict):
    got, why = decide(CONST, (ci[0] + ci[1]) / 2, ci)
    assert got == verdict
    assert f"95% CI {ci[0]:.2f}–{ci[1]:.2f}" in why and "held-out" in why  # the reason carries the numbers
    if verdict == "plain":
        assert "lower bound is below 1" in why


def test_decide_refuses_what_was_not_measured_held_out():
    assert decide(CONST, None, None)[0] == "plain"
    assert decide(CONST, 1.3, (1.2, 1.4), heldout=False) == ("plain", f"{CONST.label()} was measured on tuning "
                                                                      "prompts only, not held out")
    assert decide(CONST, 1.3, (float("nan"), 1.4))[0] == "plain"
    assert decide(PLAIN, 1.0, (1.0, 1.0))[0] == "plain"


def test_a_decision_round_trips_and_older_entries_have_none():
    d = ServerDecision("vllm", CONST, "plain", "why", speedup=0.98, speedup_ci=(0.9, 1.05), heldout=True,
                       per_batch_size={1: 8, 4: 3})
    back = ServerDecision.from_dict(json.loads(json.dumps(d.to_dict())))
    assert back == d and back.shipped == PLAIN and not back.speculates
    assert Candidate.from_dict(d.to_dict()) == CONST  # older readers of best_per_server see the configuration
    old = {**CONST.to_dict(), "predicted_tokens_per_s": 114.4}
    r = TuningResult(HEUR, "any", "t", "w", best_per_server={"vllm": old, "hf": d.to_dict() | {"server": "hf"}})
    assert set(decisions(r)) == {"hf"}


# ------------------------------------------------------------------------------ synthetic measurement

FACTORS = {  # true speed over plain decoding on (tuning, held-out) prompts
    HEUR: (1.30, 1.30), THETA: (1.25, 1.25), THETA_LESS: (1.20, 1.20), CONST: (1.10, 1.00), PLAIN: (1.0, 1.0),
}


def _fake_measure(calls: list, factors=FACTORS, noise: float = 0.04):
    """A stand-in for ``measure_predicted``: per prompt and pass, seconds = the prompt's base seconds × a
    pass factor (shared by every configuration: interleaved) × noise ÷ the configuration's speed factor."""
    def measure(db, run_id, items, *, split, max_prompts, repeats, **_):
        calls.append((split, [(d, c.spec.num_speculative_tokens, c.spec.threshold, c.spec.schedule) for d, c in items]))
        rng = np.random.default_rng(len(calls))
        prompts, col = max_prompts, 0 if split == "tune" else 1
        base = rng.uniform(0.3, 0.8, size=prompts)
        passes = rng.uniform(0.9, 1.1, size=repeats)
        out = []
        for draft, config in items:
            c = PLAIN if config.spec.num_speculative_tokens == 0 else Candidate(
                draft, config.spec.num_speculative_tokens, config.spec.threshold, config.spec.threshold_rule, config.spec.schedule)
            f = factors[c][col]
            secs = base[:, None] * passes[None, :] * rng.normal(1, noise, size=(prompts, repeats)) / f
            samples = RateSamples(tuple(f"{split}{i}" for i in range(prompts)),
                                  tuple((48,) * repeats for _ in range(prompts)), tuple(tuple(row) for row in secs))
            m = SimpleNamespace(tokens_per_s=samples.tokens_per_s, samples=samples)
            prediction = SimpleNamespace(tokens_per_s=100 * f, speedup=f, machine_speed=1.0)
            out.append(SimpleNamespace(measurement=m, prediction=prediction,
                                       ci95=(90.0, 110.0), in_sample=False))
        return out

    return measure


@pytest.fixture
def confirmed(monkeypatch):
    calls: list = []
    monkeypatch.setattr("specdec_tune.tuner.search._validate.measure_predicted", _fake_measure(calls))
    score = lambda c, tps: Scored(c, tps, tps / 100, 3.0, "simulation")  # noqa: E731
    bests = {"vllm": score(CONST, 114.4), "sglang": score(CONST, 114.4), "trtllm": score(CONST, 114.4),
             "llamacpp": score(THETA_LESS, 120.0), "hf": score(HEUR, 125.0)}
    top = [score(HEUR, 125.0), score(THETA, 119.0)]
    conf = _confirm.confirm(None, 1, top, bests, measure_prompts=8, heldout_prompts=16, temperature=0.0, repeats=3,
                            seed=0, progress=None, threads=None)
    return conf, bests, calls


def test_every_servers_best_is_measured_once_then_held_out_with_plain_decoding(confirmed):
    conf, bests, calls = confirmed
    (split1, tuning), (split2, heldout) = calls
    assert split1 == "tune" and split2 == "holdout"
    # the confirmation set: the search's top, each server's best (CONST once for three servers), plain last
    assert tuning == [("mini-draft-2l", 6, 0.0, "heuristic"), ("mini-draft-1l", 6, 0.3, "constant"),
                      ("mini-draft-1l", 8, 0.0, "constant"), ("mini-draft-1l", 5, 0.2, "constant"),
                      (None, 0, 0.0, "constant")]
    # picks: the best measured each server can express (llama.cpp's measured pick beats its predicted best)
    assert conf.winner.candidate == HEUR
    assert {s: m.candidate for s, m in conf.picks.items()} == {
        "vllm": CONST, "sglang": CONST, "trtllm": CONST, "llamacpp": THETA, "hf": HEUR}
    # held out: the winner and each distinct pick once, with plain decoding, in one interleaved call
    assert heldout == [("mini-draft-2l", 6, 0.0, "heuristic"), ("mini-draft-1l", 8, 0.0, "constant"),
                       ("mini-draft-1l", 6, 0.3, "constant"), (None, 0, 0.0, "constant")]


def test_a_pick_whose_heldout_ci_reaches_below_one_is_replaced_by_plain_decoding(confirmed):
    conf, bests, _ = confirmed
    decided = _confirm.server_decisions(conf, bests, lambda c: {1: c.num_speculative_tokens, 4: 2})
    for s in ("vllm", "sglang", "trtllm"):  # CONST: 1.10× on the tuning prompts, 1.00× held out
        d = decided[s]
        assert d.candidate == CONST and d.heldout and d.speedup_ci[0] < 1.0 <= d.speedup_ci[1]
        assert not d.speculates and d.shipped == PLAIN and "lower bound is below 1" in d.reason
    for s, c in (("hf", HEUR), ("llamacpp", THETA)):
        d = decided[s]
        assert d.speculates and d.shipped == c and d.speedup_ci[0] >= 1.0 and d.speedup == pytest.approx(
            FACTORS[c][1], rel=0.05)
        assert d.per_batch_size == {1: c.num_speculative_tokens, 4: 2}
    assert "llamacpp" in decided and "measured slower" in decided["llamacpp"].selected  # its predicted best lost


# ------------------------------------------------------------------------------------------- exports


def _result(decided: dict[str, ServerDecision], winner: Candidate = HEUR) -> TuningResult:
    return TuningResult(candidate=winner, server="any", target="mini-target", workload="functions",
                        hardware="cpu", draft_path="/models/mini-draft-2l", target_path="/models/target",
                        per_batch_size={1: 11, 4: 3}, measured_tokens_per_s=130.0, predicted_tokens_per_s=128.0,
                        baseline_tokens_per_s=100.0, speedup=1.3, speedup_ci=(1.2, 1.4), heldout=True,
                        best_per_server={s: d.to_dict() for s, d in decided.items()})


def _decision(server: str, c: Candidate, ci: tuple[float, float], per_b=None) -> ServerDecision:
    speedup = (ci[0] + ci[1]) / 2
    verdict, why = decide(c, speedup, ci)
    return ServerDecision(server, c, verdict, why, "the best measured", 114.4, 1.14, 100 * speedup, 100.0, speedup,
                          ci, True, per_b if per_b is not None else {1: c.num_speculative_tokens, 4: 3, 16: 0})


@pytest.mark.parametrize("lower", [0.97, 1.02])
def test_a_server_file_carries_its_pick_only_with_a_ci_lower_bound_of_at_least_one(tmp_path, lower):
    decided = {s: _decision(s, CONST, (lower, lower + 0.2)) for s in ("vllm", "sglang", "trtllm")}
    decided["hf"] = _decision("hf", HEUR, (1.2, 1.4))
    write_exports(_result(decided), ["all"], tmp_path)
    files = read_files(tmp_path)
    launch = (tmp_path / "vllm" / "launch.sh").read_text().splitlines()[-1]  # the command line
    text = (tmp_path / "README.md").read_text()
    sec = readme_section(text, "vllm")
    if lower < 1:  # plain decoding, and the README says why with the numbers
        assert files["vllm"] == files["sglang"] == files["trtllm"] == {"plain": True}
        assert "--speculative" not in launch and "--speculative" not in (tmp_path / "sglang/launch.sh").read_text(
            ).splitlines()[-1]
        assert "- configuration: **plain decoding**" in sec and f"95% CI {lower:.2f}–{lower + 0.2:.2f}" in sec
        assert "lower bound is below 1" in sec and CONST.label() in sec
    else:
        assert files["vllm"]["n"] == 8 and not files["vllm"]["plain"] and "--speculative-config" in launch
        assert f"- configuration: **{CONST.label()}**" in sec and "decision: speculate" in sec
    assert files["hf"]["n"] == 6 and files["hf"]["schedule"] == "heuristic"  # HF's pick is 1.3×: it ships
    # llama.cpp has no decision in this result: the winner cannot run there (heuristic) and nothing else was
    # recorded, so it is not written, and the README says why
    assert "llamacpp" not in files and "- llamacpp:" in text
    assert mismatches(tmp_path) == []


def test_a_study_result_without_decisions_is_guarded_by_the_winners_own_ci(tmp_path):
    r = TuningResult(candidate=CONST, server="vllm", target="t", workload="w", measured_tokens_per_s=99.0,
                     baseline_tokens_per_s=100.0, speedup=0.99, speedup_ci=(0.93, 1.05), heldout=True)
    write_exports(r, ["vllm", "hf"], tmp_path)
    assert read_files(tmp_path) == {"vllm": {"plain": True}}  # HF's plain decoding needs no file
    assert mismatches(tmp_path) == []
    assert "lower bound is below 1" in (tmp_path / "README.md").read_text()


# --------------------------------------------------------------------------- README against the files


def _decided_all() -> dict[str, ServerDecision]:
    return {"vllm": _decision("vllm", CONST, (1.05, 1.2), {1: 11, 4: 3, 16: 0}),  # B=1 takes the config's N: 8
            "sglang": _decision("sglang", CONST, (1.05, 1.2)),
            "trtllm": _decision("trtllm", Candidate(NGRAM, 5), (1.1, 1.3), {1: 5, 8: 2}),
            "llamacpp": _decision("llamacpp", THETA, (1.1, 1.3)),
            "hf": _decision("hf", HEUR, (0.95, 1.3))}


def test_the_readme_states_what_each_file_carries(tmp_path):
    write_exports(_result(_decided_all()), ["all"], tmp_path)
    assert mismatches(tmp_path) == []
    vllm = json.loads((tmp_path / "vllm" / "speculative_config.json").read_text())
    assert vllm["num_speculative_tokens_per_batch_size"][0] == [1, 3, 8]
    assert "B=1: 8" in readme_section((tmp_path / "README.md").read_text(), "vllm")
    assert "hf" not in read_files(tmp_path)  # HF's pick reached below 1: plain decoding needs no file
    assert "- configuration: **plain decoding**" in readme_section((tmp_path / "README.md").read_text(), "hf")


def _render_winner_everywhere(monkeypatch):
    """The old bug: every section rendered from the overall winner, not from what its files were built from."""
    from specdec_tune.tuner.servers import _readme

    real = _readme._file_section
    monkeypatch.setattr(_readme, "_file_section", lambda s: real(
        s.__class__(s.fmt, s.result.__class__(**{**s.result.__dict__, "candidate": _result({}).candidate}),
                    s.decision, s.note, s.files)))


def _raw_model_schedule(monkeypatch):
    """The other old bug: the per-batch-size N of the model (B=1 → 11) next to a file that starts at 8."""
    from specdec_tune.tuner.servers import _readme

    monkeypatch.setattr(_readme, "schedule_points", lambda r: dict(sorted(r.per_batch_size.items())))


def _edited_file(tmp_path: Path):
    f = tmp_path / "sglang" / "flags.txt"
    f.write_text(f.read_text().replace("--speculative-num-draft-tokens\n9", "--speculative-num-draft-tokens\n10"))


@pytest.mark.parametrize("plant", ["winner everywhere", "raw model schedule", "edited file"])
def test_the_readme_check_catches_a_planted_mismatch(tmp_path, monkeypatch, plant):
    if plant == "winner everywhere":
        _render_winner_everywhere(monkeypatch)
    elif plant == "raw model schedule":
        _raw_model_schedule(monkeypatch)
    write_exports(_result(_decided_all()), ["all"], tmp_path)
    if plant == "edited file":
        _edited_file(tmp_path)
    bad = mismatches(tmp_path)
    assert bad, plant
    expected = {"winner everywhere": "sglang: n is 8 in the files, 6 in the README",
                "raw model schedule": "vllm: B=1 takes N=8 in the files, 11 in the README",
                "edited file": "sglang: n is 9 in the files, 8 in the README"}[plant]
    assert expected in bad, bad


@pytest.mark.parametrize("ci, ships", [((0.96, 1.3), False), ((1.04, 1.3), True)])
def test_tune_backend_vllm_decides_from_its_own_heldout_ci(tmp_path, ci, ships):
    """``tune --backend vllm``: the vLLM file's decision comes from the winner's held-out CI measured on vLLM."""
    from specdec_tune.tuner.search._tune import _vllm_decision

    r = TuningResult(candidate=CONST, server="vllm", target="mini-target", workload="w", per_batch_size={1: 8, 4: 3},
                     measured_tokens_per_s=110.0, baseline_tokens_per_s=100.0, speedup=1.1, speedup_ci=ci, heldout=True)
    r.best_per_server = {"vllm": _vllm_decision(r).to_dict()}
    write_exports(r, ["vllm"], tmp_path)
    assert read_files(tmp_path)["vllm"] == ({"plain": False, "n": 8, "theta": 0.0, "schedule": "constant",
                                             "per_b": {b: 8 if b < 4 else 3 for b in range(1, 5)},
                                             "draft": read_files(tmp_path)["vllm"].get("draft")} if ships else
                                            {"plain": True})
    assert mismatches(tmp_path) == []
