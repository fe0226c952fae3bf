"""The Streamlit app: the sidebar selection (shared by every page) and the page the user picked.

Thin on purpose. Data comes from the cached loaders in :mod:`specdec_tune.dashboard.cache`; the
database and study storage come from ``SPECDEC_DB`` and ``SPECDEC_STORAGE``. ``specdec-tune dashboard``
runs ``streamlit run`` on its entry script (``specdec_tune/cli/_dashboard_app.py``), which installs the
server room (:mod:`specdec_tune.dashboard.wiring`) and calls :func:`main`; ``streamlit run`` on this
file runs the same app without the servers table and the export downloads.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from specdec_tune.dashboard import cache, ui

HERE = Path(__file__).resolve().parent
PAGES = (
    ("views/overview.py", "Overview", "overview"),
    ("views/profile.py", "Profile run", "profile"),
    ("views/why.py", "Why it wins", "why"),
    ("views/fidelity.py", "Model vs measurement", "fidelity"),
    ("views/study.py", "Tuning study", "study"),
    ("views/trends.py", "Regression trends", "trends"),
)


def main() -> None:
    """Draw one run of the app (Streamlit reruns the entry script on every interaction)."""
    st.set_page_config(page_title="specdec-tune", layout="wide")
    page = st.navigation([st.Page(HERE / path, title=title, url_path=url, default=i == 0)
                          for i, (path, title, url) in enumerate(PAGES)])
    ui.sidebar(cache.sources())
    page.run()


if __name__ == "__main__":
    main()
