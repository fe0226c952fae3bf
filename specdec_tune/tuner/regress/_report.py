"""Render a :class:`~specdec_tune.tuner.regress.RegressReport`: markdown, JUnit XML, JSON.

JUnit: one ``testcase`` per (benchmark, metric) (classname = suite.benchmark, name = metric) with
effect size, CI, p-value, q-value, minimum detectable change and verdict as ``properties``; a
regression or a correctness failure is a ``failure``, no verdict is ``skipped``, a suspicious cell
passes with its verdict in the properties (it becomes a failure only when it persists). With
``--retune`` one more ``testcase`` per re-tuned benchmark (name ``tuning_drift``; properties moved,
old, new, loss, ci, new_study): informational, it always passes.
"""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from typing import Any

from specdec_tune.core.jsonsafe import finite
from specdec_tune.tuner.regress._compare import Cell
from specdec_tune.tuner.regress._run import RegressReport

EXIT_MEANING = {0: "nothing regressed", 1: "regression", 2: "error", 3: "no verdict possible"}


def _pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * (x - 1):+.1f}%"


def _num(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.{digits}g}"


def _change(c: Cell) -> str:
    if c.metric == "correctness":
        ties = len(c.details.get("near_ties") or {})
        tie_note = f", {ties} parted at a near-tie ({c.details.get('dtype')} rounding)" if ties else ""
        return f"{len(c.details.get('differing_prompts') or [])} prompt(s) differ{tie_note}"
    if c.metric == "model_error":
        return "—" if c.current_value is None else f"{100 * c.current_value:+.1f}% error"
    raw = c.details.get("raw_ratio")
    return _pct(c.effect) + (f" (raw {_pct(raw)})" if raw is not None else "")


def _machine_line(r: RegressReport) -> list[str]:
    ratios = [c.details["machine_ratio"] for c in r.cells if c.details.get("machine_ratio") is not None]
    if not ratios:
        return []
    lo, hi = min(ratios), max(ratios)
    span = f"{lo:.3f}" if abs(hi - lo) < 5e-4 else f"{lo:.3f}-{hi:.3f}"
    return ["", f"Machine speed: the machine probe (a fixed synthetic decoder step no code change can move) took "
                f"{span}× its baseline seconds in this run; tokens/s and latency are compared with the machine "
                "divided out (the raw change is shown beside each)."]


def _ci(c: Cell) -> str:
    if c.ci_low is not None and c.ci_high is not None and math.isfinite(c.ci_low):
        return f"[{_pct(c.ci_low)}, {_pct(c.ci_high)}]"
    diff = c.details.get("diff_ci")
    if diff:
        return f"Δ [{diff[0]:+.3f}, {diff[1]:+.3f}]"
    return "—"


