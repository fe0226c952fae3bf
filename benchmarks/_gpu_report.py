"""Issue 37's GPU goals read from what ``benchmarks/gpu_check.py``'s stages measured, the lines to paste into a
note, and the figures. A goal whose numbers no stage produced is NOT MEASURED (``met`` None), never passed."""
from __future__ import annotations

import statistics
from pathlib import Path


def _goal(value, target: str, met, source: str) -> dict:
    return {"value": value, "goal": target, "met": met, "source": source, "label": "measured"}


def _spread(per_repeat: list[float] | None) -> float | None:
    """Pass-to-pass spread of one configuration: (max - min) / median of its per-pass tokens/s."""
    if not per_repeat or len(per_repeat) < 2:
        return None
    return (max(per_repeat) - min(per_repeat)) / statistics.median(per_repeat)


def measured_rows(results: dict) -> list[dict]:
    """Every measured configuration of the fidelity, τ and real-size stages (each with its per-pass rates and
    timed-region report), tagged with where it came from."""
    rows = []
    for stage in ("fidelity", "tau"):
        for split, got in ((results.get(stage) or {}).get("rows") or {}).items():
            rows += [{**r, "where": f"{stage}: {split}"} for r in got]
    for name, pair in (results.get("realsize") or {}).items():
        for alpha, part in pair.get("per_alpha", {}).items():
            rows += [{**r, "config": f"N={r['N']}", "where": f"realsize {name} α={alpha}"}
                     for r in part.get("measured_b1", [])]
    return rows


def _regions(results: dict) -> dict:
    """Timed regions checked and those in which a graph or slot was made (re-run or left unclean)."""
    checked = moved = 0
    reports = [(results.get("profile") or {}).get("timed_regions")]
    reports += [r.get("timed_regions") for r in measured_rows(results)]
    for rep in filter(None, reports):
        checked += rep.get("regions", 0)
        moved += rep.get("reruns", 0) + rep.get("unclean", 0)
    for stage in ("slots", "overlap"):
        got = results.get(stage)
        if got is not None:
            checked += 1
            moved += int(bool(got.get("captures_while_timed")))
    return {"regions_checked": checked, "regions_with_a_capture_or_slot": moved}


def _heldout(results: dict) -> dict | None:
    fid = results.get("fidelity") or {}
    held = next((v for k, v in (fid.get("summary") or {}).items() if k.startswith("out-of-sample")
                 and "every" not in k), None)
    if not held:
        return None
    rows = next((v for k, v in (fid.get("rows") or {}).items() if k.startswith("out-of-sample")), [])
    theta = sum(1 for r in rows if r["N"] > 0 and r["threshold"] > 0 and not r["profile_ran_it"])
    return {"median_abs_error": held.get("median_abs_error"), "configurations": held.get("configurations"),
            "theta_gt_0_configurations": theta, "worst_abs_error": held.get("worst_abs_error"),
            "median_abs_tau_error": held.get("median_abs_tau_error"), "predicted_best": held.get("predicted_best")}


def _realsize(results: dict) -> tuple[dict, dict]:
    """Per pair: plain's MBU at B = 1 (the first α's run), and the largest |error| at B = 1 per α."""
    mbu, err = {}, {}
    for name, pair in (results.get("realsize") or {}).items():
        parts = pair.get("per_alpha", {})
        first = next(iter(parts.values()), {}).get("plain_mbu_b1") or {}
        if first:
            mbu[name] = {k: first.get(k) for k in ("mbu", "mbu_gpt_fast_convention", "card", "decode_tokens_per_s",
                                                   "bytes_per_token")}
        for alpha, part in parts.items():
            errors = [abs(r["error"]) for r in part.get("measured_b1", []) if r.get("error") is not None]
            if errors:
                err[f"{name} α={alpha}"] = max(errors)
    return mbu, err


def evaluate(results: dict, dry_run: bool, stages: dict | None = None) -> dict:
    """Every GPU goal of issue 37 from the stages' results so far (``stages``: their exits and seconds)."""
    goals = {}
    regions = _regions(results)
    goals["no_capture_after_warm_up"] = _goal(regions, "0 timed regions with a graph capture or new slot",
                                              regions["regions_with_a_capture_or_slot"] == 0
                                              if regions["regions_checked"] else None, "every stage's check")
    spreads = {f"{r['where']}: {r['config']}": s for r in measured_rows(results)
               if (s := _spread(r.get("per_repeat_tokens_per_s"))) is not None}
    worst = max(spreads.items(), key=lambda kv: kv[1]) if spreads else None
    goals["pass_to_pass_spread"] = _goal(
        {"worst": worst, "over_2pct": sum(s >= 0.02 for s in spreads.values()), "configurations": len(spreads)},
        "< 2 % per configuration", worst[1] < 0.02 if worst else None, "fidelity, tau, realsize")
    check = (results.get("profile") or {}).get("identity_check") or {}
    err = check.get("plain_error")
    goals["calibration_identity"] = _goal({"plain_error": err, "warnings": check.get("warnings")}, "|error| <= 3 %",
                                          abs(err) <= 0.03 if err is not None else None, "profile")
    held = _heldout(results)
    goals["heldout_median_abs_error"] = _goal(
        held, "<= 5 % over >= 12 configurations, theta > 0 included",
        None if not held or held["median_abs_error"] is None else
        held["median_abs_error"] <= 0.05 and held["configurations"] >= 12 and held["theta_gt_0_configurations"] > 0,
        "fidelity")
    tau = next((v for k, v in ((results.get("tau") or {}).get("summary") or {}).items() if "every" in k), None)
    tau_err = tau.get("median_abs_tau_error") if tau else None
    goals["tau_error_in_sample"] = _goal(tau_err, "<= 2 % (median |τ error|, profiled prompts)",
                                         tau_err <= 0.02 if tau_err is not None else None, "tau")
    mbu, real_err = _realsize(results)
    values = [m["mbu"] for m in mbu.values() if m.get("mbu") is not None]
    goals["mbu_b1"] = _goal(mbu, ">= 75 % (gpt-fast: ~69 % on an A100)", min(values) >= 0.75 if values else None,
                            "realsize (plain decoding, decode-only tokens/s)")
    goals["realsize_within_5pct_b1"] = _goal(real_err, "|error| <= 5 % at B = 1 (B > 1: predicted only, no batched "
                                             "engine yet)", max(real_err.values()) <= 0.05 if real_err else None,
                                             "realsize")
    goals.update(_speed_goals(results))
    prof = (stages or {}).get("profile") or {}
    goals["profile_seconds"] = _goal(prof.get("seconds"), "< 180 s (bundled pair, defaults)",
                                     prof["seconds"] < 180 if prof.get("exit") == 0 else None, "profile")
    if dry_run:
        for g in goals.values():
            g["label"] = "dry run on the CPU: numbers check the script, not a goal"
    return goals


