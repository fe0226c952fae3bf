"""One-way arrows (ARCHITECTURE §2): engine -> profiler -> db <- tuner; the CLI and dashboard on top.

Every import statement of every module in a room is read from its source (including imports inside
functions), so a lazy import of a forbidden room fails here as well as a top-level one.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# room -> rooms (subpackages of specdec_tune) its modules must never import.
FORBIDDEN = {
    "engine": {"profiler", "tuner", "db", "cli", "dashboard"},
    "profiler": {"tuner", "cli", "dashboard"},
    "db": {"engine", "profiler", "tuner", "cli", "dashboard"},
    "tuner": {"cli", "dashboard"},
}


def imported_rooms(path: Path) -> set[str]:
    """The specdec_tune subpackages a module imports (absolute imports)."""
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "specdec_tune":
                names += [f"specdec_tune.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "specdec_tune" and len(parts) > 1:
                rooms.add(parts[1])
    return rooms


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_no_import_against_the_arrows(room):
    bad = []
    for path in sorted((ROOT / room).rglob("*.py")):
        hit = imported_rooms(path) & FORBIDDEN[room]
        if hit:
            bad.append(f"{path.relative_to(ROOT)} imports {', '.join(sorted(hit))}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_lazy_imports(tmp_path):
    """The check has power: a function-level import of a forbidden room is found."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from specdec_tune.tuner.model import predict\n    import specdec_tune.db as d\n")
    assert imported_rooms(module) == {"tuner", "db"}


def test_cli_commands_live_in_the_cli_room():
    """The CLI is its own room: the tuner holds no command modules."""
    assert not list((ROOT / "tuner").glob("cli*.py")) and not (ROOT / "tuner" / "_app.py").exists()
