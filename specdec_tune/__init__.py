"""specdec-tune: measure, model, tune and export speculative decoding for your models, workload and hardware.

The rooms (``engine``, ``profiler``, ``tuner``, ``db``, ``dashboard``, ``training``) are its
subpackages, ``core`` holds the rules and records every room shares, and ``cli`` is the ``specdec-tune``
command. The words, formulas and import contracts are in ``docs/architecture.md``.
"""
from __future__ import annotations

__version__ = "0.1.0"
