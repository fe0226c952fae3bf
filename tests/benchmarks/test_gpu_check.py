"""benchmarks/gpu_check.py without a GPU: a stage records its exit, time and output and is skipped when the
budget is spent; the goals are read from what the stages measured (a goal nothing measured is NOT MEASURED,
never passed); and the dry run runs every stage on the CPU, leaving every file a GPU run leaves."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

STAGES = ("env", "slots", "overlap", "profile", "fidelity", "tau", "realsize_llama", "realsize_qwen", "pytest_gpu")
GOALS = ("no_capture_after_warm_up", "pass_to_pass_spread", "calibration_identity", "heldout_median_abs_error",
         "tau_error_in_sample", "mbu_b1", "realsize_within_5pct_b1", "hooks_cost", "T_v1_mini_target_ms",
         "speculative_vs_plain_at_tuned_n", "profile_seconds")


def _module(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stage_records_its_output_and_the_budget_skips(tmp_path):
    gc = _module("gpu_check")
    log: dict = {}
    far = time.monotonic() + 600
    assert gc.run_stage(tmp_path, "ok", 60, [sys.executable, "-c", "print('{\"x\": 1}')"], far, log) == {"x": 1}
    assert log["ok"]["exit"] == 0 and (tmp_path / "ok.out").read_text().strip() == '{"x": 1}'
    assert gc.run_stage(tmp_path, "bad", 60, [sys.executable, "-c", "import sys; sys.exit(3)"], far, log) is None
    assert log["bad"]["exit"] == 3
    # a stage past its cap is killed, and what it printed before stays
    slow = [sys.executable, "-u", "-c", "import time; print('partial', flush=True); time.sleep(30)"]
    assert gc.run_stage(tmp_path, "slow", 2, slow, far, log) is None
    assert str(log["slow"]["exit"]).startswith("timeout") and "partial" in (tmp_path / "slow.out").read_text()
    assert gc.run_stage(tmp_path, "late", 60, [sys.executable, "-c", "print(1)"], time.monotonic() + 5, log) is None
    assert log["late"]["exit"].startswith("skipped")
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["stage"], e["what"]) for e in events] == [("ok", "start"), ("ok", "end"), ("bad", "start"),
                                                         ("bad", "end"), ("slow", "start"), ("slow", "end"),
                                                         ("late", "skipped")]


def _fidelity(configurations: int, median: float, theta: float) -> dict:
    rows = [{"N": 2, "threshold": theta, "profile_ran_it": False, "config": "d N=2", "measured": 100.0,
             "predicted": 104.0, "per_repeat_tokens_per_s": [99.0, 100.0, 101.5], "timed_regions":
             {"regions": 10, "reruns": 0, "unclean": 0}, "speedup_measured": 1.6}]
    return {"summary": {"out-of-sample (held-out prompts)": {"configurations": configurations,
                                                             "median_abs_error": median, "predicted_best": "d N=2"}},
            "rows": {"out-of-sample (held-out prompts)": rows}}


def test_goals_come_from_the_measurements_and_nothing_measured_never_passes():
    report = _module("_gpu_report")
    none = report.evaluate({}, dry_run=False)
    assert set(none) == set(GOALS) and all(g["met"] is None for g in none.values())
    goals = report.evaluate({"fidelity": _fidelity(12, 0.04, 0.4)}, dry_run=False)
    assert goals["heldout_median_abs_error"]["met"] is True
    assert goals["pass_to_pass_spread"]["met"] is False  # (101.5 - 99) / 100: 2.5 %
    assert goals["no_capture_after_warm_up"]["met"] is True
    assert goals["speculative_vs_plain_at_tuned_n"]["met"] is True
    assert report.evaluate({"fidelity": _fidelity(6, 0.01, 0.4)}, False)["heldout_median_abs_error"]["met"] is False
    assert report.evaluate({"fidelity": _fidelity(12, 0.01, 0.0)}, False)["heldout_median_abs_error"]["met"] is False
    moved = _fidelity(12, 0.04, 0.4)
    moved["rows"]["out-of-sample (held-out prompts)"][0]["timed_regions"]["reruns"] = 1
    assert report.evaluate({"fidelity": moved}, False)["no_capture_after_warm_up"]["met"] is False
    real = {"realsize": {"llama": {"per_alpha": {"0.6": {"measured_b1": [{"N": 0, "error": 0.03}, {"N": 2, "error": -0.07}],
                                                         "plain_mbu_b1": {"mbu": 0.78}}}}}}
    goals = report.evaluate(real, False)
    assert goals["mbu_b1"]["met"] is True and goals["realsize_within_5pct_b1"]["met"] is False
    assert goals["realsize_within_5pct_b1"]["value"] == {"llama α=0.6": 0.07}
    identity = report.evaluate({"profile": {"identity_check": {"plain_error": -0.04}}}, False)
    assert identity["calibration_identity"]["met"] is False


@pytest.mark.slow
def test_the_dry_run_runs_every_stage_and_leaves_every_file(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--out", str(out),
                           "--budget-s", "1500"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert {"label", "dry_run", "started", "budget_s", "stages", "results", "goals", "figures", "wall_s"} <= set(summary)
    assert list(summary["stages"]) == list(STAGES)
    assert all(s["exit"] == 0 for s in summary["stages"].values()), summary["stages"]
    assert set(summary["goals"]) == set(GOALS)
    assert {"slots", "overlap", "profile", "fidelity", "tau", "realsize"} <= set(summary["results"])
    assert set(summary["results"]["realsize"]) == {"llama", "qwen"}
    llama = summary["results"]["realsize"]["llama"]["per_alpha"]
    assert set(llama) == {"0.6", "0.8"} and llama["0.6"]["profiled_batch_sizes"] == [1, 2]
    assert llama["0.6"]["plain_mbu_b1"]["bytes_per_token"] > 0
    for name in ("events.jsonl", "gpu.db", "realsize.db", "slots.json", "overlap.json", "fidelity_heldout.json",
                 "fidelity_in_sample.json", "realsize_llama.json", "realsize_qwen.json",
                 "figures/predicted_vs_measured.html", "figures/tv_per_slot.html", *(f"{s}.out" for s in STAGES)):
        assert (out / name).is_file(), name
    stages = {json.loads(line)["stage"] for line in (out / "events.jsonl").read_text().splitlines()}
    assert set(STAGES) <= stages
    for goal in GOALS:  # one line each, ready to paste into a note
        assert f"goal {goal}" in done.stdout


def test_the_real_size_step_counts_llama_8b_and_its_mbu_from_first_principles():
    from types import SimpleNamespace

    real = _module("_gpu_realsize")
    sizes = real.model_bytes("shape:llama-3.1-8b", "bfloat16")  # the published config, on the meta device
    params, table = 8_030_261_248, 128_256 * 4096  # Llama-3.1-8B's parameters (model card); its embedding table
    assert sizes["weights_all"] == 2 * params
    assert sizes["weights_read"] == 2 * (params - table + 4096)  # the table read as one row: the head is untied
    assert sizes["kv_per_position"] == 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
    plain = SimpleNamespace(decode_tokens_per_s=100.0, tokens_per_s=90.0, prompt_tokens=[300, 500])
    got = real.plain_mbu(plain, sizes, "NVIDIA H100 80GB HBM3", 65)
    context = 400 + 32  # mean prompt + (65 - 1) / 2 positions cached on average
    assert got["mean_context"] == context and got["card"] == "H100 SXM"
    assert got["mbu"] == pytest.approx((sizes["weights_read"] + sizes["kv_per_position"] * context) * 100 / 3.35e12)
    assert got["mbu_gpt_fast_convention"] == pytest.approx(2 * params * 100 / 3.35e12)
    assert "mbu" not in real.plain_mbu(plain, sizes, None, 65)  # no card (a CPU): bytes/s, no utilisation
