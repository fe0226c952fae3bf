"""Model vs measurement: predicted vs measured tokens/s, in-sample and held-out apart, and the errors."""
from __future__ import annotations

import streamlit as st

from specdec_tune.dashboard import cache, charts, ui

sel = ui.selection()
st.title("Model vs measurement")
if not sel.runs:
    ui.need("profile", "No profile run matches the selection.")
scope = st.radio("Runs", ["selected run", "all runs matching the filters"], horizontal=True, key="fid_scope")
ids = (sel.run.id,) if scope == "selected run" and sel.run else tuple(r.id for r in sel.runs)
info = cache.fidelity(sel.sources.db_url, ids, sel.draft)
if not info.points:
    if len(ids) == 1:  # the selected run has none: say which runs matching the filters have some
        others = sorted({p.run_id for p in cache.fidelity(sel.sources.db_url, tuple(r.id for r in sel.runs),
                                                          sel.draft).points})
        if others:
            st.info(f"Measured configurations with predictions are in run{'s' if len(others) > 1 else ''} "
                    f"{', '.join(map(str, others))}: select one in the sidebar, or show all runs matching the filters.")
    where = f"run {ids[0]}" if len(ids) == 1 else "these runs"
    ui.need("measure", f"No measured configuration with a prediction in {where} yet.")

for r in (r for r in sel.runs if r.id in {p.run_id for p in info.points}):
    ui.synthetic_banner(r)
st.plotly_chart(charts.fidelity_chart(info), key="fidelity")
st.header("Error table")
st.dataframe([{
    "prompts": s.split, "configurations": s.count, "median |error|": ui.fmt(100 * s.median_abs_error, 1, "%"),
    "worst |error|": ui.fmt(100 * s.worst_abs_error, 1, "%"),
    "inside measured 95% CI": "no CIs stored" if s.inside_ci is None else f"{100 * s.inside_ci:.0f}% of {s.with_ci}",
    "Spearman": ui.fmt(s.spearman, 3), "regret": ui.fmt(None if s.regret is None else 100 * (1 - s.regret), 1, "%"),
} for s in info.summaries], hide_index=True)
st.caption("error = (predicted − measured) ÷ measured tokens/s. Regret = 1 − measured tokens/s of the "
           "predicted best ÷ the measured best, among configurations measured on the same prompts. "
           "Held-out rows are the honest test: in-sample rows ran the prompts the profile recorded.")
if info.unpredicted:
    st.caption(f"{info.unpredicted} measured rows carry no prediction (plain-decoding baselines, older rows).")

st.header("Measured configurations")
st.dataframe([{
    "run": p.run_id, "configuration": p.label, "prompts": p.split, "measured tokens/s": ui.fmt(p.measured),
    "95% CI": ui.ci_text(p.ci), "predicted tokens/s": ui.fmt(p.predicted), "error": ui.fmt(100 * p.error, 1, "%"),
    "inside CI": "–" if p.inside_ci is None else ("yes" if p.inside_ci else "no"),
    "measured τ": ui.fmt(p.measured_tau, 2), "predicted τ": ui.fmt(p.predicted_tau, 2),
} for p in info.points], hide_index=True)

ops = cache.operator(sel.sources.db_url, ids)
if ops.rows:
    st.header("What operators pay for")
    rows = []
    for r in ops.rows:
        row = {"run": r.run_id, "configuration": r.label, "prompts": r.split,
               "TTFT p50 ms (measured)": ui.fmt(None if r.ttft_p50_s is None else 1e3 * r.ttft_p50_s, 1),
               "TPOT p50 ms (measured)": ui.fmt(None if r.tpot_p50_s is None else 1e3 * r.tpot_p50_s, 2),
               "TPOT p50 95% CI": ui.ci_text(None if r.tpot_p50_ci is None else
                                             (1e3 * r.tpot_p50_ci[0], 1e3 * r.tpot_p50_ci[1]), 2),
               "TPOT p90 ms (measured)": ui.fmt(None if r.tpot_p90_s is None else 1e3 * r.tpot_p90_s, 2),
               "TPOT p99 ms (measured)": ui.fmt(None if r.tpot_p99_s is None else 1e3 * r.tpot_p99_s, 2),
               "TPOT p50 / p90 ms (predicted)": "–" if r.predicted_tpot_p50_s is None else
               f"{1e3 * r.predicted_tpot_p50_s:.2f} / {1e3 * (r.predicted_tpot_p90_s or 0):.2f}",
               "tokens per arrival": ui.fmt(r.mean_burst, 2)}
        if ops.has_energy:  # only where NVML measured it: a CPU has no energy column at all
            row["J/token (measured)"] = ui.fmt(r.joules_per_token, 3)
            row["J/token 95% CI"] = ui.ci_text(r.joules_per_token_ci, 3)
        if ops.has_cost:
            row["$ per M tokens (measured)"] = ui.fmt(r.usd_per_million_tokens, 4)
            row["$ 95% CI"] = ui.ci_text(r.usd_ci, 4)
        if ops.has_memory:
            row["peak MiB (measured)"] = ui.fmt(None if r.peak_memory_bytes is None else r.peak_memory_bytes / 2**20, 1)
            row["MiB (predicted)"] = ui.fmt(None if r.predicted_memory_bytes is None else
                                            r.predicted_memory_bytes / 2**20, 1)
        rows.append(row)
    st.dataframe(rows, hide_index=True)
    st.caption("TPOT is the decode window of each request, (last token - first token) / (tokens - 1): under "
               "speculation tokens arrive in bursts, so the gap between arrivals is not a time per token. A "
               "prompt's TTFT and TPOT are the medians of its repeats; percentiles are over prompts. Energy comes "
               "from NVML's energy counter and is shown only where it was measured (never on a CPU). Cost is "
               "dollars per million tokens at the --gpu-price given when measuring.")
