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

from specdec_tune.errors import InputError

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


SPLITS = ("all", "tune", "holdout")


def check_split(split: str) -> str:
    """Validate a split name or ``A:B`` range without loading a workload; return it stripped.

    Raises:
        InputError: not ``all``, ``tune``, ``holdout`` or ``A:B`` with integers 0 <= A < B.
    """
    text = str(split).strip()
    if text in SPLITS:
        return text
    if text.count(":") == 1:
        a, b = text.split(":")
        try:
            start, stop = int(a), int(b)
        except ValueError:
            start = stop = -1
        if 0 <= start < stop:
            return f"{start}:{stop}"
        if start >= 0 and stop >= 0:
            raise InputError(f"--split {text!r}: the range A:B needs A < B (prompts A..B-1 of the workload)")
    raise InputError(f"--split must be one of {', '.join(SPLITS)} or a range A:B of prompt positions "
                     f"(0 <= A < B), got {split!r}")


def split_prompts(prompts: list[Prompt], split: str) -> list[Prompt]:
    """The prompts of one split of a workload, in workload order.

    The split is defined once, here, and used by ``profile``, ``measure`` and ``tune``:

    - ``tune``: prompts at even positions 0, 2, 4, ... of the workload;
    - ``holdout``: prompts at odd positions 1, 3, 5, ...;
    - ``all``: every prompt;
    - ``A:B``: positions A..B-1 (a Python slice of the workload order; B may not exceed its size).

    Alternating by position keeps both halves representative when a workload is ordered by topic or
    length (the bundled ones are), makes them disjoint and together the whole workload, and needs no
    random seed: the same file always gives the same split.

    Raises:
        InputError: an unknown split, or a range outside the workload.
    """
    split = check_split(split)
    if split == "all":
        return list(prompts)
    if split == "tune":
        return list(prompts[0::2])
    if split == "holdout":
        return list(prompts[1::2])
    start, stop = (int(x) for x in split.split(":"))
    if stop > len(prompts):
        raise InputError(f"--split {split}: the workload has only {len(prompts)} prompts (positions 0..{len(prompts) - 1})")
    return list(prompts[start:stop])
