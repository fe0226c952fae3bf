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
    assert set(theory) == set(measured) and len(theory) == 12
    tv = 1 - sum(x for r in load_teacher_forced(db, run_id, draft) for x in r.one_minus_tv) / 64
    assert theory["opt", 0.0].rejection == pytest.approx(tv)  # Theorem 1: exact rejections = TV
    assert theory["opt", 0.0].bias == pytest.approx(0.0, abs=1e-12) and measured["opt", 0.0].bias < 1e-6
    assert theory["uno", 0.0].bias > 0.01 and measured["uno", 0.0].bias > 0.01  # UNO is biased even at ε = 0
    for eps in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4):
        t = theory["opt", eps]
        assert t.rejection + t.bias == pytest.approx(tv)  # Theorem 5: OPT lies on the front
        assert t.pareto_bias == pytest.approx(t.bias)
        assert theory["uno", eps].bias >= t.bias and theory["uno", eps].rejection == pytest.approx(t.rejection)
    assert theory["opt", 0.4].rejection < theory["opt", 0.02].rejection < theory["opt", 0.0].rejection
    assert measured["opt", 0.4].rejection < measured["opt", 0.0].rejection
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
