"""The Streamlit dashboard (``specdec-tune dashboard``): see why a configuration wins.

Layout (Optuna's visualisation style): pure loaders that query ``db`` (and the Optuna storage) and
return plain frozen dataclasses, tested without Streamlit (``overview``, ``profile_info``, ``why``,
``measured``, ``studies``, ``trends``, ``servers_info``); plotly figures built from those
(``charts``, ``study_charts``); the cached wrappers (``cache``), the sidebar (``ui``) and thin page
scripts (``app.py``, ``views/``); and the launcher (``launch``). Predictions come from
``tuner.model``'s public names, never from a copy here; the server capability table and the
exporters arrive through ``wiring``, installed by the ``specdec-tune dashboard`` entry script
(docs/architecture.md, Import contracts).
"""
