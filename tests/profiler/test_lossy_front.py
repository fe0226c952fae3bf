"""``profile --temperature``: teacher-forced positions and the lossy rejection–bias front are stored."""
from __future__ import annotations

import pytest

from specdec_tune.db import load_bias_front, load_teacher_forced, open_database


@pytest.fixture(scope="module")
def sampled_run(tiny_model_dirs, tmp_path_factory):
    """One sampling profile of the tiny pair (4 prompts, 16 new tokens, front on 2 prompts)."""
    from specdec_tune.profiler.session import ProfileSettings, run_profile

    root = tmp_path_factory.mktemp("lossy_profile")
    workload = root / "w.jsonl"
    workload.write_text("".join(f'{{"id": "{i}", "prompt": "def f{i}(a, b):"}}\n' for i in range(8)))
    url = f"sqlite:///{root / 'r.db'}"
    settings = ProfileSettings(device="cpu", repeats=2, k_max=5, n_max=4, max_prompts=4, max_new_tokens=16,
                               context_lens=(8,), overhead_ns=(1,), overhead_prompts=1, temperature=1.0,
                               front_prompts=2)
    run_id = run_profile(open_database(url), tiny_model_dirs["target"], [tiny_model_dirs["draft"]], str(workload),
                         settings).run_id
    return open_database(url), run_id, tiny_model_dirs["draft"]


def test_teacher_forced_positions_cover_every_generated_token(sampled_run):
    db, run_id, draft = sampled_run
    rows = load_teacher_forced(db, run_id, draft)
    assert [r.prompt_index for r in rows] == [0, 1, 2, 3]
    assert all(len(r.one_minus_tv) == len(r.top_q) == 16 for r in rows)  # one per generated token (no EOS here)
    assert all(0 < x < 1 for r in rows for x in r.one_minus_tv) and all(0 < x <= 1 for r in rows for x in r.top_q)


def test_front_is_stored_with_theory_and_measurement(sampled_run):
    db, run_id, draft = sampled_run
    front = load_bias_front(db, run_id, draft)
    theory = {(r.method, r.epsilon): r for r in front if r.source == "theory"}
    measured = {(r.method, r.epsilon): r for r in front if r.source == "measured"}
    assert set(theory) == set(measured) and len(theory) == 14
    tv = 1 - sum(x for r in load_teacher_forced(db, run_id, draft) for x in r.one_minus_tv) / 64
    assert theory["opt", 0.0].rejection == pytest.approx(tv)  # Theorem 1: exact rejections = TV
    assert theory["opt", 0.0].bias == pytest.approx(0.0, abs=1e-12) and measured["opt", 0.0].bias < 1e-6
    assert theory["uno", 0.0].bias > 0.01 and measured["uno", 0.0].bias > 0.01  # UNO is biased even at ε = 0
    for eps in (0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3):
        t = theory["opt", eps]
        assert t.rejection + t.bias == pytest.approx(tv)  # Theorem 5: OPT lies on the front
        assert t.pareto_bias == pytest.approx(t.bias)
        assert theory["uno", eps].bias >= t.bias and theory["uno", eps].rejection == pytest.approx(t.rejection)
    assert theory["opt", 0.3].rejection < theory["opt", 0.01].rejection < theory["opt", 0.0].rejection
    assert measured["opt", 0.3].rejection < measured["opt", 0.0].rejection
    assert all(r.positions > 0 for r in front)


def test_dashboard_shows_the_stored_front(sampled_run):
    """The Profile run page's loader reads the front and its chart draws theory, measurement and Theorem 5's
    bound; the theory points of Decoding-OPT lie on that bound (the front is linear)."""
    from specdec_tune.dashboard.charts import bias_front_chart
    from specdec_tune.dashboard.profile_info import load_profile_info

    db, run_id, draft = sampled_run
    info = load_profile_info(db, run_id)
    rows = info.front(draft)
    fig = bias_front_chart(rows, draft)
    names = [t.name for t in fig.data]
    assert names[:4] == ["Decoding-OPT, theory", "Decoding-OPT, measured", "Decoding-UNO, theory",
                         "Decoding-UNO, measured"] and names[4].startswith("Theorem 5")
    tv = fig.data[4].y[0]
    for x, y in zip(fig.data[0].x, fig.data[0].y):
        assert y == pytest.approx(tv - x, abs=1e-9)
    assert all(y >= tv - x - 1e-9 for x, y in zip(fig.data[2].x, fig.data[2].y))  # UNO above the bound


