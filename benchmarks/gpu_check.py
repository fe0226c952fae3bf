"""GPU check: every figure of the GPU goals (docs/gpu.md, What a GPU session measures) in one call.

Usage on a GPU machine (about 8 minutes on an H100; every step has its own time limit and a failed or
timed-out step is recorded, not fatal):

    python benchmarks/gpu_check.py --out "$OUT"

and here, on the CPU, the same steps with tiny sizes (checks the script itself, numbers meaningless):

    OMP_NUM_THREADS=1 python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check

Steps: the environment (nvidia-smi, torch, CUDA); ``profile`` of the bundled pair with defaults, timed
(goal < 180 s) and its T_v(1) of mini-target (goal <= 0.5 ms); ``bench`` in bf16 with N = 4 against HF
(ours speculative / HF assisted >= 1.5, the consistency verdict); ``measure`` at the profile's best N
(ours / our plain decoding >= 1.5, paired CI); the held-out model error over 12+ configurations the
profile did not run (``benchmarks/fidelity.py --splits out``, goal median |error| <= 5 %); ``pytest -m
gpu``; a real-size shape pair with synthetic acceptance (Llama-3.1-8B target, Llama-3.2-1B draft, bf16):
``profile`` at batch sizes 1-64, ``predict`` of the best N per batch size at α = 0.7, ``measure`` at the
best N against its prediction (goal: within 5 %). Every step's output goes to ``--out/<step>.*``;
``summary.json`` holds each goal's value, its target and whether it was met.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import typer

from specdec_tune.cli import _options as opts

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "specdec_tune.cli"]


def _sizes(dry: bool) -> dict:
    """Per-step sizes: the real check, or the dry run's tiny ones (CPU, a few minutes)."""
    if dry:
        return {"device": "cpu", "profile": ["--max-prompts", "2", "--max-new-tokens", "8", "--repeats", "2",
                                             "--k-max", "5", "--n-max", "4", "--context-lens", "64"],
                "bench": ["--max-prompts", "2", "--max-new-tokens", "12"], "measure": ["--max-prompts", "2", "--repeats", "1"],
                "fidelity": ["--ns", "2,3", "--thetas", "0", "--max-prompts", "2", "--repeats", "1"],
                "shape": ("shape:qwen2.5-draft-2l", "shape:qwen2.5-draft-2l", "1,2"), "shape_tokens": "6"}
    return {"device": "cuda", "profile": [], "bench": ["--max-prompts", "6", "--max-new-tokens", "64"],
            "measure": ["--repeats", "3"],
            # 12 configurations the profile did not run (it ran θ = 0 at N = 1, 4, 8, 16)
            "fidelity": ["--ns", "2,3,5,6,7,10", "--thetas", "0,0.4", "--max-prompts", "4", "--repeats", "2"],
            "shape": ("shape:llama-3.1-8b", "shape:llama-3.2-1b", "1,2,4,8,16,32,64"), "shape_tokens": "32"}


DEADLINE = {"t": float("inf")}  # time.perf_counter() by which every step must have ended (--budget-s)
SAVE: dict = {}  # "path" and "summary": summary.json is rewritten after every step (a killed check keeps its steps)


def _step(out: Path, name: str, args: list[str], timeout: float, log: dict) -> dict | None:
    """Run one step as a subprocess within its own limit and the whole check's budget; keep its stdout
    and stderr; return its JSON output (None on failure, time-out or no budget left)."""
    start = time.perf_counter()
    timeout = min(timeout, DEADLINE["t"] - start)
    if timeout < 15:
        log[name] = {"exit": "skipped: the --budget-s is spent", "seconds": 0, "command": " ".join(args)}
        return None
    try:
        done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, stdout, stderr = "timeout", exc.stdout or "", exc.stderr or ""
        stdout, stderr = (s.decode() if isinstance(s, bytes) else s for s in (stdout, stderr))
    seconds = time.perf_counter() - start
    (out / f"{name}.out").write_text(stdout)
    (out / f"{name}.err").write_text(stderr[-20000:])
    log[name] = {"exit": code, "seconds": round(seconds, 1), "command": " ".join(args)}
    if SAVE:
        SAVE["path"].write_text(json.dumps(SAVE["summary"], indent=1, default=str))
    try:
        return json.loads(stdout) if code == 0 else None
    except json.JSONDecodeError:
        return None


