"""The main job, then the Quickstart, in one database (issue 35, rows 6 and 7): ``--run latest`` and the
printed run ids name the run the Quickstart just made, the dashboard opens on the tuned winner, and the
winner's predicted tokens/s is one number wherever it appears, or each figure says what it was
predicted for (prompts, machine speed); the trial counts add up.

One real ``tune`` on the tiny models (text report, its ``--json`` object, the export README, the study and
the dashboard's loaders, all from that one run), then one ``profile`` (run 2).
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from collections import defaultdict
from pathlib import Path

import pytest

from specdec_tune.cli import main
from tests.support import dashboard_data
from tests.support.readme_check import TITLES, readme_section


def _cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def tuned_then_profiled(tiny_model_dirs, tune_flags, tmp_path_factory):
    """``tune`` (text report; the report object kept for its ``--json`` form), then ``profile`` (run 2)."""
    import specdec_tune.cli.tune as tune_cli

    root = tmp_path_factory.mktemp("tune_then_quickstart")
    workload = root / "w.jsonl"
    prompts = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
               "x = [i for i in range(3)]", "return a + b", "self.x = x"]
    workload.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    db = f"sqlite:///{root / 'r.db'}"
    reports, printed = [], tune_cli.print_report

    def keep(console, report) -> None:  # the report the text was printed from, for its --json form
        reports.append(report)
        printed(console, report)

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("COLUMNS", raising=False)  # piped: tables on one line each
        mp.setattr(tune_cli, "print_report", keep)
        code, tuned, err = _cli(["tune", "--target", tiny_model_dirs["target"], "--drafts",
                                 f"{tiny_model_dirs['draft']},ngram", "--workload", str(workload), "--db", db,
                                 *tune_flags, "--server", "any", "--trials", "20", "--export", str(root / "out")])
        assert code == 0, err
        code, profiled, err = _cli(["profile", "--target", tiny_model_dirs["target"], "--draft",
                                    f"{tiny_model_dirs['draft']},ngram", "--workload", str(workload), "--db", db,
                                    *dashboard_data.TINY_FLAGS])
        assert code == 0, err
    return {"db": db, "root": root, "tuned": tuned, "report": reports[0], "profiled": profiled}



# ----------------------------------------------------------------------------- row 6: run ids


@pytest.mark.slow
def test_run_latest_is_the_profile_the_quickstart_just_made(tuned_then_profiled):
    t = tuned_then_profiled
    assert t["report"].run_id == 1
    code, out, err = _cli(["predict", "--run", "latest", "-N", "2", "--db", t["db"], "--json"])
    assert code == 0, err
    assert json.loads(out)["run_id"] == 2  # the newest completed profile run, not the tune's
    code, out, err = _cli(["measure", "--run", "latest", "-N", "1", "--draft", "ngram", "--max-prompts", "1",
                           "--repeats", "1", "--db", t["db"], "--json"])
    assert code == 0, err
    assert json.loads(out)["run_id"] == 2
    code, out, err = _cli(["export", "--run", "latest", "--config", "2,0", "--format", "vllm", "--out",
                           str(t["root"] / "exp"), "--db", t["db"]])
    assert code == 0 and "(run 2)" in out, (out, err)


@pytest.mark.slow
def test_the_printed_run_ids_are_commands_that_work(tuned_then_profiled):
    t = tuned_then_profiled
    assert "profile run 1 (new; `--run 1` names it" in t["tuned"]
    line = next(x for x in t["profiled"].splitlines() if x.startswith("stored as run 2: "))
    commands = line.removeprefix("stored as run 2: ").split(" (")[0].split("; ")
    assert [shlex.split(c)[:4] for c in commands] == [["specdec-tune", "predict", "--run", "2"],
                                                      ["specdec-tune", "measure", "--run", "2"]]
    code, out, err = _cli([*shlex.split(commands[0])[1:], "--json"])  # the printed predict, as printed
    assert code == 0 and json.loads(out)["run_id"] == 2, err


@pytest.mark.slow
@pytest.mark.parametrize("given, message", [
    ("first", "--run must be a run id (an integer) or 'latest', got 'first'"),
    ("1.5", "--run must be a run id"),
])
def test_a_bad_run_is_one_line_and_exit_2(tuned_then_profiled, given, message):
    code, out, err = _cli(["predict", "--run", given, "-N", "2", "--db", tuned_then_profiled["db"]])
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_latest_without_a_completed_run_says_what_to_run(tmp_path):
    code, out, err = _cli(["measure", "--run", "latest", "-N", "2", "--db", f"sqlite:///{tmp_path / 'e.db'}"])
    assert code == 2 and err.count("\n") == 1 and "no completed profile run" in err and "specdec-tune profile" in err


@pytest.mark.slow
def test_the_dashboard_opens_on_the_newest_tuned_studys_run(tuned_then_profiled):
    from specdec_tune.dashboard.studies import list_studies, newest_tuned_run, open_storage
    from specdec_tune.db import list_runs, open_database

    runs = [r.id for r in list_runs(open_database(tuned_then_profiled["db"]))]
    studies = list_studies(open_storage(tuned_then_profiled["report"].storage))
    assert runs == [2, 1] and [s.result.run_id for s in studies] == [1]
    assert newest_tuned_run(studies, runs) == 1  # the tuned winner's run, not the newer Quickstart profile
    assert newest_tuned_run([], runs) == 2 and newest_tuned_run(studies, [2]) == 2  # no study, or its run not offered
    assert newest_tuned_run(studies, []) is None


# ----------------------------------------------------------------------------- row 7: one number per configuration


def _bases_line(text: str, after: str) -> dict[str, str]:
    """``predicted tokens/s above: ...`` under the table whose title starts with ``after``: row label ->
    what its predicted column was computed for."""
    line = next(x for x in text.split(after, 1)[1].splitlines() if x.startswith("  predicted tokens/s above: "))
    groups = line.removeprefix("  predicted tokens/s above: ")
    if groups.startswith("for "):
        return defaultdict(lambda: groups.removeprefix("for "))
    out = {}
    for group in groups.split("; "):
        labels, basis = group.split(": for ", 1)
        out.update({label: basis for label in labels.split(", ")})
    return out


def _cells(text: str, title: str) -> list[list[str]]:
    """The body rows of the table printed under ``title`` (rich's box lines split on │)."""
    block = text.split(title, 1)[1].split("└", 1)[0]
    return [[c.strip() for c in line.split("│")[1:-1]] for line in block.splitlines() if line.startswith("│")]


def _figures(t: dict) -> list[tuple[str, str, str]]:
    """Every (place, predicted tokens/s as printed, what it says it was predicted for) of the winner."""
    from specdec_tune.cli.tune import report_json

    report, text = t["report"], t["tuned"]
    obj = json.loads(json.dumps(report_json(report), default=str))
    label = report.result.candidate.label()
    f = lambda x: f"{x:.1f}"  # noqa: E731 - as every place prints a rate
    out = []
    m = re.search(r"^  measured on .*; predicted ([\d.]+) tokens/s \(for ([^)]+)\)$", text, re.M)
    out.append(("terminal: winner line", m.group(1), m.group(2)))
    m = re.search(r"^  winner predicted: ([\d.]+) tokens/s \(for (.+)\)$", text, re.M)
    out.append(("terminal: objective block", m.group(1), m.group(2)))
    title = "measured on the tuning prompts"
    row = next(r for r in _cells(text, title) if r[0] == f"→ {label}")
    out.append(("terminal: confirmation table", row[4], _bases_line(text, title)[label]))
    title = "each server: its best measured"
    for r in _cells(text, title):
        if r[1] == label:
            out.append((f"terminal: server table, {r[0]}", r[2], _bases_line(text, title)[r[0]]))
    out.append(("json: predicted_tokens_per_s", f(obj["predicted_tokens_per_s"]), obj["predicted_basis"]))
    out.append(("json: objective", f(obj["objective"]["predicted"]), obj["objective"]["predicted_basis"]))
    win = next(r for r in obj["confirmation"] if r["winner"])
    out.append(("json: confirmation", f(win["predicted_tokens_per_s"]), win["predicted_basis"]))
    readme = (t["root"] / "out" / "README.md").read_text()
    m = re.search(r"^- predicted throughput: ([\d.]+) tokens/s \(predicted for (.+)\)$", readme, re.M)
    out.append(("README: numbers", m.group(1), m.group(2)))
    m = re.search(r"^- winner's throughput: ([\d.]+) tokens/s \(predicted for (.+)\)$", readme, re.M)
    out.append(("README: objective", m.group(1), m.group(2)))
    for srv, d in obj["best_per_server"].items():
        if _label(d) == label:  # the server's pick is the winner: its held-out prediction is the winner's
            out.append((f"json: best_per_server {srv}", f(d["predicted_tokens_per_s"]), d["predicted_basis"]))
            if f"\n### {TITLES[srv]} (" not in readme:
                continue  # a format not written has no section (its absence is listed under "Formats not written")
            m = re.search(r"^- predicted throughput: ([\d.]+) tokens/s \(predicted for ([^)]+)\)",
                          readme_section(readme, srv), re.M)
            out.append((f"README: {srv} section", m.group(1), m.group(2)))
    return out


def _label(entry: dict) -> str:
    from specdec_tune.tuner.model import Candidate

    return Candidate.from_dict(entry).label()


@pytest.mark.slow
def test_every_predicted_figure_of_the_winner_is_one_number_or_says_what_differs(tuned_then_profiled):
    figures = _figures(tuned_then_profiled)
    by_basis: dict[str, set[str]] = defaultdict(set)
    for place, value, basis in figures:
        assert basis and basis != "–", place
        by_basis[basis].add(value)
    # one basis, one number: two figures that differ never share what they say they were predicted for
    assert all(len(values) == 1 for values in by_basis.values()), figures
    assert len(by_basis) >= 3, figures  # the search's, the tuning measurement's and the held-out one's


@pytest.mark.slow
def test_the_dashboard_shows_the_winners_numbers_as_the_tune_stored_them(tuned_then_profiled):
    from specdec_tune.dashboard.overview import _best_from_studies
    from specdec_tune.dashboard.studies import list_studies, open_storage
    from specdec_tune.dashboard.why import chosen_budget, load_why
    from specdec_tune.db import open_database

    report = tuned_then_profiled["report"]
    r = report.result
    db = open_database(tuned_then_profiled["db"])
    (study,) = list_studies(open_storage(report.storage))
    row = next(b for b in _best_from_studies([study]) if b.server == r.server)
    assert row.predicted_tokens_per_s == r.predicted_tokens_per_s and study.result.predicted_basis == r.predicted_basis
    assert study.best_label is not None  # the search's best names its configuration beside its value
    # Why it wins: the tuner's choice at the search's figure, its speedup over the plain decoding the page shows
    chosen = chosen_budget(db, r.run_id, r.candidate)
    assert f"{chosen.tokens_per_s:.1f}" == f"{r.objective['predicted']:.1f}"
    why = load_why(db, r.run_id)
    assert chosen.speedup == pytest.approx(chosen.tokens_per_s / why.baseline.tokens_per_s)


@pytest.mark.slow
def test_the_trial_counts_add_up(tuned_then_profiled):
    from specdec_tune.cli.tune import report_json

    c = report_json(tuned_then_profiled["report"])["trial_counts"]
    assert c["completed"] == 20 == c["completed_new"] + c["completed_other"]
    assert c["new"] == c["completed_new"] + c["pruned_new"] + c["failed_new"]
    m = re.search(r"(\d+) completed trials = (\d+) run now \+ (\d+) from earlier runs or other processes",
                  tuned_then_profiled["tuned"])
    assert m and int(m.group(1)) == int(m.group(2)) + int(m.group(3)) == 20
