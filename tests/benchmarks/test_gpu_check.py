"""benchmarks/gpu_check.py without a GPU: its steps record exit, time and output, the budget skips what
no longer fits, and the goals are read from the steps' JSON (its --dry-run runs every step on the CPU:
about 4 minutes, by hand)."""
from __future__ import annotations

import importlib.util
import json
import sys
import time

from tests.conftest import ROOT


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_steps_record_output_and_the_budget_skips(tmp_path):
    gc = _script()
    log: dict = {}
    out = gc._step(tmp_path, "ok", [sys.executable, "-c", "print('{\"x\": 1}')"], 60, log)
    assert out == {"x": 1} and log["ok"]["exit"] == 0 and (tmp_path / "ok.out").read_text().strip() == '{"x": 1}'
    assert gc._step(tmp_path, "bad", [sys.executable, "-c", "import sys; sys.exit(3)"], 60, log) is None
    assert log["bad"]["exit"] == 3
    gc.DEADLINE["t"] = time.perf_counter() + 5  # less than a step's minimum left
    assert gc._step(tmp_path, "late", [sys.executable, "-c", "print(1)"], 60, log) is None
    assert log["late"]["exit"].startswith("skipped")
    gc.DEADLINE["t"] = float("inf")


def test_goals_from_the_steps(tmp_path):
    gc = _script()
    summary: dict = {"goals": {}}
    fid = tmp_path / "f.json"
    fid.write_text(json.dumps({"summary": {"out-of-sample (held-out prompts)": {"configurations": 12,
                                                                                "median_abs_error": 0.04}}}))
    gc._fidelity_goal(fid, summary)
    assert summary["goals"]["heldout_median_abs_error"]["met"] is True
    fid.write_text(json.dumps({"summary": {"out-of-sample (held-out prompts)": {"configurations": 6,
                                                                                "median_abs_error": 0.01}}}))
    gc._fidelity_goal(fid, summary)
    assert summary["goals"]["heldout_median_abs_error"]["met"] is False  # fewer than 12 configurations
    assert gc._sizes(True)["device"] == "cpu" and gc._sizes(False)["device"] == "cuda"
