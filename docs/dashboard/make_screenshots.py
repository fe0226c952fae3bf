"""Screenshots of every dashboard page, taken in headless Chromium (the README shows them).

    python docs/dashboard/make_screenshots.py --db sqlite:///results.db [--storage URL] [--out docs/dashboard]

Starts ``specdec-tune dashboard`` on a free port, opens each page, waits until every chart is drawn,
sizes the window to the page's full height and saves ``<page>.png``.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PAGES = ("overview", "profile", "why", "fidelity", "study", "trends")


def main() -> None:
    from selenium.webdriver.common.by import By

    from tests.support.dashboard_data import RunningDashboard
    from tests.dashboard.test_browser import PAGES as SPEC, chrome, idle, rendered_charts

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", required=True)
    p.add_argument("--storage", default=None)
    p.add_argument("--out", type=Path, default=Path(__file__).parent)
    p.add_argument("--width", type=int, default=1500)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with RunningDashboard(args.db, args.storage) as board, tempfile.TemporaryDirectory() as tmp:
        driver = chrome(Path(tmp))
        try:
            for page in PAGES:
                path = "" if page == "overview" else page
                driver.set_window_size(args.width, 1000)
                driver.get(f"{board.url}/{path}")
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    heads = [h.text for h in driver.find_elements(By.TAG_NAME, "h1")]
                    n, drawn = rendered_charts(driver)
                    if SPEC[path][0] in heads and n == drawn and idle(driver):
                        break
                    time.sleep(0.25)
                time.sleep(1.5)  # let plotly finish its transitions
                height = driver.execute_script(
                    "const m = document.querySelector('[data-testid=\"stMainBlockContainer\"]');"
                    "return m ? m.scrollHeight + 120 : document.body.scrollHeight;")
                driver.set_window_size(args.width, min(int(height), 7000))
                time.sleep(1.5)
                target = args.out / f"{page}.png"
                driver.save_screenshot(str(target))
                print(f"{target} ({args.width}x{height})")
        finally:
            driver.quit()


if __name__ == "__main__":
    main()
