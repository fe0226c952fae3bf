"""Build the bundled prompt sets from held-out corpus files.

Three sets of different predictability, each prompt cut at a point inside a structure:

- ``functions``: the prompt ends inside a function body, after its first statements (code).
- ``docstrings``: the prompt ends inside a docstring or a ``#`` comment block (English prose).
- ``tables``: the prompt ends inside a long literal (dict/list/tuple/set of many entries, e.g. the
  codec tables in ``encodings/``) or a run of look-alike one-line statements (constant definitions,
  repeated calls of one function, imports) — repetitive, highly predictable text.

Each prompt holds the source lines before the cut point, trimmed at a line boundary so that the
prompt is between ``min_tokens`` and ``max_tokens`` tokens. Files are visited round-robin, so no
file dominates a set.
"""
from __future__ import annotations

import ast
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from specdec_tune.training.corpus import SourceFile, parsed

WORKLOAD_KINDS = ("functions", "docstrings", "tables")


@dataclass(frozen=True)
class Cut:
    """A cut point: the prompt is the file's text up to and including line ``line`` (1-based)."""

    line: int
    category: str
    partial: str = ""  # text appended after the last full line (e.g. the start of a docstring line)


def _function_cuts(tree: ast.AST, lines: list[str]) -> Iterator[Cut]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            # Skip the docstring statement; cut after 1-2 real statements of a body of >= 3.
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]
            if len(body) >= 3 and body[-1].end_lineno - body[0].lineno >= 4:
                k = 1 + (node.lineno % 2)
                yield Cut(line=body[k - 1].end_lineno, category="function_body")


def _docstring_cuts(tree: ast.AST, lines: list[str]) -> Iterator[Cut]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                doc = body[0].value
                if isinstance(doc.value, str) and doc.end_lineno - doc.lineno >= 3:
                    # Cut after the docstring's first line (the summary): the rest is prose to continue.
                    yield Cut(line=doc.lineno + 1, category="docstring")
    # Comment blocks: >= 3 consecutive lines starting with '#'; cut after the first two.
    run = 0
    for i, line in enumerate(lines, start=1):
        if line.lstrip().startswith("#") and not line.startswith("#!"):
            run += 1
            if run == 3 and i + 1 <= len(lines) and lines[i].lstrip().startswith("#"):
                yield Cut(line=i - 1, category="comment")
        else:
            run = 0


