"""Measure speculative decoding: timers, micro-benchmarks of T_s and T_v(k), acceptance traces, end-to-end
runs (our engine, and real servers through the ``backends`` sub-room: vLLM, llama.cpp), NVML telemetry;
every measurement is stored through ``db``.

The names below are the profiler's public face: every other room (the tuner, the CLI, training) uses the
profiler through them only (the ``faces-profiler`` import contract in ``pyproject.toml``). The profiler
never imports the tuner: it measures, it does not decide. Its modules keep plain names (not Optuna's
``_name``): ``docs/architecture.md``, Rooms, says why.
"""
from __future__ import annotations

from specdec_tune.engine import resolve_source, resolve_workload
from specdec_tune.profiler.backends import LlamacppError, ServerConfig, ServerGroup, ServerMeasurement, VllmError
from specdec_tune.profiler.backends import cached_gguf, copy_gguf, find_llamacpp, gguf_for_model, local_model_dir
from specdec_tune.profiler.backends import VllmPair, measure_arms_vllm, measure_on_server, require_vllm_python
from specdec_tune.profiler.backends import server_version
from specdec_tune.profiler.bench import HF_METHODS, OURS, RATIOS, VLLM_METHODS, run_bench
from specdec_tune.profiler.clean import describe as describe_timed_regions
from specdec_tune.profiler.measure import chosen_prompts, default_split, measure_configs
from specdec_tune.profiler.measure_records import PLAIN, Measurement, MeasureSpec
from specdec_tune.profiler.runs import DraftSpec, encode_prompt, measure_prompt, warm_up
from specdec_tune.profiler.session import check_inputs, run_profile
from specdec_tune.profiler.settings import ProfileResult, ProfileSettings, Progress, StageLog
from specdec_tune.profiler.suite_runs import ArmSpec, PromptSample, environment_fingerprint, measure_arms
from specdec_tune.profiler.suite_runs import model_identity, model_source
from specdec_tune.profiler.threads import ThreadChoice, apply_threads, choose_threads, idle_cpus
from specdec_tune.profiler.timers import Stopwatch

__all__ = [
    "LlamacppError", "cached_gguf", "copy_gguf", "find_llamacpp", "gguf_for_model", "local_model_dir",
    "ThreadChoice", "check_inputs", "apply_threads", "choose_threads", "idle_cpus",
    "PLAIN", "ArmSpec", "MeasureSpec", "Measurement", "ProfileResult", "ProfileSettings", "Progress", "PromptSample",
    "ServerConfig", "ServerGroup", "ServerMeasurement", "StageLog", "VllmError", "chosen_prompts", "default_split",
    "environment_fingerprint", "measure_arms", "measure_arms_vllm", "measure_configs", "measure_on_server",
    "model_identity", "model_source", "require_vllm_python", "resolve_source", "resolve_workload", "run_profile",
    "server_version",
    "DraftSpec", "Stopwatch", "VllmPair", "encode_prompt", "measure_prompt", "warm_up",
    "HF_METHODS", "OURS", "RATIOS", "VLLM_METHODS", "run_bench", "describe_timed_regions",
]  # fmt: skip
