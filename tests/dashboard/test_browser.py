"""End to end in a real browser: `specdec-tune dashboard` on a free port, each page in headless Chromium.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and selenium (the
``test`` extra); skips, saying which is missing, only where they cannot be found.
"""
from __future__ import annotations

import shutil
import time

import pytest

from tests.support import dashboard_data

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                       reason="headless Chromium not found (apt-get install -y chromium chromium-driver)"),
]
# url path -> (title, texts that must be visible, plotly charts that must render)
PAGES = {
    "": ("Overview", ["Profile runs", "Best configuration per target, hardware, workload and server", "Latest runs",
                      "Tuning studies", "Regression verdicts"], 0),
    "profile": ("Profile run", ["Acceptance rate", "Mean acceptance length", "Timings"], 6),
    "why": ("Why it wins", ["Predicted tokens/s", "Where a cycle's time goes", "The tuner chose"], 3),
    "fidelity": ("Model vs measurement", ["Error table", "in-sample", "y = x (perfect prediction)"], 1),
    "study": ("Tuning study", ["Winner for vllm", "Optimisation history", "Parameter importance",
                               "Per-batch-size schedule"], 3),
    "trends": ("Regression trends", ["No regression runs yet", "specdec-tune regress"], 0),
}


def chrome(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
                f"--user-data-dir={tmp_path / 'chrome-profile'}", "--window-size=1400,1000"):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=Service(executable_path=DRIVER))


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - the page is still rendering
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def rendered_charts(driver) -> tuple[int, int]:
    """(chart containers, those with a drawn plotly SVG)."""
    from selenium.webdriver.common.by import By

    boxes = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stPlotlyChart"]')
    drawn = [b for b in boxes if b.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg")]
    return len(boxes), len(drawn)


def idle(driver) -> bool:
    """Streamlit shows a status widget ("Running...") while a script runs."""
    from selenium.webdriver.common.by import By

    return not driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]')


def test_every_page_renders_in_chromium(tiny_model_dirs, tmp_path_factory, tmp_path):
    from selenium.webdriver.common.by import By

    urls = dashboard_data.build(tmp_path_factory.getbasetemp(), tiny_model_dirs)
    with dashboard_data.RunningDashboard(urls["db"], urls["storage"]) as board:
        driver = chrome(tmp_path)
        try:
            for path, (title, texts, charts) in PAGES.items():
                driver.get(f"{board.url}/{path}")
                wait_for(lambda: title in [h.text for h in driver.find_elements(By.TAG_NAME, "h1")], 60,
                         f"the {title!r} heading")
                wait_for(lambda: all(t in driver.find_element(By.TAG_NAME, "body").text for t in texts), 60,
                         f"{texts} on {title!r}")
                wait_for(lambda: rendered_charts(driver) == (charts, charts) and idle(driver), 60,
                         f"{charts} rendered charts on {title!r}")
                assert not driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]'), title
        finally:
            driver.quit()
