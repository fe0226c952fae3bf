"""The lean forward's fused CPU kernels (``lean_kernels.cpp``), compiled once per machine.

At the sizes of a draft step or a verify step most of a decoder layer's time on a CPU is operator
dispatch, not arithmetic: RMSNorm alone is a composite of about ten ATen operators, the rotary
embedding and the cache write another dozen. The C++ file computes each group in one call. It is
compiled on first use with torch's extension builder (a C++ compiler and ninja; about 30 s on this
project's CI machine) into torch's extension cache (``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``), so later processes load it in milliseconds. Where it cannot be built
the lean forward runs its eager operators (the same function); ``SPECDEC_LEAN_KERNELS=0`` asks for
that explicitly.
"""
from __future__ import annotations

import hashlib
import os
import platform
import sys
import warnings
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("lean_kernels.cpp")
ENV = "SPECDEC_LEAN_KERNELS"
_state: dict[str, object] = {}


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load

    name = f"specdec_lean_kernels_{_cpu_tag()}"  # -march=native: one build per kind of CPU (shared homes)
    if _needs_build(name):
        print("specdec-tune: building the lean forward's CPU kernels (once per machine, about 30 s)", file=sys.stderr)
    return load(name=name, sources=[str(SOURCE)], extra_cflags=["-O3", "-march=native"],
                verbose=False)


def _cpu_tag() -> str:
    """A short hash of the CPU's instruction-set flags (Linux) or its name elsewhere."""
    text = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text += next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def _needs_build(name: str) -> bool:
    try:
        from torch.utils.cpp_extension import _get_build_directory

        built = Path(_get_build_directory(name, verbose=False)) / f"{name}.so"
    except Exception:  # noqa: BLE001 - only decides whether to announce a build
        return True
    return not built.exists() or built.stat().st_mtime < SOURCE.stat().st_mtime


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
