"""GPU check: issue 37's GPU goals in one prepared call (DIAGNOSIS.md §5's plan), within a budget.

On a lent GPU machine, after the wheels and the project are installed (docs/gpu.md, "The one call"):

    python benchmarks/gpu_check.py --out "$OUT"            # under 6.5 minutes on an H100/H200: --budget-s 350

and here, on the CPU, the same stages with tiny sizes (checks the script; the numbers mean nothing):

    OMP_NUM_THREADS=1 python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check

Stages, in order, each a subprocess with its own time cap, cut to what is left of ``--budget-s`` and skipped
(with a note) when less than a minimum is left:

1. ``env``: torch, CUDA, the GPU.
2. ``slots``: T_v(k) and the draft's (1, 1) and (2, 1) on 256/512/1024-position slots, each first call's
   captures, host-only against GPU-only time per replay (``benchmarks/_gpu_micro.py``).
3. ``overlap``: plain, N = 4 at θ = 0, 1e-9 and 0.4, N = 16, unhooked and hooked: the hooks' cost per forward
   and θ's cost per draft forward (``_gpu_micro.py``).
4. ``profile``: ``specdec-tune profile`` of the bundled pair on the tune split (defaults), the calibration
   identity at its end, timed regions checked; the database is ``gpu.db`` in the output folder.
5. ``fidelity``: ``benchmarks/fidelity.py --splits out``: held-out prompts × repeats, N × θ (θ > 0 included),
   ≥ 12 configurations the profile did not run, each against the model's prediction from that profile.
6. ``tau``: ``fidelity.py --splits in`` on the profiled prompts: τ error in-sample.
7. ``realsize_llama``, 8. ``realsize_qwen``: a ``shape:`` pair in bf16 with synthetic acceptance 0.6 and 0.8,
   profiled at B = 1, 4, 16, 64, measured at B = 1 against its prediction, plain decoding's MBU at B = 1
   (``benchmarks/_gpu_realsize.py``).
9. ``pytest_gpu``: ``pytest -m gpu`` (graphed and eager outputs equal, the lean forward against HF, ...).

The previous version's ``bench`` against HF assisted generation (12.7x on the H200, met) and
``cuda_graphs_check.py`` (graphs against eager, 6.9x) are left to their own scripts.

Everything lands in ``--out`` as it is measured: ``events.jsonl`` (one line per number, appended), each stage's
``<stage>.out``/``.err`` and JSON, ``summary.json`` (rewritten after every stage: the stages' exits and times,
the goals so far), the databases, and ``figures/`` (plotly HTML when plotly is installed). At the end each
goal of the issue is printed with its value and PASS / FAIL / NOT MEASURED, ready to paste into a note.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu_log import emit, write_json  # noqa: E402  (benchmarks/ is this script's folder)
from _gpu_report import evaluate, figures, goal_lines  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
CLI = [PY, "-m", "specdec_tune.cli"]
MIN_STAGE_S = 20  # a stage with less left than this is skipped, not started
DRY_CAP_FACTOR = 5  # the dry run's stages get 5x the GPU caps: a shared 2-core CPU runs even tiny sizes slowly
PAIRS = {"llama": ("shape:llama-3.1-8b", "shape:llama-3.2-1b"), "qwen": ("shape:qwen2.5-7b", "shape:qwen2.5-0.5b")}
SMALL_PAIR = ("shape:qwen2.5-draft-2l", "shape:qwen2.5-draft-2l")  # the dry run's stand-in for both pairs


def stages(out: Path, dry: bool) -> list[tuple[str, float, list[str]]]:
    """(name, cap in seconds, command) of every stage, in order; the dry run's tiny sizes or the GPU's."""
    db = f"sqlite:///{out / 'gpu.db'}"
    micro, real = [PY, "benchmarks/_gpu_micro.py"], [PY, "benchmarks/_gpu_realsize.py", "--out", str(out)]
    fid = [PY, "benchmarks/fidelity.py", "--db", db, "--run", "{run}", "--drafts", "mini-draft-1l"]
    if dry:
        prof = ["--max-prompts", "2", "--max-new-tokens", "8", "--repeats", "2", "--k-max", "5", "--n-max", "4",
                "--context-lens", "64", "--device", "cpu"]
        held = ["--ns", "2,3", "--thetas", "0,0.4", "--max-prompts", "2", "--repeats", "2"]
        tau = ["--ns", "2", "--thetas", "0", "--max-prompts", "2", "--repeats", "1"]
        sizes = ["--ns", "1,2", "--prompts", "2", "--max-new-tokens", "4", "--repeats", "2", "--measure-repeats", "1",
                 "--batch-sizes", "1,2", "--dry-run"]
        pairs = {name: SMALL_PAIR for name in PAIRS}
        alphas = {"llama": "0.6,0.8", "qwen": "0.8"}
        slots, over = ["--repeats", "3", "--dry-run"], ["--repeats", "2", "--prompts", "2", "--max-new-tokens", "8",
                                                         "--dry-run"]
    else:
        prof = ["--device", "cuda"]
        # 8 held-out prompts x 5 repeats; 16 speculative configurations, 13 of them not run by the profile
        # (it runs θ = 0 at N = 1, 4, 8 and 16): N = 2, 3, 5, 6, 12 at θ = 0 and all eight at θ = 0.4
        held = ["--ns", "1,2,3,4,5,6,8,12", "--thetas", "0,0.4", "--max-prompts", "8", "--repeats", "5"]
        tau = ["--ns", "2,4,8", "--thetas", "0", "--max-prompts", "8", "--repeats", "1"]
        sizes, pairs, alphas = [], PAIRS, {"llama": "0.6,0.8", "qwen": "0.6,0.8"}
        slots, over = ["--repeats", "30"], ["--repeats", "5", "--prompts", "4", "--max-new-tokens", "64"]
    env = "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'gpu': " \
          "torch.cuda.is_available() and torch.cuda.get_device_name(0)}))"
    scale = DRY_CAP_FACTOR if dry else 1
    return [(name, cap * scale, cmd) for name, cap, cmd in [
        ("env", 30, [PY, "-c", env]),
        ("slots", 45, [*micro, "slots", "--out", str(out), *slots]),
        ("overlap", 60, [*micro, "overlap", "--out", str(out), *over]),
        ("profile", 80, [*CLI, "profile", "--target", "mini-target", "--draft", "mini-draft-1l", "--workload",
                         "functions", "--split", "tune", "--db", db, "--json", *prof]),
        ("fidelity", 110, [*fid, "--splits", "out", "--out", str(out / "fidelity_heldout"), *held]),
        ("tau", 40, [*fid, "--splits", "in", "--out", str(out / "fidelity_in_sample"), *tau]),
        *((f"realsize_{name}", 150, [*real, "--name", name, "--target", t, "--draft", d, "--alphas", alphas[name],
                                              *sizes])
          for name, (t, d) in pairs.items()),
        # the GPU tests (graphed = eager outputs, CUDA events, lean = HF, NVML): last, where the budget allows
        ("pytest_gpu", 60, [PY, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py",
                            "tests/engine/test_batch_graphs.py"]),
    ]]


def run_stage(out: Path, name: str, cap: float, cmd: list[str], deadline: float, log: dict) -> dict | None:
    """Run one stage within ``min(cap, what is left)``; keep its output; its JSON stdout (None otherwise)."""
    left = deadline - time.monotonic()
    if left < MIN_STAGE_S:
        log[name] = {"exit": f"skipped: {left:.0f} s of the budget left (< {MIN_STAGE_S} s)", "seconds": 0,
                     "command": " ".join(cmd)}
        emit(out, name, "skipped", reason=log[name]["exit"])
        return None
    timeout = min(cap, left)
    emit(out, name, "start", cap_s=cap, timeout_s=round(timeout, 1), command=" ".join(cmd))
    start = time.monotonic()
    with open(out / f"{name}.out", "w") as so, open(out / f"{name}.err", "w") as se:
        try:  # the output goes straight to files: a stage killed at its cap keeps what it printed
            code = subprocess.run(cmd, cwd=ROOT, stdout=so, stderr=se, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = f"timeout after {timeout:.0f} s (cap {cap:.0f} s)"
    seconds = time.monotonic() - start
    log[name] = {"exit": code, "seconds": round(seconds, 1), "cap_s": cap, "command": " ".join(cmd)}
    emit(out, name, "end", exit=code, seconds=round(seconds, 1))
    try:
        return json.loads((out / f"{name}.out").read_text()) if code == 0 else None
    except json.JSONDecodeError:
        return None


def main(
    out: str = typer.Option(os.environ.get("OUT", "gpu_check_out"), "--out",
                            help="Folder for every output (default: $OUT when set)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="The same stages on the CPU with tiny sizes."),
    budget_s: float = typer.Option(350.0, "--budget-s", help=(
        "Seconds all stages may take together; a stage gets min(its cap, what is left) and is skipped with a "
        "note below 20 s. 350 s leaves the one call (install included) under 7 minutes.")),
    only: str = typer.Option("", "--only", help="Comma-separated stage names to run (default: all, in order)."),
    run: int | None = typer.Option(None, "--run", help=(
        "A profile run already in <out>/gpu.db for the fidelity and tau stages (a rerun with --only fidelity,tau "
        "on the same machine).")),
    pack: str = typer.Option("", "--pack", help=(
        "Also keep, after every stage, four files in this folder: summary.json, events.jsonl, goals.txt and "
        "gpu_check.tgz (the whole --out folder): a lent GPU machine returns at most 8 files from $OUT.")),
) -> None:
    deadline = time.monotonic() + budget_s
    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "figures").mkdir(exist_ok=True)
    summary: dict = {"label": "measured", "dry_run": dry_run, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                     "budget_s": budget_s, "stages": {}, "results": {}, "goals": {}}
    chosen = {s.strip() for s in only.split(",") if s.strip()}
    run_id = run
    for name, cap, cmd in stages(folder, dry_run):
        if chosen and name not in chosen:
            continue
        if "{run}" in cmd:
            if run_id is None:
                summary["stages"][name] = {"exit": "skipped: no profile run", "seconds": 0}
                emit(folder, name, "skipped", reason="no profile run")
                continue
            cmd = [str(run_id) if c == "{run}" else c for c in cmd]
        got = run_stage(folder, name, cap, cmd, deadline, summary["stages"])
        if name == "profile" and got:
            run_id = got.get("run_id")
        _collect(folder, name, got, summary)
        summary["goals"] = evaluate(summary["results"], dry_run, summary["stages"])
        summary["figures"] = figures(folder / "figures", summary["results"])
        _save(folder, summary, pack)
    summary["wall_s"] = round(budget_s - (deadline - time.monotonic()), 1)
    _save(folder, summary, pack)
    print("\n".join(goal_lines(summary)))


def _save(folder: Path, summary: dict, pack: str) -> None:
    """summary.json and goals.txt now; with ``pack``, those, events.jsonl and a tarball of the folder there."""
    write_json(folder / "summary.json", summary)
    (folder / "goals.txt").write_text("\n".join(goal_lines(summary)) + "\n")
    if not pack:
        return
    target = Path(pack)
    target.mkdir(parents=True, exist_ok=True)
    for name in ("summary.json", "events.jsonl", "goals.txt"):
        if (folder / name).is_file():
            shutil.copyfile(folder / name, target / name)
    tmp = target / "gpu_check.tgz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(folder, arcname="gpu_check")
    tmp.replace(target / "gpu_check.tgz")


def _collect(folder: Path, name: str, got: dict | None, summary: dict) -> None:
    """The stage's numbers into ``summary['results']``: its JSON stdout or the file it wrote."""
    files = {"slots": "slots.json", "overlap": "overlap.json", "fidelity": "fidelity_heldout.json",
             "tau": "fidelity_in_sample.json"}
    if name.startswith("realsize_"):
        found = sorted(p for p in folder.glob("realsize_*.json") if p.stem.removeprefix("realsize_") in PAIRS)
        summary["results"]["realsize"] = {p.stem.removeprefix("realsize_"): json.loads(p.read_text()) for p in found}
        return
    path = folder / files.get(name, "")
    if name in files and path.is_file():
        summary["results"][name] = json.loads(path.read_text())
    elif got is not None:
        summary["results"][name] = got
    _emit_numbers(folder, name, summary["results"].get(name))


def _emit_numbers(folder: Path, name: str, got: dict | None) -> None:
    """The CLI stages' numbers into events.jsonl too (the in-process stages wrote theirs as they went)."""
    if not got:
        return
    if name == "profile":
        emit(folder, name, "result", run_id=got.get("run_id"), identity_check=got.get("identity_check"),
             timed_regions=got.get("timed_regions"), verify_ms_b1=(got.get("verify_ms") or {}).get("1"),
             cuda_graphs=got.get("cuda_graphs"))
    elif name in ("fidelity", "tau"):
        for split, rows in (got.get("rows") or {}).items():
            for r in rows:
                emit(folder, name, "configuration", split=split, **{k: r.get(k) for k in (
                    "config", "measured", "ci95", "predicted", "error", "tau_measured", "tau_predicted",
                    "per_repeat_tokens_per_s", "profile_ran_it")})
        emit(folder, name, "summary", summary=got.get("summary"))


if __name__ == "__main__":
    typer.run(main)
