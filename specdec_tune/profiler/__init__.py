"""Measure speculative decoding: timers, micro-benchmarks of T_s and T_v(k), acceptance traces, end-to-end
runs (our engine and vLLM), NVML telemetry; every measurement is stored through ``db``.

The names below are the profiler's public face: the tuner drives the profiler through them only
(the import contracts in ``pyproject.toml`` check it). The CLI may also use the modules themselves.
The profiler never imports the tuner: it measures, it does not decide.
"""
from __future__ import annotations

from specdec_tune.engine import resolve_source
from specdec_tune.engine.workloads import resolve_workload
from specdec_tune.profiler.backends import LlamacppError, ServerConfig, ServerGroup, ServerMeasurement, VllmError
from specdec_tune.profiler.backends import cached_gguf, copy_gguf, find_llamacpp, gguf_for_model, local_model_dir
from specdec_tune.profiler.backends import measure_arms_vllm, measure_on_server, require_vllm_python, server_version
from specdec_tune.profiler.measure import chosen_prompts, default_split, measure_configs
from specdec_tune.profiler.measure_records import PLAIN, Measurement, MeasureSpec
from specdec_tune.profiler.session import check_inputs, run_profile
from specdec_tune.profiler.settings import ProfileResult, ProfileSettings, Progress, StageLog
from specdec_tune.profiler.suite_runs import ArmSpec, PromptSample, environment_fingerprint, measure_arms
from specdec_tune.profiler.suite_runs import model_identity, model_source
from specdec_tune.profiler.threads import ThreadChoice, apply_threads, choose_threads, idle_cpus

__all__ = [
    "LlamacppError", "cached_gguf", "copy_gguf", "find_llamacpp", "gguf_for_model", "local_model_dir",
    "ThreadChoice", "check_inputs", "apply_threads", "choose_threads", "idle_cpus",
    "PLAIN", "ArmSpec", "MeasureSpec", "Measurement", "ProfileResult", "ProfileSettings", "Progress", "PromptSample",
    "ServerConfig", "ServerGroup", "ServerMeasurement", "StageLog", "VllmError", "chosen_prompts", "default_split",
    "environment_fingerprint", "measure_arms", "measure_arms_vllm", "measure_configs", "measure_on_server",
    "model_identity", "model_source", "require_vllm_python", "resolve_source", "resolve_workload", "run_profile",
    "server_version",
]  # fmt: skip
