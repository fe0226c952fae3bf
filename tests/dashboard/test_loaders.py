"""The dashboard's loaders and charts, without Streamlit, on a database filled by the project's own code."""
from __future__ import annotations

import statistics

import pytest

from specdec_tune.dashboard import charts
from specdec_tune.dashboard.measured import (
    HELD_OUT,
    IN_SAMPLE,
    FidelityPoint,
    load_fidelity,
    measured_split,
    summarize,
)
from specdec_tune.dashboard.overview import load_overview
from specdec_tune.dashboard.profile_info import load_profile_info, spread
from specdec_tune.dashboard.studies import list_studies, load_study, open_storage, study_info
from specdec_tune.dashboard.study_charts import study_figures
from specdec_tune.dashboard.study_reader import read_trials
from specdec_tune.dashboard.ui import filter_runs
from specdec_tune.dashboard.why import load_why
from specdec_tune.db import MeasuredRecord, list_measured, list_runs, load_acceptance, load_timings, open_database
from tests.support import dashboard_data
from tests.support.fake_llamacpp import calls as fake_calls


@pytest.fixture(scope="module")
def urls(tiny_model_dirs, tmp_path_factory):
    return dashboard_data.build(tmp_path_factory.getbasetemp(), tiny_model_dirs)


@pytest.fixture(scope="module")
def db(urls):
    database = open_database(urls["db"])
    yield database
    database.close()


def test_overview_of_an_empty_database(tmp_path):
    info = load_overview(open_database(f"sqlite:///{tmp_path / 'e.db'}"))
    assert info.empty and info.run_count == 0 and info.best == () and info.runs == ()


def test_overview_of_a_filled_database(db, urls, tiny_model_dirs):
    studies = list_studies(open_storage(urls["storage"]))
    info = load_overview(db, studies)
    # the profile's hooked baseline, and each of the two measures with its plain decoding in the same passes
    assert not info.empty and info.run_count == 1 and info.measured_count == len(list_measured(db)) == 5
    assert info.runs[0].drafts == "draft, ngram" and info.runs[0].measured == 5
    prompts = len(dashboard_data.WORKLOAD.splitlines())
    assert [w[:2] for w in info.workloads] == [(info.runs[0].workload and list_runs(db)[0].workload.name, prompts)]
    study_rows = [b for b in info.best if b.source == f"study {dashboard_data.STUDY}"]
    result = next(s.result for s in studies if s.name == dashboard_data.STUDY)
    assert len(study_rows) == 1 and study_rows[0].server == "vllm" and study_rows[0].heldout is True
    assert study_rows[0].config == result.candidate.label() and study_rows[0].speedup == pytest.approx(result.speedup)
    # without studies the best *measured* configuration stands in, labelled with its prompts
    (measured_row,) = load_overview(db).best
    held = [m for m in list_measured(db) if m.draft and measured_split(m) == HELD_OUT]
    best = max(held or [m for m in list_measured(db) if m.draft], key=lambda m: m.measured_tokens_per_s)
    assert measured_row.measured_tokens_per_s == best.measured_tokens_per_s
    assert measured_row.heldout is (measured_split(best) == HELD_OUT)
    # like for like: over the plain decoding measured in the same passes (stored right after it), never
    # over the profile's hooked baseline
    plain = next(m for m in list_measured(db) if m.draft is None and m.id == best.id + 1)
    assert measured_row.speedup == pytest.approx(best.measured_tokens_per_s / plain.measured_tokens_per_s)


def test_spread_percentiles():
    s = spread([i / 1000 for i in range(1, 12)])  # 1..11 ms
    assert (s.median_ms, s.p10_ms, s.p90_ms, s.n) == pytest.approx((6.0, 2.0, 10.0, 11))


def test_profile_info_matches_the_stored_samples(db):
    info = load_profile_info(db, 1)
    assert set(info.verify) == {1, 2} and all(set(c) == {1, 2, 3} for c in info.verify.values())
    raw = [r.seconds * 1e3 for r in load_timings(db, 1, kind="verify") if r.batch_size == 2 and r.k == 3]
    assert info.verify[2][3].median_ms == pytest.approx(statistics.median(raw)) and info.verify[2][3].n == len(raw)
    (draft,) = [d for d in info.draft_steps]  # the n-gram drafter runs no model
    assert set(info.draft_steps[draft][1]) == set(info.run.settings.context_lens)
    assert info.typical_context == info.run.settings.typical_context
    for rec in load_acceptance(db, 1):
        panel = info.panel(rec.draft, rec.mode)
        drafted = sum(rec.confidence_bins["drafted"])
        assert panel.mean_acceptance_length == pytest.approx(1 + sum(rec.position_accepts) / rec.cycles)
        assert panel.acceptance_rate == (pytest.approx(sum(rec.position_accepts) / drafted) if drafted else None)
        assert [c[2] for c in panel.calibration] == rec.confidence_bins["drafted"]
    assert info.thresholds[0] == 0.0 and len(info.thresholds) > 3 and info.telemetry == ()


