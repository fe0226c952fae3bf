"""The arrows between the rooms, checked by import-linter on the real imports.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and are explained in
``docs/architecture.md``. import-linter builds its graph with grimp from every ``import`` statement of
the installed package, lazy imports inside functions included. Each contract is shown to have power:
a violation planted in a copy of the package breaks exactly that contract.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"


def lint_imports(package_parent: Path | None = None, contract: str | None = None) -> subprocess.CompletedProcess:
    """Run import-linter in a fresh interpreter (``package_parent``: where the package to check lives)."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    args = [sys.executable, "-c", code, str(CONFIG), "--no-cache", "--no-logo"]
    if contract:
        args += ["--contract", contract]
    env = None
    if package_parent is not None:
        import os

        env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=package_parent or ROOT, timeout=300)


def test_the_contracts_hold():
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _package_copy(dest: Path) -> Path:
    """The package's Python sources, without data files."""
    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if not (Path(folder, n).is_dir() or n.endswith(".py")) or n == "__pycache__"]

    shutil.copytree(ROOT / "specdec_tune", dest / "specdec_tune", ignore=ignore)
    return dest


# (module to plant, its source, the contract it must break)
PLANTED = [
    ("engine/_planted.py", "from specdec_tune.db import Database\n", "rooms"),
    ("db/planted.py", "def f():\n    from specdec_tune.engine import load_model\n", "rooms"),
    ("profiler/planted.py", "from specdec_tune.tuner.model import predict\n", "rooms"),
    ("tuner/model/planted.py", "from specdec_tune.tuner.search import run_tune\n", "tuner-rooms"),
    ("tuner/search/planted.py", "from specdec_tune.training import card\n", "rooms"),  # tuner | training: apart
    ("core/stats.py", "from specdec_tune.engine import load_model\n", "shared"),
    ("dashboard/planted.py", "from specdec_tune.tuner.servers import SERVERS\n", "dashboard-reads"),
    ("dashboard/planted.py", "from specdec_tune.db._connection import sqlite_path\n", "dashboard-public"),
    ("tuner/search/planted.py", "from specdec_tune.profiler.session import run_profile\n", "tuner-drives-profiler"),
    ("tuner/servers/planted.py", "from specdec_tune.engine import zoo\n", "tuner-drives-profiler"),
    ("tuner/search/planted.py", "from specdec_tune.tuner.servers._table import SERVERS\n", "private"),
]


@pytest.mark.parametrize(("module", "source", "contract"), PLANTED, ids=[f"{c}:{m}" for m, _, c in PLANTED])
def test_a_planted_violation_breaks_its_contract(tmp_path, module, source, contract):
    parent = _package_copy(tmp_path)
    path = parent / "specdec_tune" / module
    if path.exists():  # plant into an existing module: append, keep what it had
        source = path.read_text() + "\n" + source
    path.write_text(source)
    result = lint_imports(parent, contract)
    assert result.returncode == 1 and "1 broken" in result.stdout, result.stdout + result.stderr


def test_the_copy_without_a_plant_passes(tmp_path):
    """The planted runs check a copy of the package: the copy itself keeps every contract."""
    result = lint_imports(_package_copy(tmp_path))
    assert result.returncode == 0 and "0 broken" in result.stdout, result.stdout + result.stderr
