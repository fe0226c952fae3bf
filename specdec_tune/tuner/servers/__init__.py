"""What each inference server can express, its time model calibrated to measurements, and the files it reads.

Public names only; the modules behind them are private (``_table``: the capability table, the one
list of servers; ``_time_model`` and ``_calibration``: the server time model and its fit to server
runs; ``_ship``: which configuration each server's files carry; ``_exports``, ``_schemas``, ``_readme``, ``_gguf``,
``_write``: the exported files and writing them; ``_trtllm_fields``: TensorRT-LLM's own field names;
``_paths``: the model paths an export names; ``_sources``: where an export's result comes from).
"""
from __future__ import annotations

from specdec_tune.tuner.servers._calibration import ServerPrediction, acceptance_terms, best_server_n_per_batch_size
from specdec_tune.tuner.servers._calibration import calibrate_from, group_points_of, kind_of, mean_prompt_tokens
from specdec_tune.tuner.servers._calibration import points_of, predict_server
from specdec_tune.tuner.servers._exports import ALL, FORMATS, batch_ranges, build_exports, model_path
from specdec_tune.tuner.servers._exports import Shipped, resolve_formats, schedule_points, server_best, ship, ship_all
from specdec_tune.tuner.servers._exports import vllm_config
from specdec_tune.tuner.servers._paths import check_root
from specdec_tune.tuner.servers._schemas import HfAssistantGenerationConfig, HfPromptLookupGenerationConfig
from specdec_tune.tuner.servers._schemas import LlamacppSpeculativeArgs, SglangSpeculativeArgs, TrtllmExtraOptions
from specdec_tune.tuner.servers._schemas import TrtllmSpeculativeConfig, VllmSpeculativeConfig
from specdec_tune.tuner.servers._sources import parse_config, result_from_run, result_from_study
from specdec_tune.tuner.servers._table import SERVERS, ServerSpace, caveats, expressible, project, server_space
from specdec_tune.tuner.servers._time_model import KINDS, ServerModel, ServerPoint, ServerTimes, calibrate
from specdec_tune.tuner.servers._time_model import context_tokens, point_from_counts
from specdec_tune.tuner.servers._write import GGUF_DOWNLOAD_LIMIT, Written, download_files, render_exports
from specdec_tune.tuner.servers._write import write_exports, write_formats

__all__ = [
    "ALL", "FORMATS", "GGUF_DOWNLOAD_LIMIT", "KINDS", "SERVERS", "HfAssistantGenerationConfig", "HfPromptLookupGenerationConfig",
    "LlamacppSpeculativeArgs", "ServerModel", "ServerPoint", "ServerPrediction", "ServerSpace", "ServerTimes",
    "Shipped", "SglangSpeculativeArgs", "TrtllmExtraOptions", "TrtllmSpeculativeConfig", "VllmSpeculativeConfig",
    "Written", "acceptance_terms", "batch_ranges", "check_root", "best_server_n_per_batch_size", "build_exports", "calibrate",
    "calibrate_from", "caveats", "context_tokens", "download_files", "expressible", "group_points_of", "kind_of", "mean_prompt_tokens",
    "model_path", "parse_config", "point_from_counts", "points_of", "predict_server", "project", "render_exports", "resolve_formats",
    "result_from_run", "result_from_study", "schedule_points", "server_best", "server_space", "ship", "ship_all", "vllm_config", "write_exports",
    "write_formats",
]  # fmt: skip
