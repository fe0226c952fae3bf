"""How fast each dashboard page renders on a database of 100 runs and a study of 5,000 trials.

Builds the data with the project's own code: one real ``specdec-tune profile`` of the bundled models
(or ``--source-db``), copied run by run through the ``db`` helpers into ``--runs`` runs, each with the
source's measured configurations; and one Optuna study of ``--trials`` trials over (drafter, N, θ)
whose values are the tuner's predictions for that run, plus a ``TuningResult``. Then it times every
page twice, with Streamlit's caches cleared (cold: the loaders query the database) and again
(warm: cached), with ``streamlit.testing.v1.AppTest`` (the script run on the server); and, where
headless Chromium is installed, in a real browser from navigation until every chart is drawn.

    python benchmarks/dashboard_speed.py --out /tmp/dash-speed             # build (minutes) and time
    python benchmarks/dashboard_speed.py --out /tmp/dash-speed --reuse     # time an existing build

Timings on a shared machine are noisy: report the load average next to them (printed).
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from specdec_tune.cli import _options as opts

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROFILE_FLAGS = ["--batch-sizes", "1,4", "--n-max", "8", "--k-max", "9", "--repeats", "5", "--max-prompts", "6",
                 "--max-new-tokens", "32", "--context-lens", "64,128"]
PAGES = ("overview", "profile", "why", "fidelity", "study", "trends")
STUDY = "speed-study"
# Charts each page draws on the benchmark's data (2 drafts, a single-objective study): the browser
# timing stops only once all of them are drawn.
MIN_CHARTS = {"overview": 0, "profile": 6, "why": 3, "fidelity": 1, "study": 2, "trends": 0}


def build(out: Path, runs: int, trials: int, source_db: str | None) -> dict[str, str]:
    from specdec_tune.db import open_database

    out.mkdir(parents=True, exist_ok=True)
    src = _source(out, source_db)
    db_url = f"sqlite:///{out / 'results.db'}"
    if (out / "results.db").exists():
        (out / "results.db").unlink()
    db = open_database(db_url)
    _copy_runs(src, db, runs)
    storage_url = f"sqlite:///{out / 'studies.db'}"
    if (out / "studies.db").exists():
        (out / "studies.db").unlink()
    _study(db, runs, trials, storage_url)
    urls = {"db": db_url, "storage": storage_url}
    (out / "urls.json").write_text(json.dumps(urls))
    return urls


def _source(out: Path, source_db: str | None):
    """The database whose run 1 is copied: ``source_db``, else one real profile (and three measured
    configurations) of the bundled models, made once in ``out``."""
    from specdec_tune.cli import main
    from specdec_tune.db import open_database

    src_url = source_db or f"sqlite:///{out / 'source.db'}"
    if source_db is None and not (out / "source.db").exists():
        assert main(["profile", "--target", "mini-target", "--draft", "mini-draft-1l,ngram", "--workload", "functions",
                     "--db", src_url, *PROFILE_FLAGS]) == 0
        for n, theta in ((2, 0.0), (4, 0.0), (6, 0.3)):
            assert main(["measure", "--run", "1", "-N", str(n), "--threshold", str(theta), "--repeats", "1",
                         "--db", src_url]) == 0
    return open_database(src_url)


def _copy_runs(src, db, runs: int) -> None:
    """``runs`` copies of the source's run 1 in ``db``: its timings, acceptance, traces and measured runs."""
    from specdec_tune import db as store

    run = store.get_run(src, 1)
    timings = store.load_timings(src, 1, include_warmup=True)
    acceptance = store.load_acceptance(src, 1)
    traces = {(a.draft, a.mode, a.temperature): store.load_traces(src, 1, a.draft, a.mode, temperature=a.temperature)
              for a in acceptance}
    measured = store.list_measured(src, 1)
    hw = store.get_or_create_hardware(db, {k: getattr(run.hardware, k) for k in (
        "device", "device_name", "device_count", "memory_mb", "driver_version", "cuda_version", "torch_version",
        "transformers_version", "hostname", "extra")})
    target = store.get_or_create_model(db, {"name": run.target.name, "num_parameters": run.target.num_parameters,
                                            "num_layers": run.target.num_layers, "dtype": run.target.dtype})
    workload = store.get_or_create_workload(db, {"name": run.workload.name, "prompt_count": run.workload.prompt_count,
                                                 "content_hash": run.workload.content_hash})
    for i in range(runs):
        rid = store.create_run(db, target_model_id=target, hardware_id=hw, workload_id=workload,
                               drafts=run.draft_names, settings=run.settings, label=f"copy {i + 1} of run 1")
        store.add_timing_samples(db, rid, timings)
        for a in acceptance:
            store.add_acceptance(db, rid, draft=a.draft, mode=a.mode, temperature=a.temperature,
                                 num_speculative=a.num_speculative, cycles=a.cycles,
                                 position_attempts=a.position_attempts, position_accepts=a.position_accepts,
                                 alpha=a.alpha, beta=a.beta, confidence_bins=a.confidence_bins,
                                 teacher_forced_tokens=a.teacher_forced_tokens,
                                 greedy_agreement=a.greedy_agreement, one_minus_tv=a.one_minus_tv,
                                 in_loop=a.in_loop, continuations=a.continuations, tv_temperature=a.tv_temperature)
            store.add_traces(db, rid, a.draft, a.mode, a.temperature, traces[(a.draft, a.mode, a.temperature)])
        for m in measured:
            store.add_measured_run(db, rid, draft=m.draft, config=m.config, seconds=m.seconds,
                                   measured_tokens_per_s=m.measured_tokens_per_s, new_tokens=m.new_tokens,
                                   predicted_tokens_per_s=m.predicted_tokens_per_s, measured_tau=m.measured_tau,
                                   predicted_tau=m.predicted_tau)
        store.finish_run(db, rid, "completed")


