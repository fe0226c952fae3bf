"""Overview: what is in the database, and the best configuration per target, hardware, workload, server."""
from __future__ import annotations

import streamlit as st

from specdec_tune.dashboard import cache, ui
from specdec_tune.dashboard.measured import short_name
from specdec_tune.dashboard.overview import best_tables
from specdec_tune.dashboard.trends import FLAGGED
from specdec_tune.tuner.model import SEARCH_BASIS

sel = ui.selection()
st.title("Overview")
info = cache.overview(sel.sources.db_url, sel.sources.storage_url)
if info.empty:
    st.info("The database is empty: nothing has been profiled or tuned yet. Start with a profile "
            "(it measures T_s, T_v(k) and acceptance on your hardware), then measure or tune:")
    st.code(ui.commands("profile", "measure", "tune"), language="bash")
    st.stop()

cols = st.columns(5)
cols[0].metric("Profile runs", info.run_count)
cols[1].metric("Measured configurations", info.measured_count)
cols[2].metric("Tuning studies", len(info.studies))
cols[3].metric("Regression runs", info.regress_runs)
cols[4].metric("Hardware", len(info.hardware))

st.header("Best configuration per target, hardware, workload and server")
best = [b for b in info.best
        if (sel.server == "any" or b.server in (sel.server, "engine (measured)"))
        and (sel.target is None or b.target == short_name(sel.target))
        and (sel.workload is None or b.workload == short_name(sel.workload))]
if best:
    for (target, hardware, workload), rows in best_tables(best).items():
        st.markdown(f"**{target}** on {hardware}, workload **{workload}**")
        st.dataframe(rows, hide_index=True)
    st.caption("Tokens/s and speedup measured, with their 95% CI; predicted: the model's tokens/s for the prompts "
               "measured, rescaled to the machine speed measured in the same passes. "
               "Speedup = measured tokens/s ÷ plain decoding measured the same way. In-sample rows ran the "
               "profile's own prompts; a tuning's winner is confirmed on held-out prompts. A study's rows for "
               "other servers hold the best inside each server's space.")
else:
    st.info("No measured configuration matches the selection yet. Measure one or tune:")
    st.code(ui.commands("measure", "tune"), language="bash")

st.header("Latest runs")
st.dataframe([r.__dict__ for r in info.runs], hide_index=True)

st.header("Tuning studies")
if info.studies:
    st.dataframe([{
        "study": s.name, "trials": s.trials, "objectives": ", ".join(s.directions),
        "search's best (predicted)": f"{s.best_label}: {ui.fmt(s.best_values[0])}" if s.best_values else "–",
        "server": s.result.server if s.result else "–",
        "winner (best measured)": s.result.candidate.label() if s.result else "not finished",
        "held-out speedup": ui.fmt(s.result.speedup, 2, "×") if s.result else "–",
    } for s in info.studies], hide_index=True)
    st.caption(f"The search's best is the best trial, predicted for {SEARCH_BASIS}; the winner is the best measured "
               "of the search's top predictions, so the two can differ.")
else:
    st.info(f"No tuning studies yet (storage: {sel.sources.display_storage}). Run:")
    st.code(ui.commands("tune"), language="bash")

st.header("Regression verdicts")
hot = [v for v in info.verdicts if v.verdict in FLAGGED]
if hot:
    st.dataframe([{
        "run": v.regress_run, "when": v.when, "benchmark": v.benchmark, "metric": v.metric, "verdict": v.verdict,
        "change": ui.fmt(None if v.change is None else 100 * v.change, 1, "%"), "p-value": ui.fmt(v.p_value, 4),
        "why": v.reason,
    } for v in sorted(hot, key=lambda v: -v.regress_run)[:20]], hide_index=True)
elif info.regress_runs:
    st.success(f"No flagged change in {info.regress_runs} regression runs.")
else:
    st.info("No regression runs yet: run `specdec-tune regress`.")

left, mid, right = st.columns([1, 2, 1])  # the models table has the most columns
with left:
    st.subheader("Hardware")
    st.dataframe([{"hardware": h} for h in info.hardware], hide_index=True)
with mid:
    st.subheader("Models")
    st.dataframe([{"model": short_name(n), "role": role, "parameters": "–" if p is None else f"{p:,}",
                   "layers": "–" if layers is None else str(layers)}
                  for n, role, p, layers in info.models], hide_index=True)
with right:
    st.subheader("Workloads")
    st.dataframe([{"workload": short_name(n), "prompts": p, "runs": c} for n, p, c in info.workloads],
                 hide_index=True)
