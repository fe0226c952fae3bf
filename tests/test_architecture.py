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
    ("dashboard/planted.py", "from specdec_tune.db._connection import sqlite_path\n", "faces-db"),
    ("tuner/search/planted.py", "from specdec_tune.profiler.session import run_profile\n", "faces-profiler"),
    ("tuner/servers/planted.py", "from specdec_tune.engine import zoo\n", "tuner-runs-no-model"),
    ("profiler/planted.py", "from specdec_tune.engine.workloads import load_workload\n", "faces-engine"),
    ("cli/planted.py", "def f():\n    from specdec_tune.profiler.runs import encode_prompt\n", "faces-profiler"),
    ("cli/planted.py", "from specdec_tune.dashboard.launch import serve\n", "faces-dashboard"),
    ("cli/planted.py", "def f():\n    from specdec_tune.training.recipe import run_recipe\n", "faces-training"),
    ("tuner/search/planted.py", "from specdec_tune.tuner.servers._table import SERVERS\n", "private"),
]


FAST_PLANTED = {"rooms:engine/_planted.py", "shared:core/stats.py", "dashboard-reads:dashboard/planted.py"}


@pytest.mark.parametrize(("module", "source", "contract"), [
    pytest.param(m, s, c, id=f"{c}:{m}", marks=() if f"{c}:{m}" in FAST_PLANTED else pytest.mark.slow)
    for m, s, c in PLANTED])  # the fast tier plants three; the full run every one
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


def test_the_engine_face_loads_no_torch_for_the_checks_commands_make_first():
    """Commands refuse a bad model name, workload or zoo entry before torch loads: the engine's face is lazy."""
    code = ("import sys, specdec_tune.cli\n"
            "from specdec_tune.engine import list_models, load_workload, read_manifest, resolve_source, resolve_workload\n"
            "load_workload('functions'); list_models()\n"
            "sys.exit(sorted({'torch', 'transformers'} & set(sys.modules)) or 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_engine_face_table_and_its_type_checking_imports_agree():
    """``_HOME`` (what the lazy face loads) and the ``TYPE_CHECKING`` imports (what type checkers and
    import-linter read) name the same public names from the same modules."""
    import ast

    import specdec_tune.engine as engine

    tree = ast.parse((ROOT / "specdec_tune" / "engine" / "__init__.py").read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {(a.asname or a.name): f"{n.module.rsplit('.', 1)[1]}" + ("" if a.asname is None else f".{a.name}")
                for n in block.body for a in n.names}
    assert imported == engine._HOME


@pytest.mark.parametrize("room", ["engine", "profiler", "profiler.backends", "db", "dashboard", "training",
                                  "tuner.model", "tuner.servers", "tuner.search", "tuner.regress"])
def test_every_name_on_a_face_is_there(room):
    """Each room's ``__all__`` is its face: every name in it resolves."""
    import importlib

    face = importlib.import_module(f"specdec_tune.{room}")
    missing = [name for name in face.__all__ if not hasattr(face, name)]
    assert face.__all__ and not missing, missing