def _speed_goals(results: dict) -> dict:
    """The hooks' cost, and part 6's speeds of the bundled pair."""
    goals = {}
    designs = (results.get("overlap") or {}).get("designs") or {}
    tax = {n: d["hook_cost_share"] for n, d in designs.items() if n in ("plain", "N=4 θ=0")}
    goals["hooks_cost"] = _goal({**tax, "theta_cost_per_draft_forward_ms":
                                 (results.get("overlap") or {}).get("theta_cost_per_draft_forward_ms")},
                                "< 2 % of the unhooked wall (or subtracted)",
                                max(tax.values()) < 0.02 if tax else None, "overlap")
    tv1 = ((results.get("profile") or {}).get("verify_ms") or {}).get("1", {}).get("1")
    goals["T_v1_mini_target_ms"] = _goal(tv1, "<= 0.5 ms graphed", tv1 <= 0.5 if tv1 is not None else None, "profile")
    held = _heldout(results)
    rows = next((v for k, v in ((results.get("fidelity") or {}).get("rows") or {}).items()
                 if k.startswith("out-of-sample")), [])
    best = next((r for r in rows if held and r["config"] == held["predicted_best"]), None)
    goals["speculative_vs_plain_at_tuned_n"] = _goal(
        {"config": best["config"], "speedup_measured": best["speedup_measured"]} if best else None,
        ">= 1.5x our plain decoding", best["speedup_measured"] >= 1.5 if best else None, "fidelity (held out)")
    return goals


def goal_lines(summary: dict) -> list[str]:
    """One line per stage (exit, seconds) and per goal (value, goal, PASS / FAIL / NOT MEASURED)."""
    head = "dry run on the CPU (numbers meaningless)" if summary["dry_run"] else "GPU"
    lines = [f"gpu_check ({head}), started {summary['started']}, "
             f"{summary.get('wall_s', '?')} s of {summary['budget_s']} s"]
    for name, s in summary["stages"].items():
        lines.append(f"  stage {name:<16} exit {s['exit']}, {s['seconds']} s")
    for name, g in summary["goals"].items():
        verdict = {True: "PASS", False: "FAIL", None: "NOT MEASURED"}[g["met"]]
        lines.append(f"  goal {name:<32} {verdict:<12} {g['goal']}: {g['value']}")
    return lines


def figures(folder: Path, results: dict) -> list[str] | dict:
    """Predicted against measured (held out; real size at B = 1) and T_v(k) per slot length, as plotly HTML
    (plotly.js from its CDN: small files); a note instead where plotly is not installed."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {"note": "plotly is not installed here: no figures (the numbers are in summary.json)"}
    written = []
    rows = [r for r in measured_rows(results) if r.get("predicted") or r.get("predicted_tokens_per_s")]
    if rows:
        fig = go.Figure()
        for where in sorted({r["where"] for r in rows}):
            got = [r for r in rows if r["where"] == where]
            fig.add_scatter(x=[r.get("measured", r.get("measured_tokens_per_s")) for r in got],
                            y=[r.get("predicted", r.get("predicted_tokens_per_s")) for r in got],
                            mode="markers", name=where, text=[r["config"] for r in got])
        top = max(max(r.get("measured", r.get("measured_tokens_per_s")) or 0 for r in rows), 1.0)
        fig.add_scatter(x=[0, top], y=[0, top], mode="lines", name="predicted = measured")
        fig.update_layout(title="predicted against measured tokens/s", xaxis_title="measured tokens/s",
                          yaxis_title="predicted tokens/s")
        written.append(_write(fig, folder / "predicted_vs_measured.html"))
    slot_rows = [r for r in (results.get("slots") or {}).get("rows", []) if r["kind"] == "verify"]
    if slot_rows:
        fig = go.Figure()
        for slot in sorted({r["slot"] for r in slot_rows}):
            got = [r for r in slot_rows if r["slot"] == slot]
            fig.add_scatter(x=[r["k"] for r in got], y=[r["median_ms"] for r in got], name=f"slot {slot}")
        fig.update_layout(title="T_v(k) of the target per slot length", xaxis_title="k", yaxis_title="ms (median)")
        written.append(_write(fig, folder / "tv_per_slot.html"))
    return written


def _write(fig, path: Path) -> str:
    fig.write_html(path, include_plotlyjs="cdn")
    return path.name