# A hand-made profile run whose predictions can be worked out on paper (no model code involved):
# one prompt of T_p = 5 tokens decoding M = 6 new tokens; a draft "d" that always agrees with the target
# (every recorded N_max = 2 cycle accepted all, and the bonus token too) with confidence 0.5 everywhere;
# T_v(k) = 10, 11, 12 ms for k = 1, 2, 3 new tokens; T_s = 2 ms; prefills 20 ms (target, T_p - 1
# tokens) and 4 ms (draft, T_p tokens); no engine overhead rows (so o_c = o_f = 0).
HAND = dict(M=6, P=5, T_v={1: 0.010, 2: 0.011, 3: 0.012}, T_s=0.002, prefill_t=0.020, prefill_d=0.004, conf=0.5)


def _hand_cycle(n: int, theta: float) -> tuple[int, float, int]:
    """(cycles, draft forwards per cycle, tokens verified per cycle) of the hand run at (N, θ), by hand.

    θ ≤ 0.5 never cuts: every cycle drafts N tokens, all accepted, and yields N + 1 of the M tokens
    (M is a multiple of N + 1 for N = 1, 2). θ > 0.5 stops every draft before its first token (rule
    'before'): one draft forward, one token verified, one token per cycle.
    """
    if theta <= HAND["conf"]:
        return HAND["M"] // (n + 1), float(n), n + 1
    return HAND["M"], 1.0, 1


def _hand_seconds(n: int, theta: float) -> float:
    """Predicted seconds of the hand run at (N, θ), as the end-to-end model counts them (the docstring
    of tuner.model's predictions module): per prompt prefill_target + prefill_draft - T_s (the draft's
    prefill stands in for the first cycle's first draft forward), per cycle F·T_s + T_v(L + 1)."""
    h = HAND
    cycles, forwards, verified = _hand_cycle(n, theta)
    return h["prefill_t"] + h["prefill_d"] - h["T_s"] + cycles * (forwards * h["T_s"] + h["T_v"][verified])


@pytest.fixture(scope="module")
def hand_db(tmp_path_factory):
    """The hand run (``HAND``) stored through the database's public writers: (database, run id)."""
    from specdec_tune.db import (
        TimingRow,
        TraceRow,
        add_acceptance,
        add_timing_samples,
        add_traces,
        create_run,
        finish_run,
        get_or_create_hardware,
        get_or_create_model,
    )

    h = HAND
    database = open_database(f"sqlite:///{tmp_path_factory.mktemp('hand') / 'hand.db'}")
    run = create_run(database, target_model_id=get_or_create_model(database, {"name": "t"}),
                     hardware_id=get_or_create_hardware(database, {"device": "cpu", "device_name": "CPU"}),
                     drafts=["d"], settings={"n_max": 2, "max_new_tokens": h["M"], "prompt_tokens": [h["P"]],
                                             "typical_context": 8})
    rows = [TimingRow("verify", k, 1, 8, t) for k, t in h["T_v"].items() for _ in range(3)]
    rows += [TimingRow("draft_step", 1, 1, 8, h["T_s"], draft="d") for _ in range(3)]
    rows += [TimingRow("prefill", h["P"] - 1, 1, 0, h["prefill_t"]), TimingRow("prefill", h["P"], 1, 0, h["prefill_d"],
                                                                                  draft="d")]
    add_timing_samples(database, run, rows)
    # three N_max cycles, all accepted (9 positions: more than M); the bonus token matched after each
    add_traces(database, run, "d", "greedy", 0.0,
               [TraceRow(i, (h["conf"], h["conf"]), 2, prompt_index=0) for i in range(3)])
    add_acceptance(database, run, draft="d", mode="greedy", temperature=0.0, num_speculative=2, cycles=3,
                   position_attempts=[3, 3], position_accepts=[3, 3], alpha=[1.0, 1.0], beta=[1.0, 1.0],
                   continuations=[[0, 0, h["conf"], True], [0, 1, h["conf"], True]])
    finish_run(database, run)
    yield database, run
    database.close()


