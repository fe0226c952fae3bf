"""Where llama.cpp lives on this machine, and converting a Hugging Face model to GGUF with it.

``scripts/setup_llamacpp.sh`` unpacks PyPI's llama-cpp-python sdist (:data:`SDIST_VERSION`, which
vendors ggml-org/llama.cpp@ :data:`LLAMA_CPP_COMMIT`) into a *home* folder and builds the CPU
``llama-server`` there::

    HOME/llama.cpp/             the vendored source: convert_hf_to_gguf.py, conversion/, gguf-py/
    HOME/bin/llama-server       the server (static)
    HOME/pylib/py3.X/           the converter's one requirement our venv lacks (sentencepiece), per Python

Exporting needs only the converter (``HOME/llama.cpp`` and ``HOME/pylib``), not the server: where it
is missing, :func:`require_converter` fetches it alone into the same folder (``_llamacpp_fetch.py``: a
77 MB download, not the server's 39-minute build), unless ``SPECDEC_LLAMACPP_FETCH=0``.

HOME is ``$SPECDEC_LLAMACPP_DIR`` if set, else ``<cache>/llamacpp/<version>-<cpu key>``
(:func:`specdec_tune.core.cache.cache_dir`): the build uses the host's instruction set (GGML_NATIVE), so
its folder is keyed by the machine and its CPU flags, computed here exactly as the script does.

The converter runs with specdec-tune's own Python (torch, numpy, safetensors and transformers are
already there; its pinned transformers 4.57 is not needed for Llama-architecture models, which
convert with 5.2x), through ``_gguf_convert.py``, a shim that names byte-level BPE pre-tokenizers the
converter's hash table cannot (that file explains why).
"""
from __future__ import annotations

import glob
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specdec_tune.core.cache import cache_dir
from specdec_tune.core.errors import SpecdecError

if TYPE_CHECKING:
    from specdec_tune.profiler.backends._llamacpp_fetch import Source

SDIST_VERSION = "0.3.36"  # llama-cpp-python on PyPI
LLAMA_CPP_COMMIT = "0c1e57098"  # the llama.cpp it vendors (its CHANGELOG.md)
ENV_VAR = "SPECDEC_LLAMACPP_DIR"
SETUP_HINT = "run scripts/setup_llamacpp.sh (or set SPECDEC_LLAMACPP_DIR to its folder)"
SHIM = Path(__file__).with_name("_gguf_convert.py")
CONVERT_TIMEOUT_S = 1800.0


class LlamacppError(SpecdecError):
    """llama.cpp is not installed, or its converter or server failed (the message ends with its last line)."""