def _study(db, run_id: int, trials: int, storage_url: str) -> None:
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    from optuna.trial import create_trial

    from specdec_tune.db import get_run
    from specdec_tune.tuner.model import Candidate, SpecConfig, TuningResult, load_run_profile, predict_config

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    run = get_run(db, run_id)
    profiles = {d: load_run_profile(db, run_id, d) for d in run.draft_names}
    reach = {d: max(len(t.confidences) for t in rp.model.traces) for d, rp in profiles.items()}
    dists = {"drafter": CategoricalDistribution(run.draft_names), "num_speculative_tokens": IntDistribution(1, 16),
             "threshold": FloatDistribution(0.0, 0.95)}
    rng = random.Random(0)
    cache: dict[tuple, float] = {}
    made = []
    for _ in range(trials):
        d = rng.choice(run.draft_names)
        n = rng.randint(1, reach[d])
        theta = 0.0 if d == "ngram" else round(rng.choice((0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)), 2)
        if (d, n, theta) not in cache:
            cache[(d, n, theta)] = predict_config(profiles[d], SpecConfig(n, theta)).tokens_per_s
        made.append(create_trial(params={"drafter": d, "num_speculative_tokens": n, "threshold": theta},
                                 distributions=dists, value=cache[(d, n, theta)],
                                 user_attrs={"predicted_tokens_per_s": cache[(d, n, theta)]}))
    study = optuna.create_study(study_name=STUDY, storage=storage_url, direction="maximize")
    study.add_trials(made)
    best = study.best_trial
    result = TuningResult(candidate=Candidate(best.params["drafter"], best.params["num_speculative_tokens"],
                                              best.params["threshold"]),
                          server="any", target=run.target.name, workload=run.workload.name,
                          hardware=run.hardware.device_name, predicted_tokens_per_s=best.value, study=STUDY,
                          run_id=run_id)
    study.set_user_attr("result", result.to_dict())