def test_why_uses_the_tuners_predictions(hand_db, db):
    database, run = hand_db
    h = HAND
    info = load_why(database, run)
    # plain decoding: the target's prefill (it gives the first token's logits), then M - 1 forwards of T_v(1)
    base_s = h["prefill_t"] + (h["M"] - 1) * h["T_v"][1]  # the prefill gives the first token's logits
    assert info.baseline.tokens_per_s == pytest.approx(h["M"] / base_s)
    assert info.baseline.cycle_ms == pytest.approx(1e3 * h["T_v"][1]) and info.baseline.draft_ms == 0
    (hm,) = info.heatmaps
    assert hm.ns == (1, 2) and hm.thresholds[0] == 0.0
    for ti, theta in enumerate(hm.thresholds):
        for ni, n in enumerate(hm.ns):
            assert hm.tokens_per_s[ti][ni] == pytest.approx(h["M"] / _hand_seconds(n, theta)), (n, theta)
    # the ranking: N = 2 at any θ ≤ 0.5 is the best, 6 / (22 ms + 2 × 16 ms)
    best = h["M"] / _hand_seconds(2, 0.0)
    assert info.ranked[0].tokens_per_s == pytest.approx(best) and info.ranked[0].num_speculative_tokens == 2
    assert info.ranked[0].speedup == pytest.approx(best * base_s / h["M"])
    assert [b.tokens_per_s for b in info.ranked] == sorted((b.tokens_per_s for b in info.ranked), reverse=True)
    for b in info.ranked:  # a cycle: F draft steps, then one verify forward, no overhead
        cycles, forwards, verified = _hand_cycle(b.num_speculative_tokens, b.threshold)
        assert b.draft_ms == pytest.approx(1e3 * forwards * h["T_s"])
        assert b.verify_ms == pytest.approx(1e3 * h["T_v"][verified])
        assert b.overhead_ms == pytest.approx(0.0, abs=1e-9) and b.tokens_per_cycle == pytest.approx(h["M"] / cycles)
    # on the real profile: the ranking is sorted, the measured point sits on its draft's map
    real = load_why(db, 1)
    assert [b.tokens_per_s for b in real.ranked] == sorted((b.tokens_per_s for b in real.ranked), reverse=True)
    draft = list_runs(db)[0].draft_names[0]
    hm = next(h for h in real.heatmaps if h.draft == draft)
    assert hm.ns == (1, 2, 3, 4) and hm.thresholds[0] == 0.0
    measured = [m for m in list_measured(db) if m.draft == draft]
    assert [(p.num_speculative_tokens, p.threshold, p.measured) for p in hm.measured] == [
        (2, 0.3, measured[0].measured_tokens_per_s)]
    assert next(h for h in real.heatmaps if h.draft == "ngram").thresholds == (0.0,)
    assert real.ranked[0].tokens_per_s == max(t for m in real.heatmaps for row in m.tokens_per_s for t in row
                                              if t is not None)


def _point(pred, meas, ci=None, split=HELD_OUT, run=1):
    return FidelityPoint(0, run, "d", "x", split, meas, pred, ci, None, None)


def test_error_summary_numbers():
    pts = [_point(110, 100, (95, 105)), _point(190, 200, (180, 220)), _point(330, 300, (290, 340)),
           _point(90, 100, split=IN_SAMPLE)]
    s = summarize(pts, HELD_OUT)
    assert s.count == 3 and s.median_abs_error == pytest.approx(0.1) and s.worst_abs_error == pytest.approx(0.1)
    assert s.inside_ci == pytest.approx(2 / 3) and s.with_ci == 3 and s.spearman == pytest.approx(1.0)
    assert s.regret == pytest.approx(1.0)  # the predicted best (330) is the measured best (300)
    swapped = summarize([_point(300, 100), _point(100, 300), _point(200, 200)], HELD_OUT)
    assert swapped.spearman == pytest.approx(-1.0) and swapped.regret == pytest.approx(100 / 300)
    assert summarize(pts, IN_SAMPLE).count == 1 and summarize([], HELD_OUT) is None


def test_split_of_a_measured_row():
    def rec(config):
        return MeasuredRecord(1, 1, "d", config, 1.0, 1.0, None, None, 1.0, 1, None)

    assert measured_split(rec({"split": "holdout"})) == HELD_OUT
    assert measured_split(rec({"split": "tune"})) == IN_SAMPLE
    assert measured_split(rec({})) == IN_SAMPLE  # rows from before prompt splits ran the profile's prompts


