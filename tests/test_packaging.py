"""The repository's housekeeping: what git ignores, and what setuptools packages (and says) on install."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("path", ["tuned/vllm/speculative_config.json", "tuned/README.md", "specdec.db",
                                  "specdec-studies.db"])
def test_what_the_quick_start_writes_is_ignored(path):
    """README's quick start runs ``tune ... --export tuned`` in the checkout: its files are not changes."""
    assert _git("check-ignore", "-q", "--no-index", path).returncode == 0, path


def test_readme_names_the_cpu_wheel_index_and_keeps_command_1():
    """A machine without a local wheel folder gets the CUDA torch from PyPI: README names PyTorch's CPU
    wheel index for it, while command 1 (what .ci/run performs) stays as printed."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = text[text.index("## Set up a fresh machine"):text.index("## Quickstart")]
    blocks = re.findall(r"```bash\n(.*?)```", setup, re.S)
    command_1 = blocks[0].strip()
    assert command_1.startswith("python3 -m venv .venv") and "specdec-tune tune" in command_1
    assert "--index-url" not in command_1 and "pip install torch==2.13.0 &&" in command_1
    cpu = [b for b in blocks[1:] if "--index-url https://download.pytorch.org/whl/cpu" in b]
    assert cpu and "pip install torch==2.13.0 --index-url" in cpu[0]  # the version command 1 pins


def test_setuptools_packages_are_the_folders_with_an_init(monkeypatch):
    """Data folders (zoo/models/<name>, regress/suites) are neither packages nor guessed data: the
    package-data globs name every data file, so setuptools has nothing ambiguous to warn about."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)
    dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.include_package_data is False
    for package in dist.packages:
        assert all(part.isidentifier() for part in package.split(".")), package
        assert (ROOT / package.replace(".", "/") / "__init__.py").is_file(), package


def _tracked() -> list[str]:
    out = _git("ls-files", "-z", "-co", "--exclude-standard")
    assert out.returncode == 0, out.stderr
    return [f for f in out.stdout.split("\0") if f and os.path.lexists(ROOT / f)]


def _copy(files: list[str], dest: Path) -> None:
    for name in files:
        src, out = ROOT / name, dest / name
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)


@pytest.mark.slow
def test_the_wheel_ships_every_tracked_package_file_without_setuptools_warnings(tmp_path):
    files = _tracked()
    _copy(files, tmp_path / "src")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            str(tmp_path / "src"), "-w", str(tmp_path / "wheel")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert "would be ignored" not in built.stdout + built.stderr and "absent from the `packages`" not in built.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n for n in zf.namelist() if ".dist-info/" not in n}
    package = {f for f in files if f.startswith("specdec_tune/")}
    assert shipped == package
