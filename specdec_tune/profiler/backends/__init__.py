"""The profiler's server adapters: vLLM and llama.cpp, run as real servers and measured.

Public names only; the modules behind them are private (``_vllm``: the worker process in vLLM's own
venv, its answers and vLLM's counters; ``_vllm_worker``: the worker itself, a standalone script run by
path with that venv's Python; ``_vllm_measure``: configurations measured in vLLM as the tuner exports them;
``_vllm_suite``: regression arms in vLLM; ``_vllm_bench``: ``bench``'s vLLM methods; ``_vllm_parity``: our
loop scheduled as vLLM schedules; ``_llamacpp``: finding llama.cpp and converting models to GGUF through
``_gguf_convert``, a standalone script; ``_llamacpp_fetch``: fetching the converter alone;
``_llamacpp_server``: a running llama-server and its counters; ``_llamacpp_parity``: our loop scheduled as
llama-server schedules).
"""
from __future__ import annotations

from specdec_tune.profiler.backends._llamacpp import LlamaCpp, LlamacppError, cached_gguf, copy_gguf, find_llamacpp
from specdec_tune.profiler.backends._llamacpp import gguf_for_model, llamacpp_home, local_model_dir, require_converter
from specdec_tune.profiler.backends._llamacpp_server import LlamaServer, completions_with_counters, parse_metrics
from specdec_tune.profiler.backends._vllm import SpecCounters, VllmError, VllmWorker, counters_from_steps
from specdec_tune.profiler.backends._vllm import require_vllm_python, resolve_vllm_python, server_version
from specdec_tune.profiler.backends._vllm_bench import VllmPair
from specdec_tune.profiler.backends._vllm_measure import ServerConfig, ServerGroup, ServerMeasurement, measure_on_server
from specdec_tune.profiler.backends._vllm_measure import measure_plan
from specdec_tune.profiler.backends._vllm_suite import measure_arms_vllm

__all__ = [
    "LlamaCpp", "LlamaServer", "LlamacppError", "ServerConfig", "ServerGroup", "ServerMeasurement", "SpecCounters",
    "VllmError", "VllmPair", "VllmWorker", "cached_gguf", "completions_with_counters", "copy_gguf",
    "counters_from_steps", "find_llamacpp", "gguf_for_model", "llamacpp_home", "local_model_dir", "measure_arms_vllm",
    "measure_on_server", "measure_plan", "parse_metrics", "require_converter", "require_vllm_python",
    "resolve_vllm_python", "server_version",
]  # fmt: skip