def test_fidelity_on_the_fixture(db):
    info = load_fidelity(db)
    # the two measured configurations and the plain decoding measured beside each; the profile's hooked
    # baseline has no prediction
    assert len(info.points) == 4 and info.unpredicted == 1
    stored = {m.id: m for m in list_measured(db)}
    for p in info.points:
        assert p.predicted == stored[p.measured_id].predicted_tokens_per_s
        assert p.split == measured_split(stored[p.measured_id]) and p.ci == stored[p.measured_id].ci95
    assert sum(s.count for s in info.summaries) == 4
    assert all(s.spearman is None or -1 <= s.spearman <= 1 for s in info.summaries)
    assert load_fidelity(db, [], None).points == ()


def test_studies_and_study_info(urls):
    import optuna

    storage = open_storage(urls["storage"])
    rows = {s.name: s for s in list_studies(storage)}
    assert set(rows) == {dashboard_data.STUDY, dashboard_data.PARETO}
    ref = optuna.load_study(study_name=dashboard_data.STUDY, storage=urls["storage"])
    count = len(ref.trials)
    assert rows[dashboard_data.STUDY].trials == count >= 10
    assert rows[dashboard_data.STUDY].best_values == (ref.best_value,)
    info = study_info(load_study(storage, dashboard_data.STUDY))
    assert info.complete == count and info.best[0].number == ref.best_trial.number
    assert info.result.server == "vllm" and info.per_batch_size == info.result.per_batch_size != {}
    multi = study_info(load_study(storage, dashboard_data.PARETO))
    pareto_ref = optuna.load_study(study_name=dashboard_data.PARETO, storage=urls["storage"]).best_trials
    assert [t.number for t in multi.best] == sorted(t.number for t in pareto_ref)
    assert multi.objective_names == ("throughput", "memory") and multi.result is None
    with pytest.raises(KeyError, match="no study 'nope'"):
        load_study(storage, "nope")


def test_fast_trial_reader_equals_optuna(urls):
    storage = open_storage(urls["storage"])
    for name in (dashboard_data.STUDY, dashboard_data.PARETO):
        ref = storage.get_all_trials(storage.get_study_id_from_name(name))
        assert read_trials(storage, name) == ref  # every field: params, values, attrs, times


def test_absent_storage_creates_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'none.db'}"
    assert open_storage(url) is None and list_studies(None) == [] and not (tmp_path / "none.db").exists()


def test_study_figures(urls):
    storage = open_storage(urls["storage"])
    single = study_figures(load_study(storage, dashboard_data.STUDY))
    assert set(single) == {"history", "importance"} and all(f.data for f in single.values())
    multi = study_figures(load_study(storage, dashboard_data.PARETO))
    assert set(multi) == {"history", "importance", "pareto"}
    trials = load_study(storage, dashboard_data.STUDY).trials
    (points,) = [t for t in single["history"].data if t.name == "objective 1"]  # one point per trial
    assert sorted(points.y) == sorted(t.value for t in trials)


def test_charts_follow_the_data(db):
    info = load_profile_info(db, 1)
    fig = charts.verify_chart(info)
    assert [t.name for t in fig.data] == ["B = 1", "B = 2"]
    assert list(fig.data[0].y) == [info.verify[1][k].median_ms for k in (1, 2, 3)]
    why = load_why(db, 1)
    heat = charts.heatmap_chart(why.heatmaps[0])
    assert [list(r) for r in heat.data[0].z] == [list(r) for r in why.heatmaps[0].tokens_per_s]
    fid = charts.fidelity_chart(load_fidelity(db))
    assert fid.data[0].name.startswith("y = x") and len(fid.data[1].x) == 4
    budget = charts.budget_chart([*why.ranked, why.baseline])
    assert [t.name for t in budget.data] == ["draft steps", "verify", "overhead"]


def _every_figure(db, urls):
    """Every plotly figure the pages draw from the fixture (trends: none stored; telemetry: none on a CPU)."""
    from specdec_tune.dashboard.study_charts import schedule_chart

    info, why = load_profile_info(db, 1), load_why(db, 1)
    figs = {"verify": charts.verify_chart(info), "draft_step": charts.draft_step_chart(info),
            "draft_step_b": charts.draft_step_batch_chart(info),
            "alpha": charts.acceptance_chart(info.acceptance, "alpha"),
            "beta": charts.acceptance_chart(info.acceptance, "beta"),
            "calibration": charts.calibration_chart(info.acceptance, info.thresholds),
            "budget": charts.budget_chart([*why.ranked, why.baseline]),
            "heat": charts.heatmap_chart(why.heatmaps[0]), "fidelity": charts.fidelity_chart(load_fidelity(db)),
            "schedule": schedule_chart({1: 4, 4: 2, 16: 0})}
    storage = open_storage(urls["storage"])
    figs.update({f"study_{k}": f for k, f in study_figures(load_study(storage, dashboard_data.PARETO)).items()})
    return figs


