"""Tuning study: Optuna's figures, the per-batch-size schedule and the export downloads."""
from __future__ import annotations

import json

import streamlit as st

from specdec_tune.dashboard import cache, ui
from specdec_tune.dashboard.measured import short_name
from specdec_tune.dashboard.studies import export_formats, objective_text, trial_label, zip_files
from specdec_tune.dashboard.study_charts import schedule_chart
from specdec_tune.core.errors import SpecdecError
from specdec_tune.tuner.model import SEARCH_BASIS

sel = ui.selection()
st.title("Tuning study")
storage_url = sel.sources.storage_url
rows = list(cache.studies(storage_url))
rows = [s for s in rows if s.result is None or (
    (sel.server == "any" or s.result.server == sel.server)
    and (sel.target is None or short_name(s.result.target) == short_name(sel.target))
    and (sel.workload is None or short_name(s.result.workload) == short_name(sel.workload)))]
if storage_url is None or not rows:
    ui.need("tune", f"No tuning study found (storage: {sel.sources.display_storage}).")
# The study that tuned the selected run comes first; otherwise the newest.
rows.sort(key=lambda s: not (s.result is not None and sel.run is not None and s.result.run_id == sel.run.id))
name = st.selectbox("Study", [s.name for s in rows], key="study_name",
                    format_func=lambda n: f"{n} ({next(s.trials for s in rows if s.name == n)} trials)")
info, figs = cache.study(storage_url, name, next(s.trials for s in rows if s.name == name))
result = info.result

cols = st.columns(4)
cols[0].metric("Trials", info.row.trials)
cols[1].metric("Completed", info.complete)
if not info.row.multi_objective and info.best and info.best[0].values:
    cols[2].metric(f"Best {info.objective_names[0]} (predicted)", ui.fmt(info.best[0].values[0]),
                   help=f"trial {info.best[0].number}: {trial_label(info.best[0])}, predicted for {SEARCH_BASIS}")
else:
    cols[2].metric("Pareto-optimal trials", len(info.best))
cols[3].metric("Pruned or failed", info.states.get("PRUNED", 0) + info.states.get("FAIL", 0),
               help="trials the model could not predict (pruned) or that raised")
st.caption("Objectives: " + ", ".join(f"{n} ({d})" for n, d in zip(info.objective_names, info.row.directions))
           + " · every trial value is predicted by the model")
if result is not None:
    st.success(f"Winner for {result.server}: {result.candidate.label()} · measured "
               f"{ui.fmt(result.measured_tokens_per_s)} tokens/s ({'held-out' if result.heldout else 'in-sample'}) · "
               f"predicted {ui.fmt(result.predicted_tokens_per_s)}"
               + (f" (for {result.predicted_basis})" if result.predicted_basis else "")
               + f" · speedup {ui.fmt(result.speedup, 2, '×')} "
               f"95% CI {ui.ci_text(result.speedup_ci, 2)}")
else:
    st.info("This study holds no finished tuning result yet (still running, or interrupted: rerun the same "
            "`specdec-tune tune` command to resume it).")

if not figs:
    st.info("No completed trial yet.")
left, right = st.columns(2)
for col, key, title in ((left, "history", "Optimisation history"), (right, "importance", "Parameter importance")):
    if key in figs:
        col.subheader(title)
        col.plotly_chart(figs[key], key=f"study_{key}")
if "pareto" in figs:
    st.subheader("Pareto front")
    st.plotly_chart(figs["pareto"], key="study_pareto")

st.header("Best configurations in the study")
st.dataframe([{
    "trial": t.number, **{n: objective_text(n, v) for n, v in zip(info.objective_names, t.values or ())},
    "configuration": trial_label(t), "predicted speedup": ui.fmt(t.user_attrs.get("predicted_speedup"), 2, "×"),
    "E[τ]": ui.fmt(t.user_attrs.get("expected_tokens_per_cycle"), 2), "source": t.user_attrs.get("source", "–"),
} for t in info.top], hide_index=True)
st.caption(f"Trial values are the model's predictions for {SEARCH_BASIS} (the tuner measures only its top "
           "candidates; the winner's prediction above is for the prompts it was measured on). Each predicted speedup "
           "is over plain decoding as the search predicts it.")

st.header("Per-batch-size schedule")
if info.per_batch_size:
    st.plotly_chart(schedule_chart(info.per_batch_size), key="schedule")
else:
    st.info("The study stored no per-batch-size schedule (tune with --batch-sizes 1,4,16,64).")

st.header("Exports")
formats = export_formats()
if result is None:
    st.info("Exports need a finished tuning result.")
elif not formats:
    st.info("The exporters are not wired into this dashboard: start it with `specdec-tune dashboard`.")
else:
    files, left_out = {}, {}
    try:
        bundle = cache.exports(json.dumps(result.to_dict()))
        files, left_out = bundle.files, bundle.left_out
    except SpecdecError as exc:
        st.warning(f"Export failed: {exc}")
    except Exception as exc:  # noqa: BLE001 - a broken exporter must not take the study page down
        st.warning(f"Export failed ({type(exc).__name__}: {exc}); `specdec-tune export` shows the same error")
    for fmt, why in left_out.items():  # e.g. llamacpp without its GGUF files: its flags would point at nothing
        st.warning(f"**{fmt}** is not in the downloads: {why}")
    if files:
        st.caption("What each server reads as-is; README.md says how to pass each file and what a server "
                   "cannot express. Same files as `specdec-tune export --study NAME --format all`.")
        st.download_button("Download all (zip)", zip_files(files), file_name=f"{name}-exports.zip",
                           mime="application/zip", key="export_zip", type="primary")
        cols = st.columns(3)
        for i, fmt in enumerate([f for f in (*formats, "readme") if f in files]):
            with cols[i % 3]:
                st.markdown(f"**{fmt}**" + ("" if files[fmt] else ": cannot express this configuration (see README)"))
                for j, (path, data) in enumerate(files[fmt].items()):
                    st.download_button(f"Download {path}", data, file_name=path.replace("/", "_"),
                                       key=f"export_{fmt}_{j}")
