"""The Streamlit dashboard (``specdec-tune dashboard``): see why a configuration wins.

Layout (Optuna's visualisation style): pure loaders that query ``db`` (and the Optuna storage) and
return plain frozen dataclasses, tested without Streamlit (``overview``, ``profile_info``, ``why``,
``measured``, ``studies``, ``trends``, ``servers_info``); plotly figures built from those
(``charts``, ``study_charts``); the cached wrappers (``cache``), the sidebar (``ui``) and thin page
scripts (``app.py``, ``views/``); and the launcher (``launch``). Predictions come from
``tuner.model``'s public names, never from a copy here; the server capability table and the
exporters arrive through ``wiring``, installed by the ``specdec-tune dashboard`` entry script
(docs/architecture.md, Import contracts).

The names below are the dashboard's face, what the command line uses (the ``faces-dashboard`` import
contract): the launcher, the sources check, the wiring records and :func:`show`, which draws the pages.
"""
from __future__ import annotations

from specdec_tune.dashboard.launch import check_port, serve
from specdec_tune.dashboard.sources import check_sources, resolve_sources
from specdec_tune.dashboard.wiring import ExportFiles, ServerFacts, ServerRoom, install

__all__ = ["ExportFiles", "ServerFacts", "ServerRoom", "check_port", "check_sources", "install", "resolve_sources",
           "serve", "show"]


def show() -> None:
    """Draw the dashboard's pages: the body of the Streamlit script (which installs the server room first)."""
    from specdec_tune.dashboard import app

    app.main()