def test_chart_titles_fit_beside_the_toolbar(db, urls):
    """Plotly's toolbar sits at a figure's top right (26 px high, 2 px from the top, as Chromium drew it),
    and two charts share a row: a title fits in a half-page chart (about 450 px: 60 characters of a
    15-px font) and starts below the toolbar, and the top margin holds it above the plot. Plotly centres
    a title's lines on its anchor (line height 1.3 font sizes)."""
    import re

    for name, fig in _every_figure(db, urls).items():
        t = fig.layout.title
        lines = re.split(r"<br\s*/?>", t.text or "")
        assert t.text and all(len(line) <= 60 for line in lines), (name, lines)
        assert (t.xanchor, t.yref, t.yanchor) == ("left", "container", "top"), name
        line = 1.3 * (t.font.size or 17)
        top = t.pad.t - (len(lines) - 1) * line / 2  # where the first line starts, from the figure's top
        assert top >= 2 + 26, (name, top)  # below the toolbar
        assert fig.layout.margin.t >= top + len(lines) * line + 4, name  # above the plot


def test_best_configuration_tables_fit_the_page(db, urls):
    """Overview's best configurations: one table per (target, hardware, workload), named above it, with
    columns that fit a page (twelve ran off its right edge): each value with its CI in one cell."""
    from dataclasses import replace

    from specdec_tune.dashboard.overview import best_tables

    best = list(load_overview(db, list_studies(open_storage(urls["storage"]))).best)
    row = best[0]
    deep = "/srv/models/" + "x" * 60 + "/draft"  # a local draft's label names its whole path
    best += [replace(row, server="sglang", config=f"{deep} N=4", source=f"{row.source} (best inside sglang's space)"),
             replace(row, hardware="Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz (cpu, 2 threads)", tokens_ci=None)]
    tables = best_tables(best)
    assert sorted(tables) == sorted({(b.target, b.hardware, b.workload) for b in best})
    assert sum(len(rows) for rows in tables.values()) == len(best)
    first_group = tables[(row.target, row.hardware, row.workload)]
    first = first_group[0]
    assert first["tokens/s [95% CI]"] == f"{row.measured_tokens_per_s:,.1f} [{row.tokens_ci[0]:,.1f}, {row.tokens_ci[1]:,.1f}]"
    assert first["speedup [95% CI]"].startswith(f"{row.speedup:.2f}× [")
    assert [r["configuration"] for r in first_group if r["server"] == "sglang"] == ["draft N=4"]  # the folder's name
    for rows in tables.values():
        assert all(len(r) <= 7 for r in rows)
        # at about 8 px a character (cell padding included), 125 characters fill a 1400-px window's page
        width = sum(max(len(col), *(len(r[col]) for r in rows)) + 3 for col in rows[0])
        assert width <= 125, rows


def test_filter_runs(db):
    runs = list_runs(db)
    target = runs[0].target.name
    assert filter_runs(runs, target) == runs and filter_runs(runs, "other") == []
    assert filter_runs(runs, workload=runs[0].workload.name) == runs


def test_best_inside_each_server_space(db):
    from specdec_tune.cli._dashboard_app import server_room
    from specdec_tune.dashboard.servers_info import server_rows
    from specdec_tune.tuner import servers
    from specdec_tune.tuner.model import Candidate

    why = load_why(db, 1)
    rows = {r.server: r for r in server_rows(why, server_room())}
    assert set(rows) == set(servers.SERVERS)
    cells = [(t, Candidate(h.draft, n, th)) for h in why.heatmaps for ti, th in enumerate(h.thresholds)
             for ni, n in enumerate(h.ns) if (t := h.tokens_per_s[ti][ni]) is not None]
    for name, row in rows.items():
        space = servers.SERVERS[name]
        inside = [t for t, c in cells if servers.expressible(space, c) is None]
        assert row.tokens_per_s == pytest.approx(max(inside))  # the best the tuner's table allows
        assert row.speedup == pytest.approx(row.tokens_per_s / why.baseline.tokens_per_s)
    best_t, best_c = max(cells, key=lambda tc: tc[0])
    for name, row in rows.items():
        assert row.cannot == (servers.expressible(servers.SERVERS[name], best_c) or "")
    # a configuration with θ > 0 is outside vLLM's space (no draft-confidence threshold there)
    assert servers.expressible(servers.SERVERS["vllm"], Candidate("d", 2, 0.3)) is not None