def _goal(summary: dict, name: str, value, target: str, met) -> None:
    summary["goals"][name] = {"value": value, "goal": target, "met": met, "label": "measured"}


def _core(out: Path, s: dict, db: str, summary: dict) -> int | None:
    """Profile (timed), bench vs HF in bf16, measure at the best N; returns the profile run id."""
    log, dev = summary["steps"], s["device"]
    prof = _step(out, "profile", [*CLI, "profile", "--target", "mini-target", "--draft", "mini-draft-1l,mini-draft-2l",
                                  "--workload", "functions", "--device", dev, "--db", db, "--json", *s["profile"]],
                 200, log)
    _goal(summary, "profile_seconds", log["profile"]["seconds"], "< 180 s (defaults)",
          log["profile"]["seconds"] < 180 and prof is not None)
    bench = _step(out, "bench", [*CLI, "bench", "--target", "mini-target", "--draft", "mini-draft-1l", "-N", "4",
                                 "--workload", "functions", "--device", dev, "--dtype", "bf16", "--compare", "hf",
                                 "--json", *s["bench"]], 150, log)
    if bench:
        ratio = bench["ratios"].get("ours_speculative/hf_assisted")
        _goal(summary, "ours_vs_hf_assisted_bf16_n4", ratio, ">= 1.5", ratio is not None and ratio >= 1.5)
        _goal(summary, "bf16_consistency", bench["consistency"]["verdict"], "identical or near-tie",
              bench["consistency"]["verdict"] != "differ")
    if prof is None:
        return None
    t_v1 = prof["verify_ms"].get("1", {}).get("1")
    _goal(summary, "T_v1_ms_mini_target", t_v1, "<= 0.5 ms", t_v1 is not None and t_v1 <= 0.5)
    best = prof["drafts"][0]["best"][0]["num_speculative_tokens"] if prof["drafts"][0]["best"] else 4
    meas = _step(out, "measure_best", [*CLI, "measure", "--run", str(prof["run_id"]), "-N", str(best), "--db", db,
                                       "--json", *s["measure"]], 120, log)
    if meas and meas.get("speedup"):
        sp = meas["speedup"]
        _goal(summary, "ours_vs_plain_at_best_n", {"N": best, "speedup": sp["measured"], "ci95": sp["ci95"],
                                                   "predicted": sp["predicted"]}, ">= 1.5", sp["measured"] >= 1.5)
    return prof["run_id"]


def _shapes(out: Path, s: dict, summary: dict) -> None:
    """A real-size shape pair with synthetic acceptance: profile, best N per batch size, measure vs predicted."""
    log, (target, draft, sizes) = summary["steps"], s["shape"]
    db = f"sqlite:///{out / 'shapes.db'}"
    prof = _step(out, "shape_profile", [*CLI, "profile", "--target", target, "--draft", draft, "--workload", "functions",
                                        "--synthetic-acceptance", "0.7", "--device", s["device"], "--dtype",
                                        "bf16" if s["device"] == "cuda" else "float32", "--batch-sizes", sizes,
                                        "--max-prompts", "4", "--max-new-tokens", s["shape_tokens"], "--n-max", "6",
                                        "--k-max", "7", "--repeats", "5", "--db", db, "--json"], 240, log)
    if prof is None:
        return
    run = str(prof["run_id"])
    pred = _step(out, "shape_predict", [*CLI, "predict", "--run", run, "--synthetic-acceptance", "0.7", "--batch-sizes",
                                        sizes, "--db", db, "--json"], 60, log)
    if pred:
        summary["shape_best_n_per_batch_size"] = {
            "label": pred["label"], "best_n": {r["batch_size"]: r["num_speculative_tokens"] for r in pred["per_batch_size"]}}
    meas = _step(out, "shape_measure", [*CLI, "measure", "--run", run, "-N", "3", "--max-prompts", "4", "--repeats", "2",
                                        "--db", db, "--json"], 180, log)
    if meas and meas.get("speedup") and meas["speedup"]["predicted"]:
        err = meas["speedup"]["relative_error"]
        _goal(summary, "shape_speedup_error_synthetic", {"error": err, "measured": meas["speedup"]["measured"],
                                                         "predicted": meas["speedup"]["predicted"]},
              "|error| <= 5 % (synthetic acceptance)", abs(err) <= 0.05)


