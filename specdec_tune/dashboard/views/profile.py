"""Profile run: T_s, T_v(k), acceptance per position and per confidence, telemetry (all measured)."""
from __future__ import annotations

import streamlit as st

from specdec_tune.dashboard import cache, charts, ui
from specdec_tune.dashboard.measured import short_name
from specdec_tune.dashboard.overview import hardware_label

sel = ui.selection()
st.title("Profile run")
if sel.run is None:
    ui.need("profile", "No profile run matches the selection.")
info = cache.profile(sel.sources.db_url, sel.run.id)
run = info.run
st.caption(f"run {run.id} ({run.status}) · target {short_name(run.target.name)} · workload "
           f"{short_name(run.workload.name) if run.workload else '–'} · {hardware_label(run.hardware)} · "
           f"N_max {run.settings.n_max} · typical context {info.typical_context or '–'} tokens · "
           f"forward {run.settings.forward}")

ui.synthetic_banner(sel.run)
st.header("Acceptance (vLLM's panels)")
panels = [p for p in info.acceptance if sel.draft is None or p.draft == sel.draft]
if not panels:
    st.info("This run stored no acceptance yet (it may still be running or was interrupted).")
for p in panels:
    cols = st.columns(5)
    cols[0].markdown(f"**{short_name(p.draft)}** ({p.mode}{f', T={p.temperature:g}' if p.mode == 'sampling' else ''})")
    cols[1].metric("Acceptance rate", ui.fmt(None if p.acceptance_rate is None else 100 * p.acceptance_rate, 1, "%"),
                   help="accepted ÷ drafted tokens (θ = 0, N = N_max), measured")
    cols[2].metric("Mean acceptance length", ui.fmt(p.mean_acceptance_length, 2),
                   help="E[τ] = 1 + accepted ÷ cycles at N_max, measured")
    cols[3].metric("Cycles recorded", p.cycles)
    cols[4].metric("1 − TV (teacher-forced)", ui.fmt(p.one_minus_tv, 3))
if panels:
    left, right = st.columns(2)
    left.plotly_chart(charts.acceptance_chart(panels, "alpha"), key="alpha")
    right.plotly_chart(charts.acceptance_chart(panels, "beta"), key="beta")
    st.plotly_chart(charts.calibration_chart(panels, info.thresholds), key="calibration")

fronts = [d for d in run.draft_names if info.front(d) and (sel.draft is None or d == sel.draft)]
if fronts:
    st.header("Lossy acceptance: rejection vs bias")
    st.caption("Decoding-OPT accepts a draft token with min(1, (p + ε)/q) and resamples from Theorem 4's optimal "
               "distribution; Decoding-UNO accepts the same and resamples from p. Theory: exact from p and q at "
               "teacher-forced positions of target-sampled text; measured: lossy decoding runs of the profile.")
    for d in fronts:
        st.plotly_chart(charts.bias_front_chart(info.front(d), d), key=f"front-{d}")

st.header("Timings")
left, right = st.columns(2)
with left:
    if info.verify:
        st.plotly_chart(charts.verify_chart(info), key="verify")
    else:
        st.info("No T_v(k) samples stored for this run.")
with right:
    drafts = None if sel.draft is None else [sel.draft]
    if info.draft_steps:
        st.plotly_chart(charts.draft_step_chart(info, drafts), key="draft_step")
    else:
        st.info("No draft-model step timings (an n-gram drafter runs no model).")
if any(len(by_b) > 1 for by_b in info.draft_steps.values()):
    st.plotly_chart(charts.draft_step_batch_chart(info, drafts), key="draft_step_b")
if info.ar_step is not None:
    st.caption(f"T_ar in the plain decoding loop: median {info.ar_step.median_ms:.2f} ms "
               f"(p10 {info.ar_step.p10_ms:.2f}, p90 {info.ar_step.p90_ms:.2f}, {info.ar_step.n} steps, measured)")

st.header("Telemetry")
if info.telemetry:
    st.plotly_chart(charts.telemetry_chart(info), key="telemetry")
else:
    st.info(f"No NVML telemetry in this run (device: {run.hardware.device}; NVML needs a GPU and "
            "`pip install 'specdec-tune[gpu]'`).")