def cpu_key() -> str:
    """``<machine>-<12 hex>``: the sha256 of /proc/cpuinfo's first ``flags``/``Features`` line (newline
    included), the same key ``scripts/setup_llamacpp.sh`` computes with ``grep -m1 | sha256sum``."""
    line = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((x for x in f if x.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    digest = hashlib.sha256((line.rstrip("\n") + "\n").encode()).hexdigest()[:12]
    return f"{platform.machine()}-{digest}"


def llamacpp_home() -> Path:
    """``$SPECDEC_LLAMACPP_DIR``, else the cache folder the setup script builds in by default."""
    given = os.environ.get(ENV_VAR, "").strip()
    if given:
        return Path(given).expanduser()
    return cache_dir() / "llamacpp" / f"{SDIST_VERSION}-{cpu_key()}"


@dataclass(frozen=True)
class LlamaCpp:
    """One llama.cpp installation made by ``scripts/setup_llamacpp.sh``."""

    home: Path

    @property
    def server(self) -> Path:
        return self.home / "bin" / "llama-server"

    @property
    def source(self) -> Path:
        return self.home / "llama.cpp"

    @property
    def converter(self) -> Path:
        return self.source / "convert_hf_to_gguf.py"

    @property
    def pylib(self) -> Path:
        """sentencepiece for this Python: the Llama converter imports it before it looks for a
        ``tokenizer.model`` (``conversion/base.py``, ``_create_vocab_sentencepiece``), even for BPE."""
        return self.home / "pylib" / f"py{sys.version_info.major}.{sys.version_info.minor}"

    def missing_converter(self) -> list[str]:
        """The converter's parts not there (empty: models can be converted to GGUF)."""
        need = {"convert_hf_to_gguf.py": self.converter, "conversion/": self.source / "conversion",
                "gguf-py": self.source / "gguf-py", "pylib (sentencepiece)": self.pylib}
        return [name for name, path in need.items() if not path.exists()]

    def missing(self) -> list[str]:
        """The parts not there, server and converter (empty: complete)."""
        return (["llama-server"] if not self.server.exists() else []) + self.missing_converter()


def find_llamacpp() -> LlamaCpp | None:
    """The installation at :func:`llamacpp_home` with its server built, or ``None`` when it is absent or
    incomplete."""
    found = LlamaCpp(llamacpp_home())
    return None if found.missing() else found


def require_llamacpp(purpose: str) -> LlamaCpp:
    """Like :func:`find_llamacpp`, but absence is an error naming ``purpose`` and the way to install it.

    Raises:
        LlamacppError: no complete installation (server built) at :func:`llamacpp_home`.
    """
    found = LlamaCpp(llamacpp_home())
    missing = found.missing()
    if missing:
        raise LlamacppError(f"{purpose} needs llama.cpp {LLAMA_CPP_COMMIT} (llama-cpp-python {SDIST_VERSION}), "
                            f"not found in {found.home} (missing: {', '.join(missing)}); {SETUP_HINT}")
    return found


def require_converter(purpose: str, *, source: Source | None = None) -> LlamaCpp:
    """The installation at :func:`llamacpp_home` with its GGUF converter (the server may be absent):
    a missing converter is fetched alone (``_llamacpp_fetch``, from ``source``: the user's pip by
    default) unless ``SPECDEC_LLAMACPP_FETCH=0``.

    Raises:
        LlamacppError: the converter is missing and fetching it is turned off or failed (one line
            naming ``purpose``, why, and the way to install it).
    """
    from specdec_tune.profiler.backends._llamacpp_fetch import FETCH_ENV, fetch_allowed, fetch_converter

    found = LlamaCpp(llamacpp_home())
    missing = found.missing_converter()
    if not missing:
        return found
    what = (f"{purpose} needs llama.cpp's GGUF converter (llama.cpp {LLAMA_CPP_COMMIT}, llama-cpp-python "
            f"{SDIST_VERSION}), not found in {found.home} (missing: {', '.join(missing)})")
    if not fetch_allowed():
        raise LlamacppError(f"{what}; fetching it is turned off ({FETCH_ENV}={os.environ.get(FETCH_ENV)}); "
                            f"{SETUP_HINT}")
    try:
        fetch_converter(found, source=source)
    except (LlamacppError, OSError) as exc:
        raise LlamacppError(f"{what}, and fetching it failed: {exc}; {SETUP_HINT}") from None
    return found


def convert_to_gguf(model_dir: str | os.PathLike, out_file: str | os.PathLike, *, outtype: str = "f32",
                    llama: LlamaCpp | None = None, target_model_dir: str | os.PathLike | None = None) -> Path:
    """Convert a local Hugging Face model folder to one GGUF file with llama.cpp's own converter.

    ``f32`` keeps every weight as the engine computes with it (the bundled models store float16,
    exactly representable in float32), so llama.cpp and the engine decode the same network. An EAGLE-3 head
    names its target (``target_model_dir``): the converter reads the target's config and tokenizer
    (``convert_hf_to_gguf.py --target-model-dir``, ``conversion/llama.py``).

    Raises:
        LlamacppError: the converter is missing and cannot be fetched, or it failed (its last error line).
    """
    llama = llama or require_converter("converting a model to GGUF")
    src, out = Path(model_dir), Path(out_file)
    if not (src / "config.json").is_file():
        raise LlamacppError(f"cannot convert {src} to GGUF: not a local model folder with a config.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(llama.pylib), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, str(SHIM), str(llama.source), str(src), "--outtype", outtype, "--outfile", str(tmp)]
    if target_model_dir is not None:
        cmd += ["--target-model-dir", str(target_model_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=CONVERT_TIMEOUT_S)
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        last = [x for x in proc.stderr.splitlines() if x.strip()][-1:] or ["no output"]
        raise LlamacppError(f"llama.cpp's convert_hf_to_gguf.py failed on {src}: {last[0]}")
    tmp.replace(out)
    return out


def local_model_dir(source: str) -> Path | None:
    """The local folder holding model ``source`` (a folder, or a hub id already in the Hugging Face
    cache), or ``None``: the converter reads files, it does not download."""
    path = Path(source).expanduser()
    if (path / "config.json").is_file():
        return path
    try:
        from huggingface_hub import snapshot_download

        found = Path(snapshot_download(source, local_files_only=True))
    except Exception:  # noqa: BLE001 - not a cached hub id (invalid id, not cached, offline): not local
        return None
    return found if (found / "config.json").is_file() else None


def _model_digest(model_dir: Path) -> str:
    """sha256 over the folder's files (names and bytes): what a conversion depends on."""
    h = hashlib.sha256()
    for f in sorted(p for p in model_dir.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def gguf_for_model(model_dir: str | os.PathLike, *, outtype: str = "f32", llama: LlamaCpp | None = None,
                   target_model_dir: str | os.PathLike | None = None) -> Path:
    """The GGUF file of a local model folder: converted once per content and kept in the llama.cpp
    home (``gguf/<name>-<content sha256>-<outtype>.gguf``), so exporting again copies, not converts.

    Raises:
        LlamacppError: the converter is missing and cannot be fetched, or it failed.
    """
    llama = llama or require_converter("converting a model to GGUF")
    cached = _cache_file(llama.home, Path(model_dir), outtype, target_model_dir)
    if not cached.is_file():
        start = time.monotonic()
        print(f"llama.cpp converter: converting {model_dir} to GGUF ({outtype}) ...", file=sys.stderr, flush=True)
        convert_to_gguf(model_dir, cached, outtype=outtype, llama=llama, target_model_dir=target_model_dir)
        print(f"llama.cpp converter: {cached.name} ({cached.stat().st_size / 2**20:.1f} MiB) in "
              f"{time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return cached


def cached_gguf(model_dir: str | os.PathLike, *, outtype: str = "f32",
                target_model_dir: str | os.PathLike | None = None) -> Path | None:
    """The GGUF file :func:`gguf_for_model` made of this model folder (same content), or ``None`` when it
    was not converted on this machine; converts and fetches nothing."""
    src = Path(model_dir)
    if not any((llamacpp_home() / "gguf").glob(f"{glob.escape(src.name)}-*-{outtype}.gguf")):
        return None  # nothing of that name: spare reading the model's files for their digest
    cached = _cache_file(llamacpp_home(), src, outtype, target_model_dir)
    return cached if cached.is_file() else None


def _cache_file(home: Path, src: Path, outtype: str, target: str | os.PathLike | None = None) -> Path:
    # A head's GGUF holds its target's tokenizer and layer count too: both contents name the file.
    digest = _model_digest(src) + (f"-{_model_digest(Path(target))[:8]}" if target is not None else "")
    return home / "gguf" / f"{src.name}-{digest}-{outtype}.gguf"


def copy_gguf(cached: Path, dest: Path) -> Path:
    """Copy a cached GGUF file to ``dest`` (a copy, not a link: the export must not share the cache's file)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, dest)
    return dest
