"""The zoo's training corpus: the Python standard library's own ``.py`` source files.

The standard library is present on every machine that runs the tool, so the recipe needs no
download. It is licensed under the PSF License Agreement (Python Software Foundation License v2).
Files are split into *train* and *held-out* by a hash of their path relative to the stdlib folder,
so the split is deterministic, independent of file-system order, and stable when files are added.
"""
from __future__ import annotations

import ast
import hashlib
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Folders left out: third-party code, the test suites (huge, repetitive, partly generated) and caches.
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
HELD_OUT_PERCENT = 10
_SPLIT_SALT = "specdec-tune-zoo-v1"


@dataclass(frozen=True)
class SourceFile:
    """One corpus file: its path relative to the stdlib folder and its text."""

    relpath: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """The split corpus."""

    root: Path
    train: tuple[SourceFile, ...]
    held_out: tuple[SourceFile, ...]

    def summary(self) -> dict[str, int | str]:
        """Sizes of both parts (files, bytes), for the model card and the manifest."""
        return {
            "root": str(self.root),
            "train_files": len(self.train),
            "train_bytes": sum(len(f.text.encode("utf-8")) for f in self.train),
            "held_out_files": len(self.held_out),
            "held_out_bytes": sum(len(f.text.encode("utf-8")) for f in self.held_out),
        }


def stdlib_root() -> Path:
    """The folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relpath: str) -> bool:
    """Whether a file (path relative to the stdlib folder, ``/``-separated) belongs to held-out."""
    digest = hashlib.sha256(f"{_SPLIT_SALT}:{relpath}".encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT


def list_source_files(root: Path | None = None) -> list[str]:
    """Relative paths of every corpus ``.py`` file under ``root``, sorted."""
    root = stdlib_root() if root is None else Path(root)
    out: list[str] = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        out.append(rel.as_posix())
    return sorted(out)


def load_corpus(root: Path | None = None, max_files: int | None = None) -> Corpus:
    """Read and split the corpus.

    Args:
        root: the stdlib folder (default: the running interpreter's).
        max_files: keep only the first ``max_files`` files of each part (sorted by path), for the
            quick smoke recipe and tests.

    Returns:
        The corpus, files sorted by relative path. Files that are not valid UTF-8 are skipped.
    """
    root = stdlib_root() if root is None else Path(root)
    train: list[SourceFile] = []
    held: list[SourceFile] = []
    for rel in list_source_files(root):
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a handful of stdlib files are latin-1 test data; not worth special-casing
        if not text.strip():
            continue
        (held if is_held_out(rel) else train).append(SourceFile(rel, text))
    if max_files is not None:
        train, held = train[:max_files], held[: max(2, max_files // 4)]
    return Corpus(root=root, train=tuple(train), held_out=tuple(held))


def parsed(files: Iterable[SourceFile]) -> Iterator[tuple[SourceFile, ast.Module, list[str]]]:
    """Each file that parses as Python, with its syntax tree and its lines (line ends kept); a file this
    Python cannot parse is skipped."""
    for f in files:
        try:
            tree = ast.parse(f.text)
        except SyntaxError:
            continue
        yield f, tree, f.text.splitlines(keepends=True)
