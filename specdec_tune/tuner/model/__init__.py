"""The pure throughput model: predict any configuration from a stored profile (no torch, no timing).

Public names only; the modules behind them are private (``_throughput``: the analytic model,
``_replay``: trace replay, ``_greedy_sim``: exact greedy simulation, ``_tree`` and ``_tree_predict``:
token trees and staged drafting, ``_batch_theory``: batch speculative decoding's rejections (seed
003), ``_calibration``: in-loop calibration, ``_loop_costs``: the θ > 0 check, the hooks' tax and a
decode's first cycle, ``_identity``: the check at a profile's end, ``_timings``: a run's timing samples
grouped, ``_profile`` and ``_load``: profile assembly, ``_predict`` and ``_prefill``: end-to-end
predictions, ``_speed``: machine-speed rescaling, ``_grid``: the N × θ ranking, ``_tv``: acceptance from
the teacher-forced TV and lossy replay, ``_bias``: a lossy rule's bias, ``_chain``: acceptance sources and
chains, ``_spec``: the model's records, ``_configs``: the configuration records every room exchanges,
``_decision``: what each server's file carries and the measured evidence behind it, ``_evaluator``: cached
predictions of candidates, ``_latency_prediction``: predicted TTFT and TPOT, ``_memory``: predicted memory,
``_objective``: what ``tune`` optimises).
"""
from __future__ import annotations

from specdec_tune.tuner.model._batch_theory import all_rejected, batch_rejection_limit, batch_rejections, sibling_acceptance
from specdec_tune.tuner.model._bias import BiasPrediction, bias_of, front_epsilons
from specdec_tune.tuner.model._calibration import OverheadFit, fit_overhead
from specdec_tune.tuner.model._configs import NGRAM, NONE, THRESHOLD_RULES, Candidate, TuningResult, spec_config
from specdec_tune.tuner.model._configs import SEARCH_BASIS, predicted_basis
from specdec_tune.tuner.model._decision import MIN_LOWER, ServerDecision, decide, decisions
from specdec_tune.tuner.model._evaluator import Evaluator, Scored
from specdec_tune.tuner.model._greedy_sim import PositionTrace, position_traces, simulate_prompt
from specdec_tune.tuner.model._grid import THRESHOLD_GRID, best_configs
from specdec_tune.tuner.model._identity import identity_check, run_identity_check
from specdec_tune.tuner.model._latency_prediction import LatencyPrediction, predict_latency
from specdec_tune.tuner.model._memory import GIB, MemoryBreakdown, MemoryModel, ModelMemory
from specdec_tune.tuner.model._objective import OBJECTIVES, UNITS, Objective, better, describe_side, direction
from specdec_tune.tuner.model._objective import format_value, predicted_value
from specdec_tune.tuner.model._load import load_run_profile, load_tree_data
from specdec_tune.tuner.model._predict import PromptSpec, RunPrediction, predict_baseline, predict_config
from specdec_tune.tuner.model._predict import predict_prompts, profiled_specs, split_specs
from specdec_tune.tuner.model._speed import at_machine_speed, machine_speed, probe_tracks
from specdec_tune.tuner.model._profile import PromptInfo, RunProfile, build_run_profile, resolve_draft, run_drafts
from specdec_tune.tuner.model._profile import synthetic_rates, with_synthetic_acceptance
from specdec_tune.tuner.model._replay import ReplayStats, Trace, heuristic_stationary, replay, replay_reach
from specdec_tune.tuner.model._throughput import ModelProfile, Prediction, SpecConfig, alphas_from_traces
from specdec_tune.tuner.model._throughput import baseline_tokens_per_s, best_n_per_batch_size
from specdec_tune.tuner.model._throughput import closed_form_tokens_per_cycle, draft_step_time, predict, rank_configs
from specdec_tune.tuner.model._throughput import relative_error, tokens_per_cycle_per_position, verify_time
from specdec_tune.tuner.model._tree import RANKS, StagedStats, TreeCycle, TreeData, expected_tau, simulate_tree
from specdec_tune.tuner.model._tree_predict import TreePlan, predict_tree_prompts, tree_overhead, tree_plan, width_time
from specdec_tune.tuner.model._tv import lossy_stats, tv_stats

__all__ = [
    "BiasPrediction", "bias_of", "front_epsilons", "tv_stats", "lossy_stats",
    "GIB", "OBJECTIVES", "Objective", "UNITS", "better", "describe_side", "direction", "format_value",
    "predicted_value", "LatencyPrediction", "MemoryBreakdown", "MemoryModel", "ModelMemory",
    "MIN_LOWER", "NGRAM", "NONE", "all_rejected", "batch_rejection_limit", "batch_rejections", "sibling_acceptance", "THRESHOLD_GRID", "THRESHOLD_RULES", "Candidate", "Evaluator", "ModelProfile", "OverheadFit",
    "PositionTrace", "Prediction", "PromptInfo", "PromptSpec", "ReplayStats", "RunPrediction", "RunProfile", "Scored",
    "ServerDecision", "SpecConfig", "Trace", "TuningResult", "alphas_from_traces", "at_machine_speed", "baseline_tokens_per_s", "best_configs",
    "best_n_per_batch_size", "build_run_profile", "closed_form_tokens_per_cycle", "decide", "decisions", "draft_step_time", "fit_overhead",
    "heuristic_stationary", "machine_speed", "load_run_profile", "position_traces", "predict", "predict_baseline", "predict_config",
    "predict_latency", "predict_prompts", "profiled_specs", "rank_configs", "relative_error", "replay", "replay_reach",
    "resolve_draft",
    "run_drafts", "simulate_prompt", "spec_config", "split_specs", "synthetic_rates", "tokens_per_cycle_per_position",
    "verify_time", "with_synthetic_acceptance",
    "RANKS", "StagedStats", "TreeCycle", "TreeData", "TreePlan", "expected_tau", "load_tree_data", "predict_tree_prompts",
    "simulate_tree", "tree_overhead", "tree_plan", "width_time",
    "SEARCH_BASIS", "predicted_basis", "identity_check", "run_identity_check", "probe_tracks",
]  # fmt: skip