def test_every_speedup_on_why_it_wins_divides_by_the_plain_decoding_it_shows(db):
    """One predicted tokens/s, one speedup: the ranking, the tuner's choice and the servers table all divide by
    the page's plain decoding (before issue 37's calibration a draft's own profile predicted plain decoding a
    little differently; now every profile of the run predicts the same plain decoding)."""
    from specdec_tune.cli._dashboard_app import server_room
    from specdec_tune.dashboard.servers_info import server_rows
    from specdec_tune.dashboard.why import chosen_budget
    from specdec_tune.tuner.model import Candidate, Evaluator, SpecConfig, load_run_profile, predict_config

    why = load_why(db, 1)
    plain = why.baseline.tokens_per_s
    draft_own = {d: predict_config(load_run_profile(db, 1, d), SpecConfig(1)).baseline_tokens_per_s
                 for d in ("ngram", None)}
    assert all(b == pytest.approx(plain, rel=1e-9) for b in draft_own.values())  # one plain decoding
    speedups = {}
    for b in why.ranked:
        assert b.speedup == pytest.approx(b.tokens_per_s / plain, rel=1e-12)
        speedups[round(b.tokens_per_s, 9)] = b.speedup
    for row in server_rows(why, server_room()):
        assert speedups.get(round(row.tokens_per_s, 9), row.speedup) == pytest.approx(row.speedup, rel=1e-12)
    assert any(round(row.tokens_per_s, 9) in speedups for row in server_rows(why, server_room()))
    chosen = chosen_budget(db, 1, Candidate(why.ranked[0].draft, why.ranked[0].num_speculative_tokens,
                                            why.ranked[0].threshold))
    assert chosen.tokens_per_s == pytest.approx(why.ranked[0].tokens_per_s) and chosen.speedup == pytest.approx(
        why.ranked[0].speedup)
    # the search's stored speedup (the Tuning study page's column) is the same ratio
    scored = Evaluator(db, 1).score(Candidate(why.ranked[0].draft, why.ranked[0].num_speculative_tokens,
                                              why.ranked[0].threshold))
    assert scored.predicted_tokens_per_s == pytest.approx(chosen.tokens_per_s)
    assert scored.predicted_speedup == pytest.approx(chosen.speedup)


def test_export_downloads_are_the_exporters_files(urls, monkeypatch):
    from specdec_tune.cli._dashboard_app import server_room
    from specdec_tune.dashboard import wiring
    from specdec_tune.dashboard.studies import export_files, zip_files

    monkeypatch.setattr(wiring, "_room", server_room())

    result = next(s.result for s in list_studies(open_storage(urls["storage"])) if s.result)
    files = export_files(result).files
    assert "readme" in files and any(files[f] for f in files if f != "readme")
    readme = next(iter(files["readme"].values())).decode()
    assert result.candidate.drafter.rsplit("/", 1)[-1] in readme or "ngram" in readme
    import io
    import zipfile

    names = zipfile.ZipFile(io.BytesIO(zip_files(files))).namelist()
    assert sorted(names) == sorted(p for group in files.values() for p in group)


def _zipped(result, monkeypatch) -> tuple[dict[str, bytes], dict[str, str]]:
    """The dashboard's "Download all (zip)" of ``result``, read back: (path -> content, formats left out -> why)."""
    import io
    import zipfile

    from specdec_tune.cli._dashboard_app import server_room
    from specdec_tune.dashboard import wiring
    from specdec_tune.dashboard.studies import export_files, zip_files

    monkeypatch.setattr(wiring, "_room", server_room())
    bundle = export_files(result)
    with zipfile.ZipFile(io.BytesIO(zip_files(bundle.files))) as zf:
        return {n: zf.read(n) for n in zf.namelist()}, bundle.left_out


def _dangling(zipped: dict[str, bytes]) -> list[str]:
    """Files a zipped llama.cpp launch script or flag file names (``*.gguf``) that the zip lacks."""
    import re

    named = {f"llamacpp/{m}" for path, data in zipped.items() if path.startswith("llamacpp/") and
             path.endswith((".sh", ".txt")) for m in re.findall(r"[\w.-]+\.gguf", data.decode())}
    return sorted(n for n in named if n not in zipped)


