"""The lean forward's fused CPU kernels (``lean_kernels.cpp``), compiled once per source, torch and CPU.

At the sizes of a draft step or a verify step most of a decoder layer's time on a CPU is operator
dispatch, not arithmetic: RMSNorm alone is a composite of about ten ATen operators, the rotary
embedding and the cache write another dozen. The C++ file computes each group in one call. It is
compiled on first use with torch's extension builder (a C++ compiler and ninja; 30 to 100 s) into a
folder of specdec-tune's cache (:func:`specdec_tune.core.cache.cache_dir`, ``lean_kernels/<key>``) named by
what the library depends on: the source's hash, the torch version, the CPU's instruction set
(``-march=native``), the Python ABI and the torch installation (torch's builder writes its include
paths into the build file, so two virtual environments sharing one folder would rebuild each other's).
The source is copied into that folder and compiled from there, so checkouts at different paths share
one build; later processes load it in milliseconds. A build is announced with one ``logging`` warning (the engine never prints;
the CLI shows it on stderr). Where the kernels cannot be built the lean forward runs its eager
operators (the same function); ``SPECDEC_LEAN_KERNELS=0`` asks for that explicitly.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import re
import sys
import sysconfig
import warnings
from pathlib import Path
from types import ModuleType

from specdec_tune.core.cache import cache_dir

SOURCE = Path(__file__).with_name("lean_kernels.cpp")
ENV = "SPECDEC_LEAN_KERNELS"
_state: dict[str, object] = {}
log = logging.getLogger(__name__)


def build_directory() -> Path:
    """The folder the kernels are built in: one per (source, torch version, CPU, Python), per user."""
    import torch

    source = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    version = re.sub(r"[^A-Za-z0-9.]+", "_", torch.__version__)
    # torch's builder writes the include paths of this torch and this Python, and the folder's own path,
    # into its build file; a change in any of them rebuilds. So the installation is in the key and the
    # folder's path is resolved (the test session reaches the same cache through a symlink).
    install = f"{Path(torch.__file__).resolve().parent}|{sysconfig.get_paths()['include']}"
    key = (f"torch-{version}-{sys.implementation.cache_tag}-cpu-{_cpu_tag()}-src-{source}"
           f"-env-{hashlib.sha1(install.encode()).hexdigest()[:8]}")
    return (cache_dir() / "lean_kernels").resolve() / key


def _build() -> ModuleType:
    from torch.utils.cpp_extension import LIB_EXT, load

    folder = build_directory()
    folder.mkdir(parents=True, exist_ok=True)
    name = "specdec_lean_kernels_" + hashlib.sha1(folder.name.encode()).hexdigest()[:12]  # an identifier
    source = _stage(folder)
    if not (folder / f"{name}{LIB_EXT}").exists():
        log.warning("building the lean forward's CPU kernels once for this source, torch and CPU (30 to 100 s) "
                    "in %s", folder)
    return load(name=name, sources=[str(source)], extra_cflags=["-O3", "-march=native"],
                build_directory=str(folder), verbose=False)


def _stage(folder: Path) -> Path:
    """The source copied into the build folder (written once, atomically: its content is in the
    folder's name, and an unchanged file keeps ninja from rebuilding)."""
    staged = folder / SOURCE.name
    if not staged.exists():
        partial = folder / f".{SOURCE.name}.{os.getpid()}"
        partial.write_bytes(SOURCE.read_bytes())
        os.replace(partial, staged)
    return staged


def _cpu_tag() -> str:
    """A short hash of the CPU's instruction-set flags (Linux) or its name elsewhere."""
    text = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text += next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def kernels() -> ModuleType | None:
    """The compiled kernels, or None when disabled or not buildable (the reason in :func:`unavailable`)."""
    if "module" not in _state:
        module, reason = None, None
        if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            reason = f"disabled by {ENV}=0"
        else:
            try:
                module = _build()
            except Exception as exc:  # noqa: BLE001 - any build failure falls back to the eager operators
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                reason = f"could not be built ({first})"
                warnings.warn(f"the lean forward's CPU kernels {reason}; using eager operators", stacklevel=2)
        _state["module"], _state["reason"] = module, reason
    return _state["module"]  # type: ignore[return-value]


def unavailable() -> str | None:
    """Why :func:`kernels` returns None (None when they are loaded)."""
    kernels()
    return _state["reason"]  # type: ignore[return-value]


def status() -> str:
    """``fused`` where the kernels are loaded, else ``eager`` and the reason (fingerprints, bench)."""
    return "fused" if kernels() is not None else f"eager ({unavailable()})"
