"""The sidebar's selection outlives the page and the session (it rides in the URL), and the hints of an
empty page name the selected run. A database with two runs: run 1 measured, run 2 (the newest) not."""
from __future__ import annotations

import sqlite3

import pytest
from streamlit.testing.v1 import AppTest  # streamlit is a required dependency: a missing one is a failure

from specdec_tune.cli.dashboard import APP_SCRIPT
from specdec_tune.dashboard.app import HERE
from specdec_tune.db import sqlite_file
from tests.support import dashboard_data


@pytest.fixture(scope="module")
def two_runs(tiny_model_dirs, tmp_path_factory) -> str:
    """The shared dashboard database copied, plus a newer profile run (run 2) with nothing measured."""
    from specdec_tune.cli import main

    urls = dashboard_data.build(tmp_path_factory.getbasetemp(), tiny_model_dirs)
    source = sqlite_file(urls["db"])
    copy = tmp_path_factory.mktemp("two_runs") / "results.db"
    with sqlite3.connect(source) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    url = f"sqlite:///{copy}"
    workload = source.parent / "w.jsonl"
    assert main(["profile", "--target", tiny_model_dirs["target"], "--draft", f"{tiny_model_dirs['draft']},ngram",
                 "--workload", str(workload), "--db", url, "--json", *dashboard_data.TINY_FLAGS]) == 0
    return url


def _app(monkeypatch, db_url: str, storage: str | None = None, **query: str) -> AppTest:
    monkeypatch.setenv("SPECDEC_DB", db_url)
    if storage is None:
        monkeypatch.delenv("SPECDEC_STORAGE", raising=False)
    else:
        monkeypatch.setenv("SPECDEC_STORAGE", storage)
    at = AppTest.from_file(str(APP_SCRIPT), default_timeout=120)
    at.query_params.update(query)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _page(at: AppTest, path: str) -> AppTest:
    at.switch_page(str(HERE / path)).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _profile_caption(at: AppTest) -> str:
    return next(c.value for c in at.caption if c.value.startswith("run "))


def test_the_selected_run_rides_in_the_url(monkeypatch, two_runs):
    at = _app(monkeypatch, two_runs)
    assert at.sidebar.selectbox(key="sel_run").value == 2  # a first visit opens on the newest run
    at.sidebar.selectbox(key="sel_run").set_value(1).run()
    assert at.query_params.get("run") == "1"
    assert _profile_caption(_page(at, "views/profile.py")).startswith("run 1 ")


@pytest.mark.slow
def test_a_page_opened_by_its_url_shows_the_run_the_url_names(monkeypatch, two_runs):
    """A reload, a bookmark or a link opens a new session: the URL's run is the one shown."""
    at = _app(monkeypatch, two_runs, run="1")
    assert at.sidebar.selectbox(key="sel_run").value == 1
    assert _profile_caption(_page(at, "views/profile.py")).startswith("run 1 ")
    at = _app(monkeypatch, two_runs, run="99")  # a run that is not there: the newest, no error
    assert at.sidebar.selectbox(key="sel_run").value == 2


@pytest.mark.slow
def test_the_empty_fidelity_page_names_the_selected_run(monkeypatch, two_runs):
    at = _page(_app(monkeypatch, two_runs), "views/fidelity.py")  # run 2, nothing measured in it
    hints = [c.value for c in at.code]
    assert any("specdec-tune measure --run 2 " in h for h in hints), hints
    assert not any("--run 1 " in h for h in hints), hints
    assert any("run 1" in i.value for i in at.info), [i.value for i in at.info]  # where measurements are


@pytest.mark.slow
def test_a_first_visit_opens_on_the_newest_tuned_studys_winner(monkeypatch, two_runs, tiny_model_dirs,
                                                              tmp_path_factory):
    """Run 2 is newer, but the study in the storage tuned run 1: the dashboard opens on run 1, and Why it wins
    leads with the tuner's choice (what a user who just ran `tune` came to see)."""
    from specdec_tune.dashboard.measured import short_name
    from specdec_tune.dashboard.studies import list_studies, open_storage

    storage = dashboard_data.build(tmp_path_factory.getbasetemp(), tiny_model_dirs)["storage"]
    (result,) = [s.result for s in list_studies(open_storage(storage)) if s.result is not None]
    assert result.run_id == 1
    at = _app(monkeypatch, two_runs, storage)
    assert at.sidebar.selectbox(key="sel_run").value == 1
    at = _page(at, "views/why.py")
    c = result.candidate
    shown = c.label().replace(c.drafter, short_name(c.drafter))
    assert at.subheader[0].value == f"The tuner's choice (predicted): {shown}"
    assert any("The tuner chose" in s.value for s in at.success)
    at = _app(monkeypatch, two_runs, storage, run="2")  # the URL still decides when it names a run
    assert at.sidebar.selectbox(key="sel_run").value == 2
