"""The loaders, cached for Streamlit: one database connection per URL, data for ``TTL_S`` seconds.

Pages call these (never the database directly). ``st.cache_data`` keys on the plain arguments (URLs,
ids, names), so two browser tabs share the work; the sidebar's "Reload data" clears the caches
when a profile or a tuning has just written new rows.
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from specdec_tune.dashboard.measured import FidelityInfo, load_fidelity
from specdec_tune.dashboard.operator import OperatorInfo, load_operator
from specdec_tune.dashboard.overview import OverviewInfo, load_overview
from specdec_tune.dashboard.profile_info import ProfileInfo, load_profile_info
from specdec_tune.dashboard.sources import Sources, resolve_sources
from specdec_tune.dashboard.studies import (
    StudyInfo,
    StudyRow,
    export_files,
    list_studies,
    load_study,
    open_storage,
    study_info,
)
from specdec_tune.dashboard.study_charts import study_figures as build_study_figures
from specdec_tune.dashboard.trends import TrendsInfo, load_trends
from specdec_tune.dashboard.wiring import ExportFiles
from specdec_tune.dashboard.why import CycleBudget, WhyInfo, chosen_budget, load_why
from specdec_tune.db import Database, RunRecord, list_runs, open_database
from specdec_tune.tuner.model import TuningResult

TTL_S = 60


def sources() -> Sources:
    """The URLs this app reads (``SPECDEC_DB`` / ``SPECDEC_STORAGE``, set by ``specdec-tune dashboard``)."""
    return resolve_sources()


@st.cache_resource(show_spinner=False)
def database(url: str) -> Database:
    return open_database(url)


@st.cache_resource(show_spinner=False)
def storage(url: str | None) -> Any | None:
    return open_storage(url)


def clear() -> None:
    st.cache_data.clear()
    st.cache_resource.clear()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def runs(db_url: str) -> tuple[RunRecord, ...]:
    return tuple(list_runs(database(db_url)))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def operator(db_url: str, run_ids: tuple[int, ...]) -> OperatorInfo:
    return load_operator(database(db_url), run_ids)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def studies(storage_url: str | None) -> tuple[StudyRow, ...]:
    return tuple(list_studies(storage(storage_url)))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def trends(db_url: str) -> TrendsInfo:
    return load_trends(database(db_url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def overview(db_url: str, storage_url: str | None) -> OverviewInfo:
    return load_overview(database(db_url), studies(storage_url), trends(db_url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def profile(db_url: str, run_id: int) -> ProfileInfo:
    return load_profile_info(database(db_url), run_id)


@st.cache_data(ttl=TTL_S, show_spinner="Predicting the (N, θ) grid with the tuner's model ...")
def why(db_url: str, run_id: int, batch_size: int) -> WhyInfo:
    return load_why(database(db_url), run_id, batch_size=batch_size)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def chosen(db_url: str, run_id: int, candidate_json: str, batch_size: int, temperature: float) -> CycleBudget | None:
    import json

    from specdec_tune.tuner.model import Candidate

    return chosen_budget(database(db_url), run_id, Candidate.from_dict(json.loads(candidate_json)), batch_size,
                         temperature)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def fidelity(db_url: str, run_ids: tuple[int, ...] | None, draft: str | None) -> FidelityInfo:
    db = database(db_url)
    chosen = None if run_ids is None else [r for r in runs(db_url) if r.id in set(run_ids)]
    return load_fidelity(db, chosen, draft)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def study(storage_url: str, name: str, trials: int) -> tuple[StudyInfo, dict[str, Any]]:
    """The study's summary and Optuna's own plotly figures, from one snapshot of its trials.

    ``trials`` (the study's trial count) is part of the key, so new trials redraw the figures.
    """
    snap = load_study(storage(storage_url), name)
    return study_info(snap), build_study_figures(snap)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def exports(result_json: str) -> ExportFiles:
    import json

    return export_files(TuningResult.from_dict(json.loads(result_json)))


__all__ = ["clear", "database", "exports", "fidelity", "overview", "profile", "runs", "sources", "storage",
           "studies", "study", "trends", "why"]
