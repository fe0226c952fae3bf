"""The results database: SQLAlchemy 2 models, Alembic migrations and query helpers.

Open with :func:`open_database` (URL from the argument, ``$SPECDEC_DB`` or ``sqlite:///specdec.db``;
the schema is created or migrated on first use), then call the helpers, which commit per call and
return plain frozen dataclasses::

    db = open_database("sqlite:///results.db")
    run_id = create_run(db, target_model_id=..., hardware_id=...)
    add_timing_samples(db, run_id, [TimingRow("verify", k=5, batch_size=1, context_len=128,
                                              seconds=0.012)])
    finish_run(db, run_id, "completed")

Public names only; the modules behind them are private (``_connection``: URLs, SQLite pragmas and
:class:`Database`; ``_session``: ``session_scope``; ``_models`` and ``_base``: the SQLAlchemy tables and
their declarative base; ``_migrate`` and
``migrations/``: Alembic; ``_records``: the frozen dataclasses the helpers return; ``_catalog``: hardware,
models and workloads; ``_writes`` and ``_reads``: a profile run's rows; ``_fronts``, ``_trees``, ``_regress``
and ``_leases``: the bias front, token-tree traces, regression tables and study leases; ``_provenance``:
the code version a run records).
"""

from __future__ import annotations

from specdec_tune.db._connection import DEFAULT_URL, ENV_VAR, Database, default_storage_url, mask_url, open_database
from specdec_tune.db._connection import pseudo_filesystem, resolve_url, sqlite_file, sqlite_file_problem
from specdec_tune.db._fronts import add_bias_front, add_teacher_forced, load_bias_front, load_teacher_forced
from specdec_tune.db._leases import LeaseRecord, get_lease, insert_lease, lease_key, release_lease, renew_lease
from specdec_tune.db._leases import take_over_lease
from specdec_tune.db._migrate import current_revision, head_revision, known_revisions, upgrade
from specdec_tune.db._provenance import git_revision, specdec_version
from specdec_tune.db._writes import add_acceptance, add_measured_run, add_run_draft, add_telemetry, add_timing_samples
from specdec_tune.db._writes import add_traces, create_run, delete_run, finish_run, get_or_create_hardware
from specdec_tune.db._writes import get_or_create_model, get_or_create_workload, record_identity_check, set_prediction
from specdec_tune.db._writes import update_run_settings
from specdec_tune.db._reads import get_run, list_measured, list_models, list_runs, load_acceptance, load_telemetry
from specdec_tune.db._reads import load_timings, load_traces
from specdec_tune.db._records import FINISHED_STATUSES, MODES, RUN_STATUSES, TIMING_KINDS, AcceptanceRecord, DraftRecord
from specdec_tune.db._records import HardwareRecord, MeasuredRecord, ModelRecord, RunRecord, TelemetryRow, TimingRow
from specdec_tune.db._records import BiasFrontRow, TeacherForcedRow, TraceRow, WorkloadRecord
from specdec_tune.db._run_settings import IdentityCheck, RunSettings
from specdec_tune.db._regress import CalibrationRecord, CellVerdict, RegressBenchmarkRecord, RegressCellRecord
from specdec_tune.db._regress import RegressRunRecord, add_calibration, add_regress_benchmark, add_regress_cells
from specdec_tune.db._regress import create_regress_run, finish_regress_run, get_regress_run, latest_calibration
from specdec_tune.db._regress import list_regress_runs, load_regress_benchmarks, load_regress_cells, metric_trend
from specdec_tune.db._session import session_scope
from specdec_tune.db._trees import TREE_KINDS, TreeTraceRecord, add_tree_traces, load_tree_traces

__all__ = [
    "DEFAULT_URL", "ENV_VAR", "default_storage_url", "sqlite_file", "FINISHED_STATUSES", "MODES", "RUN_STATUSES", "TIMING_KINDS",
    "AcceptanceRecord", "Database", "DraftRecord", "HardwareRecord", "MeasuredRecord",
    "ModelRecord", "RunRecord", "RunSettings", "IdentityCheck", "record_identity_check", "TelemetryRow", "TimingRow",
    "TraceRow", "WorkloadRecord",
    "add_acceptance", "add_measured_run", "set_prediction", "add_run_draft", "add_telemetry", "add_timing_samples",
    "add_traces", "create_run", "current_revision", "delete_run", "finish_run",
    "get_or_create_hardware", "get_or_create_model", "get_or_create_workload", "get_run",
    "head_revision", "known_revisions", "list_measured", "list_models", "list_runs",
    "load_acceptance", "load_telemetry", "load_timings", "load_traces", "mask_url",
    "open_database", "resolve_url", "session_scope", "update_run_settings", "upgrade",
    "CalibrationRecord", "CellVerdict", "RegressBenchmarkRecord", "RegressCellRecord", "RegressRunRecord", "add_calibration",
    "add_regress_benchmark", "add_regress_cells", "create_regress_run", "finish_regress_run", "get_regress_run",
    "latest_calibration", "list_regress_runs", "load_regress_benchmarks", "load_regress_cells", "metric_trend",
    "BiasFrontRow", "TeacherForcedRow", "add_bias_front", "add_teacher_forced", "load_bias_front", "load_teacher_forced",
    "TREE_KINDS", "TreeTraceRecord", "add_tree_traces", "load_tree_traces",
    "pseudo_filesystem", "sqlite_file_problem", "git_revision", "specdec_version",
    "LeaseRecord", "get_lease", "insert_lease", "lease_key", "release_lease", "renew_lease", "take_over_lease",
]  # fmt: skip