def to_markdown(r: RegressReport) -> str:
    """The human summary (also what the CLI prints)."""
    lines = [f"# specdec-tune regress: suite `{r.suite}` — {r.verdict.upper()} (exit {r.exit_code}: "
             f"{EXIT_MEANING.get(r.exit_code, '?')})", ""]
    lines.append(f"Run {r.run_id}" + (f", baseline run {r.baseline_id}" if r.baseline_id else ", no baseline") +
                 f". Environment: {r.fingerprint.get('device_name')} ({r.fingerprint.get('device')}), "
                 f"{r.fingerprint.get('threads')} thread(s), torch {r.fingerprint.get('torch')}, "
                 f"transformers {r.fingerprint.get('transformers')}, specdec-tune {r.fingerprint.get('specdec_version')}"
                 f" @ {r.fingerprint.get('git_revision')}.")
    for note in r.notes:
        lines += ["", f"**Note:** {note}"]
    lines += _machine_line(r)
    if r.changes:
        lines += ["", "Changed since the baseline:", *[f"- {c}" for c in r.changes]]
    if r.explanations:
        lines += ["", "## Why (throughput model, from measured terms)"]
        lines += [f"- **{b}**: {t}" for b, t in r.explanations.items()]
    if r.calibration:
        lines += ["", "## A/A calibration (noise floor)", "",
                  "| benchmark | metric | rounds | sd of log ratio | max |change| | min. detectable change | false alarms |",
                  "|---|---|---|---|---|---|---|"]
        for row in r.calibration:
            lines.append(f"| {row['benchmark']} | {row['metric']} | {row['runs']} | {_num(row['spread_log'])} | "
                         f"{100 * row['max_abs_change']:.1f}% | {_num(100 * row['mdc'] if row['mdc'] == row['mdc'] else None)}% "
                         f"| {row['false_alarms']} |")
    if r.drift:
        lines += ["", "## Tuning drift (informational: never a failure, never changes the exit code)", "",
                  "Each study re-tuned now on a fresh profile, warm-started from its best trials; old winner, new "
                  "winner and plain decoding measured interleaved on the tuning prompts.", "",
                  "| benchmark | old winner | new winner | moved | old tokens/s, measured | new tokens/s, measured | "
                  "old loses now (95% CI) | old / new tokens/s, predicted | new study |", "|---|---|---|---|---|---|---|---|---|"]
        for d in r.drift:
            lines.append(f"| {d['benchmark']} | {d['old_label']} | {d['new_label']} | {'yes' if d['moved'] else 'no'} | "
                         f"{_num(d['old_measured_tokens_per_s'], 4)} | {_num(d['new_measured_tokens_per_s'], 4)} | "
                         f"{d['loss_text']} | {_num(d['old_predicted_tokens_per_s'], 4)} / "
                         f"{_num(d['new_predicted_tokens_per_s'], 4)} | `{d['new_study']}` |")
    lines += ["", "## Cells", "", "| benchmark | metric | verdict | baseline | current | change | 95% CI | p | q (BH) | "
              "min. detectable change |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in r.cells:
        mdc = "—" if c.mdc is None or not math.isfinite(c.mdc) else f"{100 * c.mdc:.1f}%"
        reason = c.details.get("reason")
        verdict = c.verdict + (f" ({reason})" if reason else "")
        lines.append(f"| {c.benchmark} | {c.metric} | {verdict} | {_num(c.baseline_value)} | {_num(c.current_value)} | "
                     f"{_change(c)} | {_ci(c)} | {_num(c.p_value, 2)} | {_num(c.q_value, 2)} | {mdc} |")
    lines += ["", "Rule: a drop larger than min_drop whose Benjamini-Hochberg adjusted p-value (q) is at most the "
              "suite's q is flagged; flagged in `persist` consecutive runs = regression, once = suspicious. "
              "Speed: Mann-Whitney U on per-prompt samples aligned by prompt, 95% bootstrap CI of the ratio of "
              "medians; acceptance: two-proportion test per position (α_i, conditional)."]
    return "\n".join(lines) + "\n"


def to_junit(r: RegressReport) -> str:
    """JUnit XML: one testcase per (benchmark, metric)."""
    failures = sum(c.verdict in ("regression", "fail") for c in r.cells)
    skipped = sum(c.verdict == "no_verdict" for c in r.cells)
    root = ET.Element("testsuites", name="specdec-tune regress")
    suite = ET.SubElement(root, "testsuite", name=r.suite, tests=str(len(r.cells)), failures=str(failures),
                          errors="0", skipped=str(skipped))
    props = ET.SubElement(suite, "properties")
    for k, v in (("run_id", r.run_id), ("baseline_id", r.baseline_id), ("verdict", r.verdict), ("exit_code", r.exit_code)):
        ET.SubElement(props, "property", name=k, value="" if v is None else str(v))
    for c in r.cells:
        case = ET.SubElement(suite, "testcase", classname=f"{r.suite}.{c.benchmark}", name=c.metric, time="0")
        cp = ET.SubElement(case, "properties")
        values: dict[str, Any] = {"verdict": c.verdict, "effect_size": c.effect, "ci_low": c.ci_low, "ci_high": c.ci_high,
                                  "p_value": c.p_value, "q_value": c.q_value, "min_detectable_change": c.mdc,
                                  "baseline": c.baseline_value, "current": c.current_value,
                                  **{k: c.details[k] for k in ("machine_ratio", "raw_ratio") if k in c.details}}
        for k, v in values.items():
            ET.SubElement(cp, "property", name=k, value="" if v is None else str(v))
        text = c.explanation or c.details.get("reason") or ""
        if c.verdict in ("regression", "fail"):
            ET.SubElement(case, "failure", message=f"{c.metric} {c.verdict}: {_change(c)}", type=c.verdict).text = text
        elif c.verdict == "no_verdict":
            ET.SubElement(case, "skipped", message=text or "no verdict")
        elif c.verdict == "suspicious":
            ET.SubElement(case, "system-out").text = f"suspicious (first flagged run): {_change(c)} {text}"
    for d in r.drift:  # informational: never a failure (regress --retune)
        case = ET.SubElement(suite, "testcase", classname=f"{r.suite}.{d['benchmark']}", name="tuning_drift", time="0")
        cp = ET.SubElement(case, "properties")
        ci = d["loss_ci"]
        values = {"moved": d["moved"], "old": d["old_label"], "new": d["new_label"], "loss": f"{100 * d['loss']:+.1f}%",
                  "ci": f"{100 * ci[0]:+.1f}..{100 * ci[1]:+.1f}%" if ci else None, "new_study": d["new_study"]}
        for k, v in values.items():
            ET.SubElement(cp, "property", name=k, value="" if v is None else str(v))
        ET.SubElement(case, "system-out").text = d["text"]
    suite.set("tests", str(len(r.cells) + len(r.drift)))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def to_json(r: RegressReport) -> dict[str, Any]:
    """One JSON object (NaN and infinities as null)."""
    return finite({
        "suite": r.suite, "kind": r.kind, "run_id": r.run_id, "baseline_id": r.baseline_id, "verdict": r.verdict,
        "exit_code": r.exit_code, "exit_meaning": EXIT_MEANING.get(r.exit_code), "fingerprint": r.fingerprint,
        "changes": r.changes, "notes": r.notes, "explanations": r.explanations, "calibration": r.calibration,
        "drift": r.drift,
        "cells": [{"benchmark": c.benchmark, "metric": c.metric, "verdict": c.verdict, "baseline": c.baseline_value,
                   "current": c.current_value, "effect": c.effect, "ci": [c.ci_low, c.ci_high], "p_value": c.p_value,
                   "q_value": c.q_value, "min_detectable_change": c.mdc, "explanation": c.explanation,
                   "details": c.details} for c in r.cells],
    })