def test_predict_cli_acceptance_source_and_bias(sampled_run, capsys):
    """``predict --acceptance-source tv`` labels its source; a lossy prediction prints its bias from the front;
    the tv source refuses what it cannot predict in one line."""
    import json

    from specdec_tune.cli import main

    db, run_id, _ = sampled_run
    url = db.url
    base = ["predict", "--run", str(run_id), "-N", "3", "--temperature", "1.0", "--db", url, "--json"]
    assert main(base + ["--acceptance-source", "tv"]) == 0
    tv = json.loads(capsys.readouterr().out)
    assert tv["source"] == "tv per position" and tv["acceptance_source"] == "tv" and tv["bias"] is None
    assert main(base) == 0
    traces = json.loads(capsys.readouterr().out)
    assert traces["source"] == "sampling_traces"
    assert main(base + ["--acceptance", "opt", "--epsilon", "0.1"]) == 0
    lossy = json.loads(capsys.readouterr().out)
    assert lossy["bias"]["bias"] > 0 and lossy["expected_tokens_per_cycle"] > traces["expected_tokens_per_cycle"]
    assert main(base + ["--acceptance", "opt", "--epsilon", "0.07"]) == 0  # between profiled ε: interpolated
    assert "interpolated" in json.loads(capsys.readouterr().out)["bias"]["label"]
    code = main(base + ["--acceptance-source", "tv", "--threshold", "0.3", "--threshold-kind", "cumulative"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "traces" in err[0]


@pytest.mark.slow
def test_bias_budget_search_and_export(sampled_run, tmp_path):
    """``tune --max-bias``'s search: a throughput-bias study over exact and Decoding-OPT at the profiled ε;
    its front holds exact acceptance (bias 0) and faster, biased points; a budget keeps the front's points
    within it; a lossy winner's export is refused with the reason and its bias."""
    import pytest as _pytest

    from specdec_tune.core.errors import InputError
    from specdec_tune.tuner.model import Candidate, Evaluator, TuningResult
    from specdec_tune.tuner.search import open_storage, run_search, server_search_space
    from specdec_tune.tuner.search._tune import within_budget
    from specdec_tune.tuner.servers import write_exports

    db, run_id, draft = sampled_run
    ev = Evaluator(db, run_id, "sampling")
    from dataclasses import replace
    # the model draft only (the tiny pair is slower than plain decoding, which would be the whole front)
    space = replace(server_search_space("any", [draft], 4, False, epsilons=(0.001, 0.003, 0.01, 0.03, 0.1, 0.3)),
                    thresholds=(0.0,), drafters=(draft,))
    assert {c.acceptance for c in space.candidates()} == {"exact", "opt"}
    out = run_search(ev, space, storage=open_storage(f"sqlite:///{tmp_path / 's.db'}"), study_name="b",
                     trials=space.size, objectives=("throughput", "bias"))
    front = out.pareto
    assert any(s.candidate.acceptance == "exact" and s.bias == 0 for s in front)
    assert any(s.candidate.acceptance == "opt" and s.bias > 0 for s in front)
    fastest = max(front, key=lambda s: s.predicted_tokens_per_s)
    assert fastest.bias > 0  # over-acceptance buys speed
    budget = sorted({s.bias for s in front})[1]  # (constant and heuristic N = 1 tie)
    kept = within_budget(front, budget)
    assert kept and all(s.bias <= budget for s in kept) and len(kept) < len(front)
    win = next(s for s in kept if s.bias > 0)
    result = TuningResult(candidate=win.candidate, server="any", target="t", workload="w", temperature=1.0,
                          bias={"bias": win.bias, "label": "computed at teacher-forced positions", "measured_bias": None})
    with _pytest.raises(InputError) as exc:
        write_exports(result, ["sglang"], tmp_path / "out")
    assert "accept-threshold-acc" in str(exc.value) and "bias" in str(exc.value) and not (tmp_path / "out").exists()
    assert Candidate.from_dict(win.candidate.to_dict()) == win.candidate
