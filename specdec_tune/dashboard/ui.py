"""The sidebar's selection widgets (target, hardware, workload, run, draft, server) and small renderers
shared by the pages. The filtering itself is pure (:func:`filter_runs`) and tested without Streamlit.

The selection rides in the page's URL (``?run=3&draft=ngram``): every page keeps it, and a reload, a
bookmark or a link opens on it instead of on the newest run.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import streamlit as st

from specdec_tune.dashboard import cache
from specdec_tune.dashboard.measured import short_name
from specdec_tune.dashboard.overview import hardware_label, run_label, synthetic_note
from specdec_tune.dashboard.servers_info import server_names
from specdec_tune.dashboard.sources import Sources, first_command
from specdec_tune.dashboard.studies import newest_tuned_run
from specdec_tune.db import RunRecord

ALL = "all"
_KEY = "specdec_selection"
# Each sidebar widget's key and the URL query parameter that carries its choice.
_PARAMS = {"sel_target": "target", "sel_hardware": "hardware", "sel_workload": "workload", "sel_run": "run",
           "sel_draft": "draft", "sel_server": "server"}


@dataclass(frozen=True)
class Selection:
    """What the sidebar selected; ``None`` means "all" (or nothing to choose from)."""

    sources: Sources
    runs: tuple[RunRecord, ...]  # the runs that match target, hardware and workload
    run: RunRecord | None
    draft: str | None
    server: str
    target: str | None = None
    hardware: str | None = None
    workload: str | None = None

    @property
    def drafts(self) -> list[str]:
        """The selected draft, or every draft of the selected run."""
        if self.run is None:
            return []
        return [self.draft] if self.draft else self.run.draft_names


def filter_runs(runs: Sequence[RunRecord], target: str | None = None, hardware: str | None = None,
                workload: str | None = None) -> list[RunRecord]:
    """The runs whose target, hardware label and workload match (``None``: any)."""
    return [r for r in runs
            if (target is None or r.target.name == target)
            and (hardware is None or hardware_label(r.hardware) == hardware)
            and (workload is None or (r.workload.name if r.workload else None) == workload)]


def _from_url(key: str, options: Sequence, first: object = None) -> None:
    """A new session (a reload, a bookmark, a link) starts from the choice its URL carries, if offered,
    else from ``first`` (when given and offered), else from the first option."""
    if key in st.session_state:
        return
    wanted = st.query_params.get(_PARAMS[key])
    match = next((o for o in options if str(o) == wanted), None)
    if match is None and first in options:
        match = first
    if match is not None:
        st.session_state[key] = match


def _to_url(key: str, value: object, default: object) -> None:
    """Write the choice into the URL (the default leaves no parameter)."""
    param = _PARAMS[key]
    if value is None or value == default:
        st.query_params.pop(param, None)
    elif st.query_params.get(param) != str(value):
        st.query_params[param] = str(value)


def _select(label: str, options: Sequence, key: str, default: object, first: object = None, **kwargs):
    """A sidebar selectbox whose choice is kept in the URL (``default``: the choice that needs no parameter;
    ``first``: what a new session without one in its URL opens on, default the first option)."""
    _from_url(key, options, first)
    value = st.sidebar.selectbox(label, options, key=key, **kwargs)
    _to_url(key, value, default)
    return value


def _pick(label: str, options: Sequence[str], key: str, fmt=short_name) -> str | None:
    value = _select(label, [ALL, *options], key, ALL, format_func=lambda o: o if o == ALL else fmt(o))
    return None if value == ALL else value


def sidebar(sources: Sources) -> Selection:
    """Draw the selection widgets and remember the choice for the pages (:func:`selection`)."""
    runs = cache.runs(sources.db_url)
    st.sidebar.caption(f"results: `{sources.display_db}`  \nstudies: `{sources.display_storage}`")
    target = _pick("Target", sorted({r.target.name for r in runs}), "sel_target")
    pool = filter_runs(runs, target)
    hardware = _pick("Hardware", sorted({hardware_label(r.hardware) for r in pool}), "sel_hardware", fmt=str)
    pool = filter_runs(pool, hardware=hardware)
    workload = _pick("Workload", sorted({r.workload.name for r in pool if r.workload}), "sel_workload")
    pool = filter_runs(pool, workload=workload)
    run = None
    if pool:
        ids = [r.id for r in pool]
        by_id = {r.id: r for r in pool}
        # A run id always goes into the URL: the newest run now is not the newest after the next profile.
        # A first visit opens on the newest tuned study's run (its winner), else on the newest run.
        first = newest_tuned_run(cache.studies(sources.storage_url), ids)
        run_id = _select("Run", ids, "sel_run", None, first, format_func=lambda i: run_label(by_id[i]))
        run = by_id.get(run_id, pool[0])
    else:
        st.query_params.pop(_PARAMS["sel_run"], None)
    draft = _pick("Draft", run.draft_names if run else [], "sel_draft")
    server = _select("Server", ["any", *server_names()], "sel_server", "any")
    if st.sidebar.button("Reload data", help="Read the database again (data is cached for a minute)"):
        cache.clear()
        st.rerun()
    sel = Selection(sources=sources, runs=tuple(pool), run=run, draft=draft, server=server, target=target,
                    hardware=hardware, workload=workload)
    st.session_state[_KEY] = sel
    return sel


def selection() -> Selection:
    """The selection the sidebar made in this script run."""
    sel = st.session_state.get(_KEY)
    if sel is None:  # a page run on its own (tests): draw the sidebar first
        sel = sidebar(cache.sources())
    return sel


def commands(*what: str) -> str:
    """The commands that fill the missing data, one a line, for the selected run (``measure --run <id>``)."""
    sel = st.session_state.get(_KEY)
    run_id = sel.run.id if sel is not None and sel.run is not None else None
    return "\n".join(first_command(w, run_id) for w in what)


def need(what: str, message: str) -> None:
    """Say which command fills the missing data, then stop the page (an empty state, not an error)."""
    st.info(f"{message} Run first:")
    st.code(commands(what), language="bash")
    st.stop()


def synthetic_banner(run: RunRecord | None) -> None:
    """A warning on every page that shows a run profiled with synthetic acceptance."""
    note = synthetic_note(run.settings) if run is not None else None
    if note:
        st.warning(note)


def fmt(x: float | None, digits: int = 1, suffix: str = "") -> str:
    """A number for tables: ``–`` when missing."""
    return "–" if x is None else f"{x:,.{digits}f}{suffix}"


def ci_text(ci: tuple[float, float] | None, digits: int = 1) -> str:
    return "–" if ci is None else f"[{ci[0]:,.{digits}f}, {ci[1]:,.{digits}f}]"
