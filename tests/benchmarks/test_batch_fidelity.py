"""benchmarks/batch_fidelity.py's summary per batch size (issue 38, part 4): the median and worst |error| of
each prediction, the best N measured and predicted, and the regret of running the predicted best."""
from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import ROOT


def _script(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the script imports its folder's _bench
    spec = importlib.util.spec_from_file_location("batch_fidelity", ROOT / "benchmarks" / "batch_fidelity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(n: int, measured: float, model: float, lockstep: float | None) -> dict:
    return {"B": 4, "N": n, "measured": measured, "batch_model": model, "batch_error": model / measured - 1,
            "lockstep": lockstep, "lockstep_error": None if lockstep is None else lockstep / measured - 1}


def test_summary_reads_errors_best_n_and_regret(monkeypatch):
    bf = _script(monkeypatch)
    rows = [_row(0, 100, 110, 110), _row(1, 150, 140, 150), _row(2, 160, 170, 200), _row(3, 155, 180, None)]
    s = bf.summarize(rows)
    median, worst = s["batch_model_error"]
    assert median == pytest.approx((10 / 150 + 0.10) / 2) and worst == pytest.approx(180 / 155 - 1)
    assert s["lockstep_error"][0] == pytest.approx(0.10)  # |errors| 0.10, 0, 0.25: N = 3 has no lock-step value
    assert s["best_n_measured"] == 2 and s["best_n_batch_model"] == 3 and s["best_n_lockstep"] == 2
    assert s["regret_batch_model"] == pytest.approx(1 - 155 / 160) and s["regret_lockstep"] == 0
    line = bf.summary_lines({4: s})[1]
    assert line.split()[:3] == ["4", "+8.3%", "+16.1%"] and "+3.1%" in line
