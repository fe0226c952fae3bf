"""Shared fixtures: tiny random Llama models built from configs (no downloads)."""
from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing is a broken install anyway
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


CORPUS = (
    "def add(a, b):\n    return a + b\n\n"
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "for i in range(10):\n    print(i, i * i)\n"
) * 4


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """Saved tiny target/draft folders sharing a tokenizer, and one draft with a different vocabulary."""
    from tests.tiny import save_tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("tiny_models")
    tok = tiny_tokenizer(CORPUS, vocab=300)
    other = tiny_tokenizer(CORPUS.upper() + "xyz qrs", vocab=290)
    return {
        "target": str(save_tiny_model(root / "target", tok, layers=2, seed=0)),
        "draft": str(save_tiny_model(root / "draft", tok, layers=1, seed=1)),
        "other": str(save_tiny_model(root / "other", other, layers=1, seed=2)),
    }


def pytest_configure(config):
    # Tiny test models run faster on one thread, and the suite must share 2 cores with CI itself.
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def vllm_python():
    """The vLLM venv's Python (``SPECDEC_VLLM_PYTHON``); the test skips, saying why, without one."""
    from specdec_tune.profiler.vllm_backend import resolve_vllm_python

    try:
        python = resolve_vllm_python(None)
    except Exception as exc:  # noqa: BLE001 - a broken configuration is a skip reason here
        pytest.skip(f"vLLM environment misconfigured: {exc}")
    if python is None:
        pytest.skip("no vLLM environment configured: run scripts/setup_vllm_env.sh and set SPECDEC_VLLM_PYTHON")
    return python