def time_apptest(urls: dict[str, str], repeats: int) -> dict[str, dict[str, float]]:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    import specdec_tune.dashboard as pkg

    os.environ["SPECDEC_DB"], os.environ["SPECDEC_STORAGE"] = urls["db"], urls["storage"]
    app = str(Path(pkg.__file__).with_name("app.py"))
    out: dict[str, dict[str, float]] = {}
    for page in PAGES:
        cold, warm = [], []
        for _ in range(repeats):
            at = AppTest.from_file(app, default_timeout=300)
            st.cache_data.clear()
            st.cache_resource.clear()
            if page != "overview":
                at.run()  # the first script run lands on the default page: select the page, then time it
                at.switch_page(f"views/{page}.py")
                st.cache_data.clear()
                st.cache_resource.clear()
            t0 = time.perf_counter()
            at.run()
            cold.append(time.perf_counter() - t0)
            assert not at.exception, [e.value for e in at.exception]
            t0 = time.perf_counter()
            at.run()
            warm.append(time.perf_counter() - t0)
        out[page] = {"cold_s": statistics.median(cold), "warm_s": statistics.median(warm)}
    return out


def time_browser(urls: dict[str, str]) -> dict[str, dict[str, float]] | None:
    from selenium.webdriver.common.by import By

    from tests.support.dashboard_data import RunningDashboard
    from tests.dashboard.test_browser import CHROMIUM, DRIVER, chrome, idle, rendered_charts
    from tests.dashboard.test_browser import PAGES as SPEC

    if CHROMIUM is None or DRIVER is None:
        return None
    import tempfile

    out: dict[str, dict[str, float]] = {}
    with RunningDashboard(urls["db"], urls["storage"]) as board, tempfile.TemporaryDirectory() as tmp:
        driver = chrome(Path(tmp))
        try:
            for page in PAGES:
                path = "" if page == "overview" else page
                title = SPEC[path][0]
                times = []
                for _ in range(2):  # first visit: cold server caches; second: warm
                    t0 = time.perf_counter()
                    driver.get(f"{board.url}/{path}")
                    while True:
                        heads = [h.text for h in driver.find_elements(By.TAG_NAME, "h1")]
                        n, drawn = rendered_charts(driver)
                        if title in heads and n == drawn >= MIN_CHARTS[page] and idle(driver):
                            break
                        if time.perf_counter() - t0 > 120:
                            raise RuntimeError(f"{page} did not render in 120 s")
                        time.sleep(0.05)
                    times.append(time.perf_counter() - t0)
                out[page] = {"cold_s": times[0], "warm_s": times[1], "charts": rendered_charts(driver)[1]}
        finally:
            driver.quit()
    return out


Out = Annotated[Path, typer.Option("--out", help="Folder of the build (databases, urls.json) and timings.json.")]
Runs = Annotated[int, typer.Option("--runs", help="Copies of the source run in the results database.")]
Trials = Annotated[int, typer.Option("--trials", help=(
    f"Trials of the synthetic study (predicted values, nothing measured; tune's --trials default is "
    f"{opts.DEFAULT_TRIALS})."))]
SourceDb = Annotated[str | None, typer.Option("--source-db", metavar="URL", help=(
    "Copy run 1 of this database instead of profiling."))]
Reuse = Annotated[bool, typer.Option("--reuse", help="Time an existing build in --out.")]
Repeats = Annotated[int, typer.Option("--repeats", help="Server-side timings of each page (the median is reported).")]


def main(out: Out = Path("dashboard-speed"), runs: Runs = 100, trials: Trials = 5000, source_db: SourceDb = None,
         reuse: Reuse = False, repeats: Repeats = 3) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if reuse:
        urls = json.loads((out / "urls.json").read_text())
    else:
        t0 = time.perf_counter()
        urls = build(out, runs, trials, source_db)
        print(f"built {runs} runs and a {trials}-trial study in {time.perf_counter() - t0:.0f} s: {urls}")
    load = os.getloadavg()
    server = time_apptest(urls, repeats)
    browser = time_browser(urls)
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs (a shared machine)")
    print(f"{'page':<10} {'server cold':>12} {'server warm':>12} {'browser cold':>13} {'browser warm':>13}")
    for page in PAGES:
        b = (browser or {}).get(page, {})
        print(f"{page:<10} {server[page]['cold_s']:>11.2f}s {server[page]['warm_s']:>11.2f}s "
              f"{b.get('cold_s', float('nan')):>12.2f}s {b.get('warm_s', float('nan')):>12.2f}s")
    (out / "timings.json").write_text(json.dumps({"server": server, "browser": browser, "load": load}, indent=1))


if __name__ == "__main__":
    opts.run_script(main)
