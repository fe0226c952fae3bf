"""Nightly regression benchmarks that do not cry wolf: suites, statistics, comparisons, explanations,
tuning drift and reports.

Public names only; the modules behind them are private (``_suite``, ``_significance``, ``_compare``,
``_explain``, ``_run``, ``_calibrate``, ``_drift``, ``_report``).
"""
from __future__ import annotations

from specdec_tune.tuner.regress._calibrate import noise_floor, noise_spread, run_calibration
from specdec_tune.tuner.regress._compare import FLAGGED, SPEED_METRICS, Cell, compare_benchmark, decide
from specdec_tune.tuner.regress._drift import Drift, retune, run_drift, top_params
from specdec_tune.tuner.regress._explain import SideTerms, explain
from specdec_tune.tuner.regress._report import EXIT_MEANING, to_json, to_junit, to_markdown
from specdec_tune.tuner.regress._run import EXIT_ERROR, EXIT_NO_VERDICT, EXIT_OK, EXIT_REGRESSION, RegressReport
from specdec_tune.tuner.regress._run import arm_spec, resolve_config, run_regress
from specdec_tune.tuner.regress._significance import align, bh_adjust, median_ratio, minimum_detectable_change, proportion_mdc
from specdec_tune.tuner.regress._significance import speed_test, two_proportion
from specdec_tune.tuner.regress._suite import Benchmark, Rules, Suite, default_suite_path, load_suite

__all__ = [
    "EXIT_ERROR", "EXIT_MEANING", "EXIT_NO_VERDICT", "EXIT_OK", "EXIT_REGRESSION", "FLAGGED", "SPEED_METRICS",
    "Benchmark", "Cell", "Drift", "RegressReport", "Rules", "SideTerms", "Suite", "align", "arm_spec", "bh_adjust",
    "compare_benchmark", "decide", "default_suite_path", "explain", "load_suite", "median_ratio",
    "minimum_detectable_change", "noise_floor", "noise_spread", "proportion_mdc", "resolve_config", "retune",
    "run_calibration", "run_drift", "run_regress", "speed_test", "to_json", "to_junit", "to_markdown", "top_params",
    "two_proportion",
]  # fmt: skip
