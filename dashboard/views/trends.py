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
st.metric("Regression runs", info.runs)
for metric, title in (("tokens_per_s", "Throughput per benchmark (measured tokens/s)"),
                      ("tau", "Tokens per cycle τ per benchmark (measured)"),
                      ("model_error", "Model error per benchmark ((predicted − measured) ÷ measured)")):
    if any(p.metric == metric for p in info.points):
        st.plotly_chart(charts.trend_chart(info.points, metric, title), key=f"trend_{metric}")
st.header("Flagged changes")
rows = flagged(info)
if rows:
    st.dataframe([{"when": v.when, "benchmark": v.benchmark, "metric": v.metric, "verdict": v.verdict,
                   "change": ui.fmt(None if v.change is None else 100 * v.change, 1, "%"),
                   "p-value": ui.fmt(v.p_value, 4), "why": v.reason} for v in rows], hide_index=True)
else:
    st.success("No flagged change in the stored regression runs.")
