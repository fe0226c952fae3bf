"""specdec-tune: measure, model, tune and export speculative decoding.

The code lives in five subpackages (``engine``, ``profiler``, ``tuner``, ``db``, ``dashboard``),
mapped into this package by ``pyproject.toml``. See ARCHITECTURE.md for the words used here.
"""
from __future__ import annotations

__version__ = "0.1.0"