def _fidelity_goal(path: Path, summary: dict) -> None:
    """The held-out median |error| over the configurations the profile did not run."""
    if not path.exists():
        return
    summaries = json.loads(path.read_text()).get("summary") or {}
    summary["fidelity"] = summaries
    held = next((v for k, v in summaries.items() if k.startswith("out-of-sample") and "every" not in k), None)
    if held:
        err = held.get("median_abs_error")
        _goal(summary, "heldout_median_abs_error", {"value": err, "configurations": held.get("configurations")},
              "<= 5 % over >= 12 configurations", err is not None and err <= 0.05 and (held.get("configurations") or 0) >= 12)


def main(
    out: str = typer.Option(os.environ.get("OUT", "gpu_check_out"), "--out", help="Folder for every output ($OUT)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="CPU, tiny sizes: checks the script, not the GPU."),
    budget_s: float = typer.Option(480.0, "--budget-s", help="Seconds all steps may take together (later ones skip)."),
    skip_fidelity: bool = typer.Option(False, "--skip-fidelity", help="Leave out the held-out model error step."),
    skip_shapes: bool = typer.Option(False, "--skip-shapes", help="Leave out the real-size shape pair."),
) -> None:
    DEADLINE["t"] = time.perf_counter() + budget_s
    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    s = _sizes(dry_run)
    summary: dict = {"label": "measured", "dry_run": dry_run, "date": time.strftime("%Y-%m-%d %H:%M"), "steps": {},
                     "goals": {}}
    SAVE.update(path=folder / "summary.json", summary=summary)
    if not dry_run:
        _step(folder, "nvidia_smi", ["nvidia-smi", "-q"], 30, summary["steps"])
    env = _step(folder, "env", [sys.executable, "-c", "import json, torch, transformers; print(json.dumps({'torch': "
                                "torch.__version__, 'cuda': torch.version.cuda, 'gpu': torch.cuda.is_available() and "
                                "torch.cuda.get_device_name(0), 'transformers': transformers.__version__}))"], 60,
                summary["steps"])
    summary["environment"] = env
    db = f"sqlite:///{folder / 'gpu.db'}"
    _step(folder, "pytest_gpu", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                 "tests/test_gpu.py"], 90 if not dry_run else 240, summary["steps"])
    run = _core(folder, s, db, summary)
    if run is not None and not skip_fidelity:
        _step(folder, "fidelity", [sys.executable, "benchmarks/fidelity.py", "--db", db, "--run", str(run), "--drafts",
                                   "mini-draft-1l", "--splits", "out", "--out", str(folder / "fidelity_heldout"),
                                   *s["fidelity"]], 150, summary["steps"])
        _fidelity_goal(folder / "fidelity_heldout.json", summary)
    if not dry_run:  # CUDA graphs against eager, bf16: forward times and tokens/s (fp32 equality: pytest)
        _step(folder, "cuda_graphs", [sys.executable, "benchmarks/cuda_graphs_check.py", "--out", str(folder),
                                      "--dtypes", "bf16", "--prompts", "4", "--max-new-tokens", "32", "--repeats", "2"],
              120, summary["steps"])
        graphs = folder / "cuda_graphs_check.json"
        if graphs.exists():
            summary["cuda_graphs"] = json.loads(graphs.read_text())
    if not skip_shapes:
        _shapes(folder, s, summary)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary["goals"], indent=1, default=str))


if __name__ == "__main__":
    opts.run_script(main)
