"""Why it wins: where a cycle's time goes, the (N, θ) map per draft, what each server can express."""
from __future__ import annotations

import json

import streamlit as st

from specdec_tune.dashboard import cache, charts, ui
from specdec_tune.dashboard.measured import short_name
from specdec_tune.dashboard.servers_info import server_rows
from specdec_tune.dashboard.why import CHOSEN
from specdec_tune.tuner.model import SEARCH_BASIS, Candidate

sel = ui.selection()
st.title("Why it wins")
if sel.run is None:
    ui.need("profile", "No profile run matches the selection.")
sizes = list(sel.run.settings.batch_sizes) or [1]
batch = st.selectbox("Batch size B", sizes, key="why_batch") if len(sizes) > 1 else sizes[0]
info = cache.why(sel.sources.db_url, sel.run.id, int(batch))
ui.synthetic_banner(sel.run)
for note in info.skipped:
    st.warning(f"Not predicted: {note}")
if not info.ranked:
    ui.need("profile", "This run has no acceptance traces to predict from.")

best = info.ranked[0]
# The newest study that tuned this run leads the page: its winner is what the tuner chose and measured.
tuned = [s.result for s in cache.studies(sel.sources.storage_url) if s.result and s.result.run_id == sel.run.id]
picks = [(r, cache.chosen(sel.sources.db_url, sel.run.id, json.dumps(r.candidate.to_dict()), info.batch_size,
                          r.temperature)) for r in tuned]
lead = next((pick for _, pick in picks if pick is not None), None) or best
heading = "The tuner's choice" if lead is not best else "Best"
st.subheader(f"{heading} (predicted): {lead.label.removeprefix(CHOSEN)}")
cols = st.columns(4)
cols[0].metric("Predicted tokens/s", ui.fmt(lead.tokens_per_s), help="end to end, prefill included")
cols[1].metric("Predicted speedup", ui.fmt(lead.speedup, 2, "×"), help="over the plain decoding predicted beside it")
cols[2].metric("E[τ] tokens per cycle", ui.fmt(lead.tokens_per_cycle, 2))
cols[3].metric("Plain decoding (predicted)", ui.fmt(info.baseline.tokens_per_s), help="tokens/s, end to end")
for r in tuned:
    st.success(f"The tuner chose {r.candidate.label()} for {r.server}"
               + (f": measured speedup {r.speedup:.2f}× on held-out prompts" if r.speedup and r.heldout else ""))
if lead is not best:
    st.caption(f"Best of the (N, θ) grid below (predicted): {best.label}, {ui.fmt(best.tokens_per_s)} tokens/s, "
               f"{ui.fmt(best.speedup, 2, '×')}. The tuner also searches schedules and n-gram lookup, measures its "
               "best predictions and keeps the fastest measured.")

st.header("Where a cycle's time goes")
budgets = [*info.ranked, info.baseline]
for _, pick in picks:
    if pick is not None:
        budgets.insert(0, pick)
st.plotly_chart(charts.budget_chart(budgets), key="budget")
st.dataframe([{
    "configuration": b.label, "E[τ] (tokens per cycle)": ui.fmt(b.tokens_per_cycle, 2),
    "E[L] drafted": ui.fmt(b.draft_length, 2), "draft ms/cycle": ui.fmt(b.draft_ms, 2),
    "verify ms/cycle": ui.fmt(b.verify_ms, 2), "overhead ms/cycle": ui.fmt(b.overhead_ms, 2),
    "ms per token": ui.fmt(b.ms_per_token, 2), "tokens/s": ui.fmt(b.tokens_per_s), "speedup": ui.fmt(b.speedup, 2, "×"),
    "source": b.source,
} for b in budgets], hide_index=True)
st.caption("All predicted by the tuner's model from this run's measurements (B = "
           f"{info.batch_size}), for {SEARCH_BASIS}; tokens/s end to end, per-cycle times decode only; every "
           "speedup is over the plain decoding row.")

st.header("Throughput over N and θ per draft")
maps = [m for m in info.heatmaps if sel.draft is None or m.draft == sel.draft]
for i, hm in enumerate(maps):
    st.plotly_chart(charts.heatmap_chart(hm), key=f"heat_{i}")
    if hm.measured:
        st.dataframe([{
            "draft": short_name(hm.draft), "N": m.num_speculative_tokens, "θ": m.threshold,
            "measured tokens/s": ui.fmt(m.measured), "95% CI": ui.ci_text(m.ci), "predicted": ui.fmt(m.predicted),
            "prompts": m.split} for m in hm.measured], hide_index=True)

st.header("What each server can express")
rows = server_rows(info)
if rows is None:
    st.info("The server capability table is not wired into this dashboard: start it with `specdec-tune dashboard`.")
else:
    shown = [r for r in rows if sel.server == "any" or r.server == sel.server]
    st.dataframe([{
        "server": r.title, "best inside its space (predicted)": r.best, "tokens/s": ui.fmt(r.tokens_per_s),
        "speedup": ui.fmt(r.speedup, 2, "×"), "cannot express the overall best": r.cannot or "– (it can)",
        **r.capabilities, "checked against": r.version,
    } for r in shown], hide_index=True)
    st.caption("Best of the (draft, N, θ) grid above that each server can run, as the capability table (tuner.servers) decides; "
               "the tuning study also searches schedules and n-gram sizes.")
    for r in shown:
        with st.expander(f"{r.title}: what to know"):
            for note in r.notes:
                st.markdown(f"- {note}")
    for r in tuned:
        if r.best_per_server:
            st.subheader(f"Best per server found by the tuner (study {r.study})")
            st.dataframe([{"server": name, "configuration": Candidate.from_dict(b).label(),
                           "predicted tokens/s": ui.fmt(b.get("predicted_tokens_per_s")),
                           "predicted for": b.get("predicted_basis") or "–",
                           "measured tokens/s": ui.fmt(b.get("measured_tokens_per_s"))}
                          for name, b in sorted(r.best_per_server.items())], hide_index=True)
