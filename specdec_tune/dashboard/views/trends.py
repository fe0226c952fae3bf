"""Regression trends: tokens/s, τ and model error per benchmark over time, with the flagged changes."""
from __future__ import annotations

import streamlit as st

from specdec_tune.dashboard import cache, charts, ui
from specdec_tune.dashboard.trends import flagged

sel = ui.selection()
st.title("Regression trends")
info = cache.trends(sel.sources.db_url)
if info.runs == 0:
    ui.need("regress", "No regression runs yet.")
benches = st.multiselect("Benchmarks", info.benchmarks, default=list(info.benchmarks), key="trend_benches")
points = [p for p in info.points if p.benchmark in benches]
cols = st.columns(3)
cols[0].metric("Regression runs", info.runs)
cols[1].metric("Benchmarks", len(info.benchmarks))
cols[2].metric("Flagged changes", len(flagged(info)))
for metric, title, unit in (
        ("tokens_per_s", "Throughput per benchmark (measured; median over prompts, 95% bootstrap CI)", "tokens/s"),
        ("tau", "Tokens per cycle τ per benchmark (measured: new tokens ÷ cycles)", "τ"),
        ("model_error", "Model error per benchmark ((predicted − measured) ÷ measured)", "relative error")):
    if any(p.metric == metric for p in points):
        st.plotly_chart(charts.trend_chart(points, metric, title, unit), key=f"trend_{metric}")
st.header("Flagged changes")
rows = [v for v in flagged(info) if v.benchmark in benches]
if rows:
    st.dataframe([{
        "run": v.regress_run, "when": v.when, "suite": v.suite, "benchmark": v.benchmark, "metric": v.metric,
        "verdict": v.verdict, "change": ui.fmt(None if v.change is None else 100 * v.change, 1, "%"),
        "95% CI": "–" if v.change_ci is None else f"[{100 * v.change_ci[0]:+.1f}%, {100 * v.change_ci[1]:+.1f}%]",
        "p-value": ui.fmt(v.p_value, 4), "BH q-value": ui.fmt(v.q_value, 4), "why": v.reason,
    } for v in rows], hide_index=True)
else:
    st.success("No flagged change in the stored regression runs.")
