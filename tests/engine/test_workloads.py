"""Prompt files: validation with file:line messages, bundled names, user paths."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_tune.engine.workloads import (
    Prompt,
    bundled_workloads,
    load_prompts,
    load_workload,
    resolve_workload,
)
from specdec_tune.core.errors import InputError


def _write(tmp_path: Path, lines: list[str], name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_valid_file_round_trip(tmp_path: Path) -> None:
    path = _write(tmp_path, [
        json.dumps({"id": "a", "prompt": "def f():", "category": "code"}),
        "",  # blank lines are allowed
        json.dumps({"id": 7, "prompt": "x = 1\n"}),
    ])
    assert load_prompts(path) == [Prompt("a", "def f():", "code"), Prompt("7", "x = 1\n", None)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps({"id": 1}), "missing field 'prompt'"),
        (json.dumps({"id": 1, "prompt": ""}), "'prompt' must be a non-empty string"),
        (json.dumps({"id": 1, "prompt": 5}), "'prompt' must be a non-empty string"),
        (json.dumps({"prompt": "p"}), "missing field 'id'"),
        (json.dumps({"id": True, "prompt": "p"}), "'id' must be"),
        (json.dumps({"id": [1], "prompt": "p"}), "'id' must be"),
        (json.dumps({"id": 1, "prompt": "p", "category": 3}), "'category' must be a string"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = _write(tmp_path, [json.dumps({"id": 0, "prompt": "ok"}), "", line])
    with pytest.raises(InputError) as info:
        load_prompts(path)
    assert str(info.value).startswith("prompts.jsonl:3: ")
    assert message in str(info.value)


def test_duplicate_id_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, [json.dumps({"id": 1, "prompt": "a"}), json.dumps({"id": "1", "prompt": "b"})])
    with pytest.raises(InputError, match=r"prompts.jsonl:2: duplicate id '1' \(first on line 1\)"):
        load_prompts(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match="empty.jsonl: no prompts"):
        load_prompts(path)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_prompts(tmp_path / "nope.jsonl")


def test_bundled_names_resolve_to_package_files() -> None:
    names = bundled_workloads()
    assert {"functions", "docstrings", "tables"} <= set(names)
    for name in names:
        path = resolve_workload(name)
        assert path.is_file() and path.name == f"{name}.jsonl"


def test_user_path_resolves_and_loads(tmp_path: Path) -> None:
    path = _write(tmp_path, [json.dumps({"id": "only", "prompt": "hello"})], name="mine.jsonl")
    assert resolve_workload(str(path)) == path
    assert [p.id for p in load_workload(str(path))] == ["only"]


def test_unknown_workload_lists_bundled_names(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        resolve_workload("no-such-workload")
    assert "'no-such-workload'" in str(info.value)
    for name in bundled_workloads():
        assert name in str(info.value)
    with pytest.raises(InputError, match="is not a file"):
        resolve_workload(str(tmp_path))


def test_bundled_workloads_are_valid_and_large_enough() -> None:
    for name in ("functions", "docstrings", "tables"):
        prompts = load_workload(name)
        assert len(prompts) >= 32, name
        assert all(p.category for p in prompts), name
        assert len({p.id for p in prompts}) == len(prompts)
