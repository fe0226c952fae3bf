"""Nightly regression benchmarks that do not cry wolf.

``run_regress`` measures every benchmark of a suite per prompt (through ``profiler.suite_runs``),
stores the samples with the environment fingerprint, picks a baseline, compares cell by cell
(:mod:`._compare`), applies the rule (a drop > ``min_drop`` whose Benjamini-Hochberg
adjusted p-value is at most ``q``, persisting ``persist`` runs), explains flagged speed changes with the
throughput model and stores the verdicts. ``run_calibration`` runs the suite against itself (A/A)
and stores each metric's spread, the noise floor behind the minimum detectable change.

Exit codes (``RegressReport.exit_code``): 0 nothing regressed, 1 a regression (or a correctness
failure), 2 an error (raised as ``SpecdecError``), 3 no verdict possible (no comparable baseline: this
run becomes the baseline; too few samples).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from specdec_tune.db import CellVerdict, Database, RegressCellRecord
from specdec_tune import db as q
from specdec_tune.core.errors import InputError, NotFoundError
from specdec_tune.profiler import ArmSpec, environment_fingerprint, measure_arms, model_identity
from specdec_tune.tuner.regress._compare import FLAGGED, Cell, compare_benchmark, decide, explain_benchmark
from specdec_tune.tuner.regress._suite import Benchmark, Suite

EXIT_OK, EXIT_REGRESSION, EXIT_ERROR, EXIT_NO_VERDICT = 0, 1, 2, 3
GOOD_BASELINES = ("baseline", "pass")


@dataclass
class RegressReport:
    """Everything a regression run decided (rendered by :mod:`._report`)."""

    suite: str
    kind: str
    run_id: int | None
    baseline_id: int | None
    verdict: str
    exit_code: int
    fingerprint: dict[str, Any]
    changes: list[str] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)
    explanations: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    calibration: list[dict[str, Any]] = field(default_factory=list)
    drift: list[dict[str, Any]] = field(default_factory=list)  # regress --retune (informational)


def resolve_config(b: Benchmark) -> dict[str, Any]:
    """The benchmark's concrete configuration; a ``study`` is read from Optuna's stored winner.

    Raises:
        NotFoundError: the study does not exist or has no stored result.
    """
    out = b.model_dump()
    if b.study is not None:
        import optuna

        from specdec_tune.tuner.model import TuningResult

        try:
            study = optuna.load_study(study_name=b.study, storage=b.study_storage)
        except Exception as exc:  # Optuna raises KeyError or its own errors for a missing study
            raise NotFoundError(f"benchmark {b.name!r}: cannot load study {b.study!r} from {b.study_storage}: {exc}") from None
        if "result" not in study.user_attrs:
            raise NotFoundError(f"benchmark {b.name!r}: study {b.study!r} has no stored winner (user attr 'result')")
        cand = TuningResult.from_dict(study.user_attrs["result"]).candidate
        out.update(draft=cand.drafter, num_speculative_tokens=cand.num_speculative_tokens, threshold=cand.threshold,
                   schedule=cand.schedule, winner_of=b.study)
    if b.export is not None:
        out.update(_exported(b))
    if out["draft"] == "none":
        out["num_speculative_tokens"] = 0
    return out


def _exported(b: Benchmark) -> dict[str, Any]:
    """The drafter, N and per-batch-size schedule an exported folder's vLLM file carries (vLLM's
    ``num_speculative_tokens_per_batch_size``: ``[lo, hi, N]`` ranges; docs/servers.md).

    Raises:
        NotFoundError: no ``vllm/speculative_config.json`` in the folder (a plain-decoding export has none).
    """
    import json
    from pathlib import Path

    path = Path(b.export).expanduser() / "vllm" / "speculative_config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise NotFoundError(f"benchmark {b.name!r}: cannot read {path} ({exc}); a plain-decoding export has "
                            "no speculative config to check") from None
    draft = "ngram" if cfg.get("method") == "ngram" else str(cfg.get("model"))
    ranges = cfg.get("num_speculative_tokens_per_batch_size") or []
    schedule = {int(lo): int(n) for lo, _hi, n in ranges} or {1: int(cfg["num_speculative_tokens"])}
    return {"draft": draft, "num_speculative_tokens": int(cfg["num_speculative_tokens"]),
            "per_batch_size": b.per_batch_size or schedule, "exported_from": str(path)}


def arm_spec(cfg: Mapping[str, Any], key: str) -> ArmSpec:
    """What the profiler measures for one benchmark configuration (``key`` names it in the samples)."""
    from specdec_tune.core.speculative import SpeculativeConfig

    backend = cfg.get("backend", "engine")
    spec = SpeculativeConfig.from_dict(cfg)  # the benchmark's draft, N, θ and schedule
    server_config = None
    if backend == "vllm" and not spec.is_plain:
        from specdec_tune.tuner.model import Candidate
        from specdec_tune.tuner.servers import vllm_config

        server_config = vllm_config(cfg["target"], Candidate(spec.drafter, spec.num_speculative_tokens)
                                    ).speculative_config
    return ArmSpec(key=key, target=cfg["target"], spec=spec, workload=cfg["workload"], prompts=cfg["prompts"],
                   prompt_offset=cfg["prompt_offset"], max_new_tokens=cfg["max_new_tokens"],
                   temperature=cfg["temperature"], repeats=cfg["repeats"],
                   device=cfg["device"], dtype=cfg["dtype"], forward=cfg["forward"], draft_delay_ms=cfg["draft_delay_ms"],
                   backend=backend, server_config=server_config,
                   per_batch_size={int(k): int(v) for k, v in (cfg.get("per_batch_size") or {}).items()} or None,
                   load=list(cfg["load"]) if cfg.get("load") else None, load_cycles=int(cfg.get("load_cycles") or 8))


def suite_backend(suite: Suite, vllm_python: str | None = None) -> tuple[Callable[..., dict], str | None]:
    """(how the suite's benchmarks are measured, the server's name and version or None for our engine).

    Raises:
        InputError: a vllm suite without a vLLM environment.
    """
    if suite.benchmark[0].backend != "vllm":
        return measure_arms, None
    from functools import partial

    from specdec_tune.profiler import measure_arms_vllm, server_version

    python = vllm_python or suite.vllm_python
    return partial(measure_arms_vllm, vllm_python=python, threads=suite.threads or 1), server_version(python)


def fingerprint_changes(old: Mapping[str, Any], new: Mapping[str, Any], keys=None) -> list[str]:
    """``key: old → new`` for each differing key (all keys, or only ``keys``)."""
    keys = keys if keys is not None else sorted(set(old) | set(new) - {"hostname"})
    return [f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def _pick_baseline(db: Database, suite: Suite, how: str, fp: Mapping[str, Any], before: int) -> tuple[q.RegressRunRecord | None, str | None]:
    """(baseline run, reason speed is not comparable or None)."""
    runs = q.list_regress_runs(db, suite.name, before=before)
    must = suite.fingerprint.must_match
    if how == "latest":
        base = runs[0] if runs else None
    elif how == "auto":
        good = [r for r in runs if r.verdict in GOOD_BASELINES]
        comparable = [r for r in good if not fingerprint_changes(r.fingerprint, fp, must)]
        base = comparable[0] if comparable else (good[0] if good else (runs[0] if runs else None))
    else:
        try:
            base = q.get_regress_run(db, int(how))
        except ValueError:
            raise InputError(f"--baseline must be auto, latest or a run id, got {how!r}") from None
        if base.kind != "run":
            raise InputError(f"--baseline {how}: run {base.id} is a {base.kind} run, not a suite run")
    if base is None:
        return None, None
    diff = fingerprint_changes(base.fingerprint, fp, must)
    return base, ("environment changed: " + "; ".join(diff)) if diff else None


def _timed_regions(current: Mapping[str, list[dict]]) -> str | None:
    """The suite's timed decodes' check (``profiler.clean``), one line; None for samples without it (vLLM)."""
    from specdec_tune.profiler import describe_timed_regions

    samples = [s for rows in current.values() for s in rows if "regions" in s]
    if not samples:
        return None
    counts = {k: sum(int(s.get(k) or 0) for s in samples) for k in ("regions", "reruns", "unclean")}
    return describe_timed_regions(counts | {"watched": any(s.get("graphs_watched") for s in samples)})


def _flag_history(db: Database, suite: str, before: int, persist: int) -> dict[tuple[str, str], int]:
    """(benchmark, metric) -> how many consecutive previous runs flagged it (up to persist - 1)."""
    counts: dict[tuple[str, str], int] = {}
    alive: set[tuple[str, str]] | None = None
    for run in q.list_regress_runs(db, suite, before=before)[: max(persist - 1, 0)]:
        flagged = {(c.benchmark, c.metric) for c in q.load_regress_cells(db, run.id) if c.verdict in FLAGGED}
        alive = flagged if alive is None else alive & flagged
        for key in alive:
            counts[key] = counts.get(key, 0) + 1
    return counts


def _calibrated_mdc(db: Database, suite: str) -> dict[tuple[str, str], float]:
    return {(c.benchmark, c.metric): c.mdc for c in q.latest_calibration(db, suite)
            if c.mdc is not None and math.isfinite(c.mdc)}


def _model_error(db: Database, cfg: Mapping[str, Any], samples: list[dict]) -> Callable[[], tuple[float, float] | str] | None:
    if cfg.get("profile_run") is None:
        return None
    if cfg.get("backend") == "vllm":
        return lambda: ("the engine model predicts our engine, not vLLM (calibrate the server model with "
                        "`tune --backend vllm`)")

    def get() -> tuple[float, float] | str:
        import statistics

        from specdec_tune.core.errors import SpecdecError
        from specdec_tune.core.speculative import SpeculativeConfig
        from specdec_tune.tuner.model import SpecConfig, load_run_profile, predict_config

        try:
            rp = load_run_profile(db, int(cfg["profile_run"]), None if cfg["draft"] == "none" else cfg["draft"])
            sc = SpecConfig(spec=SpeculativeConfig.from_dict(cfg), mode="greedy" if cfg["temperature"] == 0 else "sampling")
            predicted = predict_config(rp, sc).tokens_per_s
        except SpecdecError as exc:
            return f"no prediction from profile run {cfg['profile_run']}: {exc}"
        tokens = sum(s["new_tokens"] for s in samples)
        seconds = sum(statistics.median(s["seconds"]) for s in samples if s["seconds"])
        return predicted, tokens / seconds

    return get


def run_regress(suite: Suite, db: Database, *, baseline: str = "auto", progress=None,
                measure: Callable[..., dict] | None = None, vllm_python: str | None = None) -> RegressReport:
    """Measure the suite, compare with a baseline, store everything, return the report.

    Args:
        measure: how arms are measured (default: by the suite's backend, :func:`suite_backend`).

    Raises:
        SpecdecError: bad suite content, a model that does not load, a database error.
    """
    configs = {b.name: resolve_config(b) for b in suite.benchmark}
    default_measure, server = suite_backend(suite, vllm_python)
    measure = measure or default_measure
    fp = environment_fingerprint(suite.benchmark[0].device, suite.benchmark[0].backend, server)
    samples = measure([arm_spec(c, name) for name, c in configs.items()], progress=progress)
    run_id = q.create_regress_run(db, suite.name, fingerprint=fp)
    try:
        for name, cfg in configs.items():
            cfg = dict(cfg, target_identity=model_identity(cfg["target"]), draft_identity=model_identity(cfg["draft"]))
            configs[name] = cfg
            q.add_regress_benchmark(db, run_id, name, cfg, [s.to_json() for s in samples[name]])
        report = _compare_run(db, suite, run_id, configs, baseline, fp)
    except BaseException:
        q.finish_regress_run(db, run_id, status="failed", verdict=None, exit_code=EXIT_ERROR)
        raise
    return report


def _compare_run(db: Database, suite: Suite, run_id: int, configs: dict[str, dict], how: str,
                 fp: dict[str, Any]) -> RegressReport:
    base_run, no_speed = _pick_baseline(db, suite, how, fp, before=run_id)
    current = {b.name: b.samples for b in q.load_regress_benchmarks(db, run_id)}
    report = RegressReport(suite.name, "run", run_id, base_run.id if base_run else None, "pass", EXIT_OK, fp)
    baseline = {b.name: b for b in q.load_regress_benchmarks(db, base_run.id)} if base_run else {}
    if base_run is None:
        report.notes.append(f"no baseline: suite {suite.name!r} has no earlier completed run in this database; "
                            f"this run (id {run_id}) becomes the baseline")
    else:
        report.changes = fingerprint_changes(base_run.fingerprint, fp)
        if no_speed:
            report.notes.append(f"no speed verdict against run {base_run.id}: {no_speed}; correctness is still "
                                "checked and this run becomes the baseline for the new environment")
    regions = _timed_regions(current)
    if regions:
        report.notes.append(regions)
    calib = _calibrated_mdc(db, suite.name)
    cells: list[Cell] = []
    for name, cfg in configs.items():
        old = baseline.get(name)
        if old is not None:
            for key in ("target_identity", "draft_identity", "num_speculative_tokens", "threshold", "schedule",
                        "temperature", "workload", "prompts", "max_new_tokens", "draft_delay_ms", "per_batch_size",
                        "load"):
                if old.config.get(key) != cfg.get(key):
                    report.changes.append(f"{name}.{key}: {old.config.get(key)!r} → {cfg.get(key)!r}")
        cells += compare_benchmark(name, old.samples if old else None, current[name], cfg, suite.rules,
                                   no_speed=no_speed if base_run else "no baseline", calib=calib,
                                   model_error=_model_error(db, cfg, current[name]),
                                   missing="the baseline has no such benchmark" if base_run else "no baseline run")
    cells = decide(cells, suite.rules, _flag_history(db, suite.name, run_id, suite.rules.persist))
    for name, cfg in configs.items():
        if name in baseline:
            own = [c for c in cells if c.benchmark == name]
            text = explain_benchmark(own, baseline[name].samples, current[name], int(cfg["num_speculative_tokens"]))
            if text:
                report.explanations[name] = text
    cells = [c if c.benchmark not in report.explanations or c.verdict not in FLAGGED
             else _with_explanation(c, report.explanations[c.benchmark]) for c in cells]
    report.cells = cells
    report.verdict, report.exit_code = _overall(cells, base_run is None or no_speed is not None)
    q.add_regress_cells(db, [stored_cell(c, run_id) for c in cells])
    q.finish_regress_run(db, run_id, status="completed", verdict=report.verdict, exit_code=report.exit_code,
                         baseline_id=report.baseline_id, summary=_summary(report))
    return report


def _with_explanation(c: Cell, text: str) -> Cell:
    from dataclasses import replace

    return replace(c, explanation=text)


def stored_cell(c: Cell, run_id: int) -> RegressCellRecord:
    """The cell as run ``run_id`` stores it: numbers as floats, a non-finite one as NULL."""
    def num(x: Any) -> Any:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return x
        return float(x) if math.isfinite(x) else None

    values = {f.name: num(getattr(c, f.name)) for f in fields(CellVerdict)}
    return RegressCellRecord(**{**values, "details": dict(c.details)}, run_id=run_id)


def _overall(cells: list[Cell], becomes_baseline: bool) -> tuple[str, int]:
    verdicts = [c.verdict for c in cells]
    if "regression" in verdicts or "fail" in verdicts:
        return "regression", EXIT_REGRESSION
    if becomes_baseline:
        return "baseline", EXIT_NO_VERDICT
    if "suspicious" in verdicts:
        return "suspicious", EXIT_OK
    speed = [c for c in cells if c.metric in ("tokens_per_s", "latency")]
    if speed and all(c.verdict == "no_verdict" for c in speed):
        return "no_verdict", EXIT_NO_VERDICT
    return "pass", EXIT_OK


def _summary(report: RegressReport) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for c in report.cells:
        counts[c.verdict] = counts.get(c.verdict, 0) + 1
    return {"verdicts": counts, "changes": report.changes, "notes": report.notes, "explanations": report.explanations}