def _llamacpp_result(tiny_model_dirs):
    from specdec_tune.tuner.model import Candidate, TuningResult

    return TuningResult(candidate=Candidate("draft", 4), server="llamacpp", target="target", workload="functions",
                        target_path=tiny_model_dirs["target"], draft_path=tiny_model_dirs["draft"], study="s1")


def test_the_zip_leaves_llamacpp_out_without_its_gguf_files(fresh_llamacpp, tiny_model_dirs, monkeypatch):
    """Nothing converted on this machine: the zip holds no llama.cpp flags naming GGUF files it lacks; the page
    and the zip's README say why and which command writes them. The page converts and fetches nothing."""
    folder, _ = fresh_llamacpp
    zipped, left_out = _zipped(_llamacpp_result(tiny_model_dirs), monkeypatch)
    assert _dangling(zipped) == [] and not any(p.startswith("llamacpp/") for p in zipped)
    assert "not converted to GGUF on this machine" in left_out["llamacpp"]
    assert "specdec-tune export --study s1 --format llamacpp" in left_out["llamacpp"]
    assert f"- llamacpp: {left_out['llamacpp']}" in zipped["README.md"].decode()
    assert "hf/generation_config.json" in zipped and fake_calls(folder) == []


def test_the_zip_carries_the_gguf_files_converted_on_this_machine(fresh_llamacpp, tiny_model_dirs, monkeypatch,
                                                                  tmp_path):
    """After an export converted the models here (as ``tune --export`` does), the zip carries target.gguf and
    draft.gguf beside the flags that name them; above the size limit llamacpp is left out, saying why."""
    from specdec_tune.tuner.servers import download_files, write_formats

    result = _llamacpp_result(tiny_model_dirs)
    write_formats(result, ["llamacpp"], tmp_path / "exported")  # fetches the stand-in converter, converts
    zipped, left_out = _zipped(result, monkeypatch)
    assert left_out == {} and _dangling(zipped) == []
    assert zipped["llamacpp/target.gguf"] == b"GGUF" + b"target" and zipped["llamacpp/draft.gguf"] == b"GGUF" + b"draft"
    assert "llamacpp/launch.sh" in zipped and "### llama.cpp (" in zipped["README.md"].decode()
    files, left_out = download_files(result, ["all"], gguf_limit=4)
    assert "llamacpp" not in files and "more than a download carries" in left_out["llamacpp"]


def test_held_out_rows_with_cis(tmp_path):
    """Rows measured on held-out prompts with a 95% CI: split apart, CI checked, like-for-like speedup."""
    from specdec_tune.db import add_measured_run, create_run, get_or_create_hardware, get_or_create_model

    db = open_database(f"sqlite:///{tmp_path / 'ci.db'}")
    run = create_run(db, target_model_id=get_or_create_model(db, {"name": "t"}),
                     hardware_id=get_or_create_hardware(db, {"device": "cpu", "device_name": "CPU"}), drafts=["d"])
    held = {"num_speculative_tokens": 2, "threshold": 0.0, "split": "holdout"}
    add_measured_run(db, run, draft=None, config={**held, "num_speculative_tokens": 0}, measured_tokens_per_s=100.0,
                     seconds=1.0, new_tokens=100, ci=(95.0, 105.0))
    add_measured_run(db, run, draft="d", config=held, measured_tokens_per_s=150.0, seconds=1.0, new_tokens=150,
                     predicted_tokens_per_s=160.0, ci=(140.0, 165.0))
    add_measured_run(db, run, draft="d", config={**held, "num_speculative_tokens": 4}, measured_tokens_per_s=140.0,
                     seconds=1.0, new_tokens=140, predicted_tokens_per_s=120.0, ci=(135.0, 145.0))
    add_measured_run(db, run, draft="d", config={"num_speculative_tokens": 3}, measured_tokens_per_s=200.0,
                     seconds=1.0, new_tokens=200, predicted_tokens_per_s=210.0)  # in-sample, no CI
    info = load_fidelity(db)
    held_out = [p for p in info.points if p.split == HELD_OUT]
    assert [(p.ci, p.inside_ci) for p in held_out] == [((140.0, 165.0), True), ((135.0, 145.0), False)]
    summary = next(s for s in info.summaries if s.split == HELD_OUT)
    assert summary.inside_ci == 0.5 and summary.with_ci == 2 and summary.regret == 1.0
    (best,) = load_overview(db).best  # held-out rows win over a faster in-sample one
    assert best.heldout is True and best.measured_tokens_per_s == 150.0 and best.tokens_ci == (140.0, 165.0)
    assert best.speedup == pytest.approx(1.5)  # against plain decoding measured on the same held-out prompts


