"""The Streamlit app: ``specdec-tune dashboard`` runs ``streamlit run`` on this file.

Thin on purpose: it draws the sidebar selection (shared by every page) and hands over to the page
the user picked. Data comes from the cached loaders in :mod:`specdec_tune.dashboard.cache`; the
database and study storage come from ``SPECDEC_DB`` and ``SPECDEC_STORAGE``.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from specdec_tune.dashboard import cache, ui

HERE = Path(__file__).parent
PAGES = (
    ("views/overview.py", "Overview", "overview"),
    ("views/profile.py", "Profile run", "profile"),
    ("views/why.py", "Why it wins", "why"),
    ("views/fidelity.py", "Model vs measurement", "fidelity"),
    ("views/study.py", "Tuning study", "study"),
    ("views/trends.py", "Regression trends", "trends"),
)

st.set_page_config(page_title="specdec-tune", layout="wide")
page = st.navigation([st.Page(HERE / path, title=title, url_path=url, default=i == 0)
                      for i, (path, title, url) in enumerate(PAGES)])
ui.sidebar(cache.sources())
page.run()
