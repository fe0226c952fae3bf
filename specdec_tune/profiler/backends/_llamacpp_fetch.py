"""Fetch llama.cpp's GGUF converter alone, when an export needs it and ``scripts/setup_llamacpp.sh`` never ran.

Converting a model to GGUF needs llama.cpp's Python converter (``convert_hf_to_gguf.py``, its
``conversion/`` package, ``gguf-py/``, and ``models/templates/``, which some architectures read) and
sentencepiece, not the CPU ``llama-server`` the script builds (a long build: docs/results.md,
llama.cpp against the engine). Both come
from the source the script uses: PyPI's llama-cpp-python sdist (``SDIST_VERSION``, ``vendor/llama.cpp``).

How it is fetched, and why:

- ``pip download --no-binary llama-cpp-python --no-deps``, the script's own command, so the user's pip
  configuration (index, mirror, proxy, certificates) applies as it does to every other install. pip
  also reads the sdist's metadata with its build backend (scikit-build-core, in an isolated
  environment; it builds nothing), a few seconds a direct download of the file would save, at the
  price of reading pip's configuration ourselves.
- The file is checked against its sha256 (:data:`SDIST_SHA256`, PyPI's file for that version), so a
  mirror serving something else is refused before anything is unpacked.
- It is kept where the script keeps it (``<cache>/llamacpp/sdist/``) and the converter goes to the
  home folder the script builds in (``llamacpp_home()``), so the script later builds from the same
  file, and a machine the script set up never fetches. sentencepiece goes to ``HOME/pylib/py3.X``
  with ``pip install --target``, as the script installs it.

``SPECDEC_LLAMACPP_FETCH=0`` turns the fetch off (offline machines): an export then refuses llama.cpp,
saying why. The download and every later step print a line to stderr.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Protocol

from specdec_tune.core.cache import cache_dir
from specdec_tune.profiler.backends._llamacpp import LLAMA_CPP_COMMIT, SDIST_VERSION, LlamaCpp, LlamacppError

FETCH_ENV = "SPECDEC_LLAMACPP_FETCH"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # PyPI's file
SDIST_MB = 76.6
VENDOR = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
# What the converter reads from its tree (models/ also holds vocabulary GGUFs the converter does not read).
PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "models/templates/", "LICENSE")
SENTENCEPIECE = "sentencepiece>=0.1.98,<0.3.0"  # llama.cpp's requirements-convert_legacy_llama.txt

Say = Callable[[str], None]


def say_stderr(message: str) -> None:
    print(f"llama.cpp converter: {message}", file=sys.stderr, flush=True)


def fetch_allowed() -> bool:
    """Whether a missing converter may be fetched (``SPECDEC_LLAMACPP_FETCH`` is not 0/false/no/off)."""
    return os.environ.get(FETCH_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def sdist_file() -> Path:
    """Where the sdist is kept: the folder ``scripts/setup_llamacpp.sh`` downloads it to."""
    return cache_dir() / "llamacpp" / "sdist" / SDIST_NAME


class Source(Protocol):
    """Where the sdist and sentencepiece come from (:class:`PipSource`; tests pass a local one)."""

    sha256: str  # what the sdist must hash to

    def download_sdist(self, folder: Path, say: Say) -> Path:
        """Download the sdist into ``folder`` and return the file."""

    def install(self, requirement: str, target: Path, say: Say) -> None:
        """Install ``requirement`` into the folder ``target`` (``pip install --target``)."""


@dataclass(frozen=True)
class PipSource:
    """The user's pip, with the user's configuration."""

    python: str = sys.executable
    sha256: str = SDIST_SHA256

    def download_sdist(self, folder: Path, say: Say) -> Path:
        cmd = [self.python, "-m", "pip", "download", "--no-binary", "llama-cpp-python", "--no-deps",
               f"llama-cpp-python=={SDIST_VERSION}", "-d", str(folder), *_progress_args()]
        _run_pip(cmd, say, f"download llama-cpp-python {SDIST_VERSION}'s sdist")
        found = folder / SDIST_NAME
        if not found.is_file():
            raise LlamacppError(f"pip download left no {SDIST_NAME} in {folder}")
        return found

    def install(self, requirement: str, target: Path, say: Say) -> None:
        _run_pip([self.python, "-m", "pip", "install", "-q", "--target", str(target), requirement], say,
                 f"install {requirement}")


def default_source() -> Source:
    return PipSource()


def _progress_args() -> list[str]:
    """pip 24.1+ prints ``Progress X of Y`` lines with ``--progress-bar raw``; older pip prints none."""
    try:
        major, minor = (int(x) for x in metadata.version("pip").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return []
    return ["--progress-bar", "raw"] if (major, minor) >= (24, 1) else ["--progress-bar", "off"]


_PROGRESS = re.compile(r"Progress (\d+) of (\d+)")


def _run_pip(cmd: list[str], say: Say, what: str) -> None:
    """Run pip, turning its raw progress into a line per quarter; a failure is one line (pip's last)."""
    tail: list[str] = []
    shown = 0
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout or ():
            m = _PROGRESS.search(line)
            if m and int(m.group(2)) > 0:
                quarter = 4 * int(m.group(1)) // int(m.group(2))
                if quarter > shown:
                    shown = quarter
                    say(f"downloaded {25 * quarter}% of {int(m.group(2)) / 1e6:.1f} MB")
            elif line.strip():
                tail = (tail + [line.strip()])[-20:]
    if proc.returncode != 0:
        last = next((x for x in reversed(tail) if x.lower().startswith("error")), tail[-1] if tail else "no output")
        raise LlamacppError(f"pip could not {what}: {last}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One fetch per home folder at a time (two exports at once: the second waits, then finds it done)."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sdist(source: Source, say: Say) -> Path:
    """The kept sdist when its sha256 is right, else a fresh download, checked, then kept."""
    sha256 = source.sha256
    kept = sdist_file()
    if kept.is_file() and _sha256(kept) == sha256:
        say(f"using the sdist kept in {kept.parent}")
        return kept
    kept.parent.mkdir(parents=True, exist_ok=True)
    say(f"downloading llama-cpp-python {SDIST_VERSION}'s sdist (about {SDIST_MB:.0f} MB, once per machine; "
        f"{FETCH_ENV}=0 turns this off)")
    work = Path(tempfile.mkdtemp(prefix=".download.", dir=kept.parent))
    try:
        got = source.download_sdist(work, say)
        digest = _sha256(got)
        if digest != sha256:
            raise LlamacppError(f"the downloaded {got.name} has sha256 {digest[:16]}…, not the pinned "
                                f"{sha256[:16]}…; nothing was unpacked")
        got.replace(kept)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return kept


def _unpack(sdist: Path, dest: Path) -> None:
    """The converter's parts of ``vendor/llama.cpp`` (:data:`PARTS`) into ``dest``; parts already there
    (a full source tree unpacked by the script) are kept."""
    work = Path(tempfile.mkdtemp(prefix=".unpack.", dir=dest.parent))
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                rel = m.name[len(VENDOR):] if m.name.startswith(VENDOR) else None
                if rel and ".." not in rel.split("/") and (m.isfile() or m.isdir()) \
                        and any(rel == p or rel.startswith(p) for p in PARTS):
                    m.name = rel
                    members.append(m)
            if not any(m.name == PARTS[0] for m in members):
                raise LlamacppError(f"{sdist.name} holds no {VENDOR}{PARTS[0]}")
            # Plain files and folders under the parts only; the "data" filter (3.10.12+) also refuses links.
            tar.extractall(work, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        dest.mkdir(parents=True, exist_ok=True)
        for child in sorted(work.iterdir()):
            if not (dest / child.name).exists():
                child.rename(dest / child.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fetch_converter(llama: LlamaCpp, *, source: Source | None = None, say: Say = say_stderr) -> None:
    """Make ``llama``'s converter usable (module docstring): the converter's files from the sdist and
    sentencepiece into its pylib, whichever is missing. Nothing is fetched when nothing is missing.

    Raises:
        LlamacppError: the download, its checksum, the unpacking or the install failed (one line).
    """
    source = source or default_source()
    llama.home.mkdir(parents=True, exist_ok=True)
    with _locked(llama.home / ".fetch.lock"):
        missing = llama.missing_converter()
        if not missing:
            return
        start = time.monotonic()
        say(f"llama.cpp {LLAMA_CPP_COMMIT}'s GGUF converter is missing ({', '.join(missing)}); fetching it "
            f"into {llama.home}")
        if any(not p.startswith("pylib") for p in missing):
            _unpack(_sdist(source, say), llama.source)
            say(f"unpacked the converter into {llama.source}")
        if not llama.pylib.is_dir():
            work = Path(tempfile.mkdtemp(prefix=".pylib.", dir=llama.home))
            try:
                source.install(SENTENCEPIECE, work, say)
                llama.pylib.parent.mkdir(parents=True, exist_ok=True)
                work.rename(llama.pylib)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            say(f"installed {SENTENCEPIECE} into {llama.pylib}")
        say(f"ready in {time.monotonic() - start:.0f} s")
