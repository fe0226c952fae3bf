"""Prompt sets ("workloads"): bundled JSONL files or a user's own JSONL file.

Format: one JSON object per non-blank line, with

- ``id`` (string or integer, required; converted to ``str``),
- ``prompt`` (non-empty string, required),
- ``category`` (string, optional).

Every malformed line is reported as ``<file>:<line>: <what is wrong>`` through :class:`InputError`, so
the CLI prints one clear line and exits with code 2.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdec_tune.core.errors import InputError

WORKLOADS_DIR = Path(__file__).resolve().parent / "zoo" / "workloads"


@dataclass(frozen=True)
class Prompt:
    """One prompt of a workload."""

    id: str
    prompt: str
    category: str | None = None


def bundled_workloads() -> list[str]:
    """Names of the workloads shipped with the package (file stems, sorted)."""
    if not WORKLOADS_DIR.is_dir():
        return []
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.jsonl"))


def resolve_workload(name_or_path: str | Path) -> Path:
    """Turn a bundled workload name or a path to a JSONL file into a file path.

    Args:
        name_or_path: a bundled name such as ``functions``, or the path of a ``.jsonl`` file.

    Returns:
        The path of an existing file.

    Raises:
        InputError: neither a bundled name nor an existing file; the message lists the bundled names.
    """
    text = str(name_or_path)
    if not text.strip():
        raise InputError(f"empty workload name; bundled workloads: {', '.join(bundled_workloads())}")
    bundled = WORKLOADS_DIR / f"{text}.jsonl"
    # A bare name (no separator, no suffix) is looked up among the bundled sets first.
    if "/" not in text and "\\" not in text and not text.endswith(".jsonl") and bundled.is_file():
        return bundled
    path = Path(text).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise InputError(f"workload {text!r} is not a file")
    raise InputError(
        f"unknown workload {text!r}: not a bundled workload and no such file; "
        f"bundled workloads: {', '.join(bundled_workloads()) or '(none)'}"
    )


def load_prompts(path: str | Path) -> list[Prompt]:
    """Read and validate a JSONL prompt file.

    Args:
        path: the JSONL file.

    Returns:
        The prompts in file order.

    Raises:
        InputError: the file cannot be read, is empty, has a duplicate id, or a line is not a JSON
            object with a non-empty string ``prompt``, an ``id`` (string or integer) and an optional
            string ``category``. The message names the file and line number.
    """
    path = Path(path)
    name = path.name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"prompt file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read prompt file {str(path)!r}: {exc}") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        prompt = _parse_line(line, f"{name}:{lineno}")
        if prompt.id in seen:
            raise InputError(f"{name}:{lineno}: duplicate id {prompt.id!r} (first on line {seen[prompt.id]})")
        seen[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise InputError(f"{name}: no prompts (the file is empty)")
    return prompts


def _parse_line(line: str, where: str) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "prompt" not in obj:
        raise InputError(f"{where}: missing field 'prompt'")
    prompt = obj["prompt"]
    if not isinstance(prompt, str) or not prompt:
        raise InputError(f"{where}: 'prompt' must be a non-empty string")
    if "id" not in obj:
        raise InputError(f"{where}: missing field 'id'")
    raw_id = obj["id"]
    # bool is an int subclass in Python; an id of `true` is almost certainly a mistake.
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or raw_id == "":
        raise InputError(f"{where}: 'id' must be a non-empty string or an integer, got {raw_id!r}")
    category = obj.get("category")
    if category is not None and not isinstance(category, str):
        raise InputError(f"{where}: 'category' must be a string, got {category!r}")
    return Prompt(id=str(raw_id), prompt=prompt, category=category)


def load_workload(name_or_path: str | Path) -> list[Prompt]:
    """Load a bundled workload by name, or a user's JSONL file by path."""
    return load_prompts(resolve_workload(name_or_path))
