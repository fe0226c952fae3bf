"""Search a server's space with Optuna on the model's predictions, and confirm the winner by measurement.

The jobs live here: ``run_tune`` (profile, search, confirm, hold out, export), ``measure_predicted``
(validate predictions against measurement) and the vLLM-measured tuning. Public names only; the
modules behind them are private (``_space``, ``_optuna``, ``_server_best``, ``_study``, ``_lease``, ``_request``,
``_prompts``, ``_memory``, ``_tune``, ``_measure``, ``_confirm``, ``_objectives``, ``_validate``, ``_server_tune``,
``_server_objective``, ``_tree_space``).
"""
from __future__ import annotations

from specdec_tune.tuner.search._measure import Measured, completed_trials, measure_candidates, measured_speedup
from specdec_tune.tuner.search._optuna import OBJECTIVES, SearchOutcome, run_search
from specdec_tune.tuner.search._lease import HEARTBEAT_S, STALE_S, StudyLease, study_subject
from specdec_tune.tuner.search._prompts import PromptCounts, check_prompts
from specdec_tune.tuner.search._request import TuneInterrupted, TuneReport, TuneRequest, find_profile
from specdec_tune.tuner.search._server_best import best_per_server, brute_force, expressible_on, per_batch_size
from specdec_tune.tuner.search._server_tune import CALIBRATION_NS, NGRAM_CALIBRATION_N, ServerTuneReport, close_calls
from specdec_tune.tuner.search._server_tune import pick_among_tied, run_server_tune, schedule_from_measured
from specdec_tune.tuner.search._space import ANY, N_LIMIT, THETA_GRID, SearchSpace, check_server, server_search_space
from specdec_tune.tuner.search._space import unsupported
from specdec_tune.tuner.search._study import check_storage, load_existing, open_storage
from specdec_tune.tuner.search._tree_space import DEFAULT_TREES, check_shapes, shape_candidate, tree_space_args
from specdec_tune.tuner.search._tune import check_profile, run_tune
from specdec_tune.tuner.search._validate import Validated, measure_predicted

__all__ = [
    "check_profile",
    "ANY", "CALIBRATION_NS", "NGRAM_CALIBRATION_N", "N_LIMIT", "OBJECTIVES", "THETA_GRID", "Measured", "PromptCounts",
    "SearchOutcome", "check_prompts",
    "SearchSpace", "ServerTuneReport", "TuneReport", "TuneRequest", "Validated", "best_per_server", "brute_force",
    "check_server", "check_storage", "close_calls", "completed_trials", "expressible_on", "find_profile",
    "load_existing", "measure_candidates", "measure_predicted", "measured_speedup", "open_storage", "per_batch_size",
    "pick_among_tied", "run_search", "run_server_tune", "run_tune", "schedule_from_measured", "server_search_space",
    "unsupported", "DEFAULT_TREES", "check_shapes", "shape_candidate", "tree_space_args",
    "HEARTBEAT_S", "STALE_S", "StudyLease", "TuneInterrupted", "study_subject",
]  # fmt: skip
