"""Every dashboard page under Streamlit's AppTest, on an empty and on a filled database."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest  # streamlit is a required dependency: a missing one is a failure

from specdec_tune.cli.dashboard import APP_SCRIPT
from specdec_tune.dashboard import ui
from specdec_tune.dashboard.app import HERE
from specdec_tune.dashboard.profile_info import load_profile_info
from specdec_tune.db import open_database
from tests.support import dashboard_data

APP = str(APP_SCRIPT)  # the script `specdec-tune dashboard` runs: the dashboard with its server room wired in
PAGES = {
    "overview": ("views/overview.py", "Overview"),
    "profile": ("views/profile.py", "Profile run"),
    "why": ("views/why.py", "Why it wins"),
    "fidelity": ("views/fidelity.py", "Model vs measurement"),
    "study": ("views/study.py", "Tuning study"),
    "trends": ("views/trends.py", "Regression trends"),
}


@pytest.fixture(scope="module")
def urls(tiny_model_dirs, tmp_path_factory):
    return dashboard_data.build(tmp_path_factory.getbasetemp(), tiny_model_dirs)


def render(monkeypatch, page: str, db_url: str, storage_url: str | None) -> AppTest:
    monkeypatch.setenv("SPECDEC_DB", db_url)
    if storage_url:
        monkeypatch.setenv("SPECDEC_STORAGE", storage_url)
    else:
        monkeypatch.delenv("SPECDEC_STORAGE", raising=False)
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    if page != "overview":
        at.switch_page(str(HERE / PAGES[page][0])).run()  # pages live beside the dashboard's app.py
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == [PAGES[page][1]]
    return at


def metric(at: AppTest, label: str) -> str:
    values = [m.value for m in at.metric if m.label == label]
    assert values, f"no metric {label!r}; metrics: {[m.label for m in at.metric]}"
    return values[0]


def charts(at: AppTest) -> int:
    return len(at.get("plotly_chart"))


EMPTY_HINTS = {"overview": "specdec-tune profile", "profile": "specdec-tune profile", "why": "specdec-tune profile",
               "fidelity": "specdec-tune profile", "study": "specdec-tune tune", "trends": "specdec-tune regress"}


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_on_an_empty_database_says_what_to_run(page, monkeypatch, tmp_path):
    at = render(monkeypatch, page, f"sqlite:///{tmp_path / 'empty.db'}", None)
    assert any(EMPTY_HINTS[page] in c.value for c in at.code), [c.value for c in at.code]
    assert not at.error and charts(at) == 0


def test_overview_filled(monkeypatch, urls):
    at = render(monkeypatch, "overview", urls["db"], urls["storage"])
    # the profile's hooked baseline, and two measures, each with plain decoding in the same passes
    assert metric(at, "Profile runs") == "1" and metric(at, "Measured configurations") == "5"
    assert metric(at, "Tuning studies") == "2"
    assert [h.value for h in at.header][:4] == ["Best configuration per target, hardware, workload and server",
                                                "Latest runs", "Tuning studies", "Regression verdicts"]
    best = at.dataframe[0].value
    assert "vllm" in set(best["server"]) and "held-out" in set(best["prompts"])


def test_profile_page_filled(monkeypatch, urls):
    at = render(monkeypatch, "profile", urls["db"], urls["storage"])
    info = load_profile_info(open_database(urls["db"]), 1)
    rates = [m.value for m in at.metric if m.label == "Acceptance rate"]
    assert rates == [ui.fmt(None if p.acceptance_rate is None else 100 * p.acceptance_rate, 1, "%")
                     for p in info.acceptance]
    lengths = [m.value for m in at.metric if m.label == "Mean acceptance length"]
    assert lengths == [ui.fmt(p.mean_acceptance_length, 2) for p in info.acceptance]
    assert charts(at) == 6  # α_i, β_i, calibration, T_v, T_s vs context, T_s(B)
    assert "Telemetry" in [h.value for h in at.header]


def test_why_page_filled_shows_the_tuners_best(monkeypatch, urls):
    from specdec_tune.dashboard.studies import list_studies, open_storage
    from specdec_tune.tuner.model import Candidate, best_configs, load_run_profile, predict_config, spec_config

    at = render(monkeypatch, "why", urls["db"], urls["storage"])
    db = open_database(urls["db"])
    # a study tuned this run: the page leads with the tuner's choice, at the search's prediction
    (tuned,) = [s.result for s in list_studies(open_storage(urls["storage"])) if s.result and s.result.run_id == 1]
    c: Candidate = tuned.candidate
    chosen = predict_config(load_run_profile(db, 1, c.drafter), spec_config(c))
    assert metric(at, "Predicted tokens/s") == ui.fmt(chosen.tokens_per_s)
    assert metric(at, "E[τ] tokens per cycle") == ui.fmt(chosen.expected_tokens_per_cycle, 2)
    best = max((best_configs(load_run_profile(db, 1, d), top=1)[0] for d in ("ngram", None)),
               key=lambda cp: cp[1].tokens_per_s)
    if ui.fmt(best[1].tokens_per_s) != ui.fmt(chosen.tokens_per_s):
        assert any(f"{best[1].tokens_per_s:,.1f} tokens/s" in x.value for x in at.caption)  # the grid's best, apart
    assert any("The tuner chose" in s.value and "vllm" in s.value for s in at.success)
    budget_table = next(d.value for d in at.dataframe if "E[τ] (tokens per cycle)" in d.value.columns)
    assert budget_table["configuration"].iloc[0].startswith("tuner's choice")
    assert charts(at) == 1 + 2  # the cycle budget and one (N, θ) map per draft


def test_why_page_batch_size_widget(monkeypatch, urls):
    at = render(monkeypatch, "why", urls["db"], urls["storage"])
    before = metric(at, "Predicted tokens/s")
    at.selectbox(key="why_batch").set_value(2).run()
    assert not at.exception and metric(at, "Predicted tokens/s") != before


def test_fidelity_page_filled(monkeypatch, urls):
    at = render(monkeypatch, "fidelity", urls["db"], urls["storage"])
    assert charts(at) == 1
    table = at.dataframe[0].value
    from specdec_tune.dashboard.measured import measured_split
    from specdec_tune.db import list_measured

    # every measurement with a prediction: the two configurations and the plain decoding measured beside each
    splits = [measured_split(m) for m in list_measured(open_database(urls["db"])) if m.predicted_tokens_per_s]
    assert sorted(table["prompts"]) == sorted(set(splits)) and sum(table["configurations"]) == len(splits) == 4


def test_study_page_filled(monkeypatch, urls):
    at = render(monkeypatch, "study", urls["db"], urls["storage"])
    assert at.selectbox(key="study_name").value == dashboard_data.STUDY
    trials = metric(at, "Trials")
    assert int(trials) >= 10 and metric(at, "Completed") == trials
    assert any("Winner for vllm" in s.value for s in at.success)
    assert charts(at) == 3  # history, importance, per-batch-size schedule
    at.selectbox(key="study_name").set_value(dashboard_data.PARETO).run()
    assert not at.exception and charts(at) == 3  # history, importance, Pareto front (no schedule stored)
    assert metric(at, "Pareto-optimal trials") != "0"


def test_trends_page_without_regression_runs(monkeypatch, urls):
    at = render(monkeypatch, "trends", urls["db"], urls["storage"])
    assert any("No regression runs yet" in i.value for i in at.info)


def test_draft_filter_narrows_the_profile_page(monkeypatch, urls):
    at = render(monkeypatch, "profile", urls["db"], urls["storage"])
    at.sidebar.selectbox(key="sel_draft").set_value("ngram").run()
    assert not at.exception
    assert len([m for m in at.metric if m.label == "Acceptance rate"]) == 1


def test_trends_and_overview_with_regression_runs(monkeypatch, regress_db):
    db, ids, _ = regress_db
    at = render(monkeypatch, "trends", db.url, None)
    assert metric(at, "Regression runs") == "3" and metric(at, "Flagged changes") == "1"
    assert charts(at) == 3  # tokens/s, τ, model error
    flagged = at.dataframe[0].value
    assert list(flagged["run"]) == [ids[2]] and list(flagged["verdict"]) == ["regression"]
    at = render(monkeypatch, "overview", db.url, None)
    assert metric(at, "Regression runs") == "3" and metric(at, "Profile runs") == "0"
    tables = [d.value for d in at.dataframe if "verdict" in d.value.columns]
    assert len(tables) == 1 and list(tables[0]["verdict"]) == ["regression"]


def test_overview_shows_the_measured_ci_a_study_row_has_in_the_database(monkeypatch, urls):
    """A study's winner was measured and stored with its 95% CI: its row shows that CI, not "–"."""
    from specdec_tune.db import list_measured

    at = render(monkeypatch, "overview", urls["db"], urls["storage"])
    best = at.dataframe[0].value
    row = best[best["from"] == f"study {dashboard_data.STUDY}"].iloc[0]
    value, ci = row["tokens/s [95% CI]"].split(" ", 1)  # the measured value and its CI share a cell
    stored = [m for m in list_measured(open_database(urls["db"]), 1)
              if m.draft and ui.fmt(m.measured_tokens_per_s) == value]
    assert len(stored) == 1 and stored[0].ci95 is not None
    assert ci == ui.ci_text(stored[0].ci95)


def test_overview_models_table_names_the_ngram_drafter(monkeypatch, urls):
    at = render(monkeypatch, "overview", urls["db"], urls["storage"])
    models = next(d.value for d in at.dataframe if "model" in d.value.columns)
    ngram = models[models["model"] == "ngram"].iloc[0]
    assert ngram["role"] == "draft (n-gram lookup, no model)"
    assert ngram["parameters"] == "–" and ngram["layers"] == "–"
    assert not models.isna().any().any() and "None" not in models.astype(str).values
