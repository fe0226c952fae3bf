"""Where the vLLM venv finds arctic-inference (``scripts/setup_arctic_inference.sh``), for the tests that run
the vLLM venv's Python directly (the vLLM worker reads the same variable: profiler/backends/_vllm.py)."""
from __future__ import annotations

import os


def vllm_env() -> dict[str, str]:
    """The environment a test runs the vLLM venv's Python in: ours without our PYTHONPATH, with
    ``$SPECDEC_VLLM_EXTRA_PATH`` (where ``scripts/setup_arctic_inference.sh`` put arctic-inference) instead."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    if os.environ.get("SPECDEC_VLLM_EXTRA_PATH"):
        env["PYTHONPATH"] = os.environ["SPECDEC_VLLM_EXTRA_PATH"]
    return env
