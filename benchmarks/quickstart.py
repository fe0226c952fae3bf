"""The README's Quickstart, run exactly as printed, in a fresh folder: every command's wall time, exit
code and the lines that carry its numbers, and whether speculative decoding beat plain decoding.

Usage (about 6-10 minutes on a quiet 2-core machine, most of it `profile`):

    python benchmarks/quickstart.py                 # quiet machine
    python benchmarks/quickstart.py --neighbour     # one CPU-bound process running throughout

"As printed" means: the commands are read from README.md's Quickstart block (not copied here), run
one by one with ``bash -c`` in a new empty folder (``--run latest`` is the profile this run made), and
the environment variables that would change what a newcomer sees are removed first
(``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``SPECDEC_DB``): the tool must choose its own measuring
conditions. The venv this script runs in comes first on ``PATH``, as an activated venv would.

Writes ``benchmarks/results/quickstart_cpu_<quiet|neighbour>.txt`` (the full outputs) and ``.json``.
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from _bench import write_results
from fidelity import neighbour_process  # a sibling script: python puts benchmarks/ on sys.path
from specdec_tune.cli import _options as opts

ROOT = Path(__file__).resolve().parent.parent
CLEARED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "SPECDEC_DB")
NUMBERS = re.compile(r"tokens/s|speedup|\dx\b|×|wall", re.IGNORECASE)
MEASURED_RATE = re.compile(r"measured: ([\d.]+) tokens/s")

Neighbour = Annotated[bool, typer.Option("--neighbour", help=(
    "Run one CPU-bound process (a busy Python loop) beside every command: the shared machine users run on."))]
Out = Annotated[str | None, typer.Option("--out", help=(
    "Result file stem in benchmarks/results (default: quickstart_cpu_quiet or quickstart_cpu_neighbour)."))]
Readme = Annotated[Path, typer.Option("--readme", help="The README whose Quickstart block is run.")]


def quickstart_commands(readme: str) -> list[str]:
    """The commands of the first ``bash`` block under the ``## Quickstart`` heading, comments removed."""
    section = readme.split("\n## Quickstart", 1)
    if len(section) < 2:
        raise ValueError("README.md has no '## Quickstart' section")
    block = section[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip()  # a trailing comment starts with ' # '
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def newcomer_env() -> dict[str, str]:
    """This environment without the variables a newcomer would not have set, with this venv on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_command(command: str, cwd: Path, env: dict[str, str]) -> dict:
    """Run one command; its exit code, wall seconds, full output and the lines carrying numbers."""
    start = time.perf_counter()
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    output = proc.stdout + proc.stderr
    lines = [ln.rstrip() for ln in output.splitlines()
             if NUMBERS.search(ln) and "Loading weights" not in ln]
    return {"command": command, "exit_code": proc.returncode, "wall_s": round(wall, 1), "numbers": lines,
            "output": output}


def generate_speedup(results: list[dict]) -> dict | None:
    """The two `generate` commands of one prompt, with a draft and with ``--draft none``: their ratio."""
    rates: dict[str, float] = {}
    for r in results:
        match = MEASURED_RATE.search(r["output"])
        if r["command"].split()[:2] == ["specdec-tune", "generate"] and "--prompt " in r["command"] and match:
            rates["plain" if "--draft none" in r["command"] else "speculative"] = float(match.group(1))
    if len(rates) < 2:
        return None
    return {**rates, "ratio": rates["speculative"] / rates["plain"]}


def machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return f"{platform.machine()} {model}, {os.cpu_count()} CPUs"


def report(results: list[dict], meta: dict) -> list[str]:
    lines = [f"README Quickstart as printed, {meta['date']}, {meta['machine']}, "
             f"{'one CPU-bound neighbour' if meta['neighbour'] else 'no neighbour started'}, load average at start "
             f"{meta['load_at_start']}", f"cleared: {', '.join(CLEARED)}; folder: a new empty one", ""]
    for r in results:
        lines.append(f"$ {r['command']}")
        lines.append(f"  exit {r['exit_code']}, {r['wall_s']} s wall")
        lines += [f"  | {ln}" for ln in r["numbers"]]
    gen = meta.get("generate")
    if gen:
        lines += ["", f"generate, one prompt: speculative {gen['speculative']:.1f} / plain {gen['plain']:.1f} tokens/s "
                      f"= {gen['ratio']:.2f}x (single measured runs, no CI)"]
    lines.append(f"total {meta['total_s']:.0f} s")
    return lines


def main(neighbour: Neighbour = False, out: Out = None, readme: Readme = ROOT / "README.md") -> None:
    commands = quickstart_commands(readme.read_text())
    env = newcomer_env()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "neighbour": neighbour,
            "load_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="quickstart-") as folder, neighbour_process(neighbour):
        results = []
        for command in commands:
            results.append(run_command(command, Path(folder), env))
            print(f"{results[-1]['exit_code']:>3} {results[-1]['wall_s']:>7.1f} s  {command}", flush=True)
    meta["total_s"] = time.perf_counter() - start
    meta["generate"] = generate_speedup(results)
    stem = out or f"quickstart_cpu_{'neighbour' if neighbour else 'quiet'}"
    text = report(results, meta)
    write_results(None, stem, "\n".join(text) + "\n\nfull outputs\n\n" + "\n".join(
        f"$ {r['command']}\n{r['output']}" for r in results), {"meta": meta, "results": results})
    print("\n".join(text))
    if any(r["exit_code"] for r in results):
        raise typer.Exit(1)


if __name__ == "__main__":
    opts.run_script(main)