def test_trends_from_regression_runs(regress_db, tmp_path):
    from specdec_tune.dashboard.trends import flagged, load_trends

    db, ids, _ = regress_db
    info = load_trends(db)
    assert info.runs == 3 and info.benchmarks == ("functions-1l",)
    tps = sorted((p for p in info.points if p.metric == "tokens_per_s"), key=lambda p: p.regress_run)
    # By hand from the fixture (tests/conftest.py, regress_db): each prompt's 32 tokens over the median of
    # its repeats, 32 / 0.11, 32 / 0.20, 32 / 0.05, 32 / 0.08 = 290.9, 160, 640, 400 tokens/s; the median
    # over the four prompts is (290.9 + 400) / 2 = 3800 / 11 = 345.45 (the total-time rate would be
    # 128 / 0.44 = 290.9, the mean of the rates 372.7). The third run's seconds are 1.3 times longer.
    assert [p.value for p in tps] == pytest.approx([3800 / 11, 3800 / 11, 3800 / 11 / 1.3])
    assert all(p.ci[0] <= p.value <= p.ci[1] for p in tps)
    assert [p.verdict for p in tps] == ["", "", "flagged"]
    assert [p.value for p in info.points if p.metric == "tau"] == [2.0, 2.0, 2.0]  # 4 × 32 tokens ÷ 4 × 16 cycles
    assert [p.value for p in info.points if p.metric == "model_error"] == [0.04, 0.04]
    (hot,) = flagged(info)
    assert hot.regress_run == ids[2] and hot.verdict == "regression" and hot.p_value == 0.001
    assert hot.change == pytest.approx(1 / 1.3 - 1) and hot.change_ci == pytest.approx((-0.28, -0.2))
    assert "draft got slower" in hot.reason
    empty = load_trends(open_database(f"sqlite:///{tmp_path / 'none.db'}"))
    assert empty.runs == 0 and empty.points == ()


def test_chosen_budget_is_the_tuners_prediction(hand_db, db, urls):
    from specdec_tune.dashboard.why import chosen_budget
    from specdec_tune.tuner.model import Candidate

    database, run = hand_db
    h = HAND
    for c in (Candidate("d", 2), Candidate("d", 1), Candidate("d", 2, 0.7, "before")):
        cycles, forwards, verified = _hand_cycle(c.num_speculative_tokens, c.threshold)
        b = chosen_budget(database, run, c)
        assert b.label.startswith("tuner's choice") and b.tokens_per_s == pytest.approx(
            h["M"] / _hand_seconds(c.num_speculative_tokens, c.threshold)), c
        assert b.cycle_ms == pytest.approx(1e3 * (forwards * h["T_s"] + h["T_v"][verified])), c
    plain = chosen_budget(database, run, Candidate("none", 0))
    assert plain.tokens_per_s == pytest.approx(h["M"] / (h["prefill_t"] + (h["M"] - 1) * h["T_v"][1]))
    # a study's result on the real profile gets its bar, labelled as the tuner's choice
    result = next(s.result for s in list_studies(open_storage(urls["storage"])) if s.result)
    b = chosen_budget(db, 1, result.candidate)
    assert b.label.startswith("tuner's choice") and b.draft == result.candidate.drafter and b.tokens_per_s > 0
    assert chosen_budget(db, 1, Candidate("not-a-draft", 2)) is None  # not in this run: no bar, no crash


def test_server_backed_runs_are_labelled_by_backend_and_batch_size():
    from types import SimpleNamespace

    from specdec_tune.dashboard.measured import backend_of, config_label

    engine = SimpleNamespace(draft="/m/mini-draft-1l", config={"num_speculative_tokens": 4})
    vllm = SimpleNamespace(draft="/m/mini-draft-1l", config={"num_speculative_tokens": 4, "backend": "vllm",
                                                              "batch_size": 4})
    plain = SimpleNamespace(draft=None, config={"num_speculative_tokens": 0, "backend": "vllm", "batch_size": 1})
    assert config_label(engine) == "mini-draft-1l N=4" and backend_of(engine) == "engine"
    assert config_label(vllm) == "mini-draft-1l N=4 [vllm, B=4]"
    assert config_label(plain) == "plain decoding [vllm, B=1]"