def _table_cuts(tree: ast.AST, lines: list[str]) -> Iterator[Cut]:
    # Long literals (codec tables, keyword lists, dispatch dicts): cut a third and two thirds in.
    for node in ast.walk(tree):
        if isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set)):
            elts = node.keys if isinstance(node, ast.Dict) else node.elts
            anchors = [e if e is not None else v for e, v in zip(elts, getattr(node, "values", elts))]
            if len(anchors) >= 8 and node.end_lineno - node.lineno >= 8:
                kind = f"{type(node).__name__.lower()}_literal"
                fractions = (1 / 4, 1 / 2, 3 / 4) if len(anchors) >= 24 else (1 / 2,)
                for frac in fractions:
                    mid = anchors[int(len(anchors) * frac)]
                    if mid.lineno > anchors[0].lineno:
                        yield Cut(line=mid.lineno, category=kind)
    # Runs of >= 5 look-alike statements (constant assignments, calls of one function, imports).
    for node in ast.walk(tree):
        for field_name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field_name, None)
            if not isinstance(stmts, list):
                continue
            run: list[ast.stmt] = []
            for stmt in stmts + [None]:
                if stmt is not None and run and _signature(stmt) == _signature(run[0]) and _signature(stmt):
                    run.append(stmt)
                    continue
                if len(run) >= 5 and all(s.end_lineno == s.lineno for s in run):
                    yield Cut(line=run[(2 * len(run)) // 3 - 1].end_lineno, category="statement_run")
                run = [stmt] if stmt is not None else []


def _signature(stmt: ast.stmt) -> str:
    """A coarse kind of a one-line statement, equal for look-alike statements ('' = not one)."""
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
        return "assign_constant"
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return "import"
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return "call:" + ast.unparse(stmt.value.func)
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
        return "assign_call:" + ast.unparse(stmt.value.func)
    return ""


FINDERS: dict[str, Callable[[ast.AST, list[str]], Iterator[Cut]]] = {
    "functions": _function_cuts,
    "docstrings": _docstring_cuts,
    "tables": _table_cuts,
}


def _prompt_for(lines: list[str], cut: Cut, count_tokens: Callable[[str], int], lo: int, hi: int,
                rng: random.Random) -> str | None:
    """Text ending at the cut, starting at a line boundary, with lo..hi tokens (or None)."""
    end = cut.line
    target = rng.randint(lo + 32, hi - 32)  # vary prompt lengths across the set
    start = end
    text = ""
    while start > 0:
        candidate = "".join(lines[start - 1 : end])
        n = count_tokens(candidate)
        if n > hi:
            break
        start -= 1
        text = candidate
        if n >= target:
            break
    if not text:
        return None
    n = count_tokens(text)
    return text if lo <= n <= hi else None


def build_workload(kind: str, files: list[SourceFile], count_tokens: Callable[[str], int], *,
                   size: int = 40, min_tokens: int = 64, max_tokens: int = 512, seed: int = 0) -> list[dict]:
    """Prompts of one kind from the given (held-out) files.

    Args:
        kind: one of :data:`WORKLOAD_KINDS`.
        files: the source files to cut prompts from.
        count_tokens: returns the token count of a string (the zoo tokenizer).
        size: number of prompts wanted (fewer if the files do not hold enough cut points).
        min_tokens: shortest prompt, in tokens.
        max_tokens: longest prompt, in tokens.
        seed: seeds the choice of cut points and prompt lengths.

    Returns:
        JSON-ready records ``{"id", "category", "prompt", "source"}`` in a deterministic order.
    """
    if kind not in FINDERS:
        raise ValueError(f"unknown workload kind {kind!r}; expected one of {WORKLOAD_KINDS}")
    rng = random.Random(f"{seed}:{kind}")
    per_file: list[tuple[SourceFile, list[Cut]]] = []
    for f, tree, lines in parsed(files):
        cuts = [c for c in FINDERS[kind](tree, lines) if 1 <= c.line <= len(lines)]
        if cuts:
            rng.shuffle(cuts)
            per_file.append((f, cuts))
    records: list[dict] = []
    seen: set[str] = set()
    taken: dict[str, int] = {}
    per_file_cap = max(2, -(-size // 10))  # no file gives more than a tenth of the set
    # True tables (literals) first, look-alike statement runs only to fill the set; within a tier,
    # round-robin over files (first cut of every file, then the second, ...) so no file dominates.
    for tier in (False, True):
        queues = [(f, [c for c in cuts if (c.category == "statement_run") == tier]) for f, cuts in per_file]
        depth = 0
        while len(records) < size and any(depth < len(c) for _, c in queues):
            for f, cuts in queues:
                if depth >= len(cuts) or len(records) >= size or taken.get(f.relpath, 0) >= per_file_cap:
                    continue
                lines = f.text.splitlines(keepends=True)
                text = _prompt_for(lines, cuts[depth], count_tokens, min_tokens, max_tokens, rng)
                if text is None or text in seen:
                    continue
                seen.add(text)
                taken[f.relpath] = taken.get(f.relpath, 0) + 1
                records.append({
                    "id": f"{kind}-{len(records):03d}",
                    "category": cuts[depth].category,
                    "prompt": text,
                    "source": f"{f.relpath}:{cuts[depth].line}",
                })
            depth += 1
    return records


def write_jsonl(records: list[dict], path: Path) -> None:
    """Write records one JSON object per line (UTF-8, stable key order)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
