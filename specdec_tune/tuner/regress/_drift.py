"""``regress --retune``: tuning drift. Has the best configuration moved since the study was tuned?

For a suite benchmark that runs a study's winner (``study = ...``) the study's question is asked
again on this machine now:

1. A *fresh* profile of the study's target, drafts and workload with the study's own profile
   settings (the old profile is not reused: the point is that the environment may have changed).
   The settings come from the request ``tune`` stores in the study (user attribute ``tune.request``);
   a study tuned before that was stored falls back to its profile run's settings in this database.
2. A new study ``<study>/retune-<regress run id>`` in the same storage, warm-started: the old study's
   best distinct trials (``WARM_START_TRIALS``) are enqueued, so the search re-evaluates the old
   optimum first, then ``trials`` trials of the same space (server restriction included) run as in
   ``tune`` (which confirms by measurement and stores the new winner in the new study).
3. The old winner, the new one (when it differs) and plain decoding measured interleaved on the
   tuning prompts (``tuner.search.measure_candidates``): ``loss`` = old ÷ new − 1 with the paired 95 % bootstrap CI
   of the ratio (``stats.speedup_ci``): what keeping the old configuration costs now.

Informational: a drift never fails a test case and never changes the exit code (a re-tune searches
with the throughput model and confirms on few prompts; it is evidence for a human, not a gate).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

from specdec_tune.db import Database
from specdec_tune.core.errors import NotFoundError, SpecdecError

WARM_START_TRIALS = 10  # the old study's best distinct trials, re-evaluated first by the new study


@dataclass
class Drift:
    """One benchmark's re-tune. Rates are tokens/s, ``measured_*`` on the tuning prompts now."""

    benchmark: str
    study: str
    new_study: str
    old: dict[str, Any]  # Candidate.to_dict() of the old winner
    new: dict[str, Any]  # ... of the new winner
    moved: bool
    old_measured_tokens_per_s: float
    new_measured_tokens_per_s: float
    plain_measured_tokens_per_s: float
    loss: float  # old / new - 1, measured (negative: the old winner is now slower)
    loss_ci: tuple[float, float] | None  # paired 95% CI of old / new - 1 (None when not moved)
    old_predicted_tokens_per_s: float | None  # both predicted from the fresh profile
    new_predicted_tokens_per_s: float | None
    enqueued: int  # old trials enqueued as the warm start
    run_id: int  # the fresh profile run

    def labels(self) -> tuple[str, str]:
        from specdec_tune.tuner.model import Candidate

        return Candidate.from_dict(self.old).label(), Candidate.from_dict(self.new).label()

    def loss_text(self) -> str:
        """``-7.2% (CI -11.0..-3.1%)``; ``0.0%`` when the winner did not move."""
        ci = f" (CI {100 * self.loss_ci[0]:+.1f}..{100 * self.loss_ci[1]:+.1f}%)" if self.loss_ci else ""
        return f"{100 * self.loss:+.1f}%{ci}"

    def text(self) -> str:
        old, new = self.labels()
        if not self.moved:
            return f"best configuration unchanged: {old} ({self.old_measured_tokens_per_s:.4g} tokens/s measured now)"
        return (f"best configuration moved: {old} → {new}; the old one loses {self.loss_text()} tokens/s now "
                f"(measured {self.old_measured_tokens_per_s:.4g} vs {self.new_measured_tokens_per_s:.4g})")

    def to_dict(self) -> dict[str, Any]:
        old, new = self.labels()
        return {**asdict(self), "old_label": old, "new_label": new, "loss_text": self.loss_text(), "text": self.text()}


# --------------------------------------------------------------------------- the old study


def _old_request(db: Database, name: str, tune_attrs: dict[str, Any]) -> dict[str, Any]:
    """The ``TuneRequest`` fields of the study's own tune (stored; else from its profile run here)."""
    if "request" in tune_attrs:
        return dict(tune_attrs["request"])
    from specdec_tune.db import get_run

    try:
        s = get_run(db, int(tune_attrs["run_id"])).settings
    except (KeyError, TypeError, ValueError, SpecdecError):
        s = None
    if s is None or s.target != tune_attrs.get("target") or s.workload != tune_attrs.get("workload"):
        raise NotFoundError(f"--retune: study {name!r} stores no tune request and its profile run is not in this "
                            "database (re-tune it with `tune`, or pass the --db it was tuned with)")
    return dict(target=s.target, drafts=tune_attrs["drafts"], workload=s.workload, server=tune_attrs["server"],
                temperature=s.temperature, objectives=tune_attrs.get("objectives", ["throughput"]),
                batch_sizes=list(s.batch_sizes), n_max=s.n_max, max_prompts=s.max_prompts,
                max_new_tokens=s.max_new_tokens, profile_repeats=s.repeats, seed=s.seed, device=s.device)


def top_params(study: Any, k: int = WARM_START_TRIALS) -> list[dict[str, Any]]:
    """The parameters of the study's ``k`` best completed trials, distinct, best first (first objective)."""
    from optuna.trial import TrialState

    done = sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values),
                  key=lambda t: -t.values[0])
    seen: set[tuple] = set()
    out: list[dict[str, Any]] = []
    for t in done:
        key = tuple(sorted(t.params.items()))
        if key not in seen and len(out) < k:
            seen.add(key)
            out.append(dict(t.params))
    return out


def _new_name(storage: Any, study: str, run_id: int | None) -> str:
    import optuna

    names = set(optuna.get_all_study_names(storage))
    name = f"{study}/retune-{run_id if run_id is not None else time.strftime('%Y%m%d-%H%M%S')}"
    return name if name not in names else f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


# --------------------------------------------------------------------------- one re-tune


def retune(db: Database, benchmark: str, study_name: str, storage_url: str, trials: int, *,
           run_id: int | None = None, progress: Any = None) -> Drift:
    """Re-tune one study on this machine now, warm-started from it (module docstring).

    Args:
        run_id: the regress run's id, in the new study's name (else a timestamp).

    Raises:
        NotFoundError: the study, its stored winner or its settings cannot be found.
        StorageError / InputError / ModelLoadError: as ``tune`` (one line each; the CLI exits 2).
    """
    import optuna

    from specdec_tune.core.stats import speedup_ci
    from specdec_tune.tuner.model import Candidate, TuningResult, direction
    from specdec_tune.tuner.search import TuneRequest, measure_candidates, open_storage, run_tune

    storage = open_storage(storage_url)
    try:
        old_study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError as exc:
        raise NotFoundError(f"--retune: cannot load study {study_name!r} from {storage_url}: {exc}") from None
    if "result" not in old_study.user_attrs or "tune" not in old_study.user_attrs:
        raise NotFoundError(f"--retune: study {study_name!r} has no stored winner or tune settings (user attrs "
                            "'result', 'tune')")
    old = TuningResult.from_dict(old_study.user_attrs["result"]).candidate
    known = {f.name for f in fields(TuneRequest)}
    asked = {k: (tuple(v) if isinstance(v, list) else v)
             for k, v in _old_request(db, study_name, old_study.user_attrs["tune"]).items() if k in known}
    name = _new_name(storage, study_name, run_id)
    req = TuneRequest(**{**asked, "study": name, "trials": trials, "reprofile": True})
    directions = [direction(o) for o in req.search_objectives]  # as search.run_search
    new_study = optuna.create_study(study_name=name, storage=storage, directions=directions)
    warm = top_params(old_study, min(WARM_START_TRIALS, trials))  # none left waiting
    for params in warm:
        new_study.enqueue_trial(params)
    report = run_tune(db, req, storage_url, progress)
    new = report.result.candidate
    moved = new != old
    plain = Candidate("none", 0)
    arms = list(dict.fromkeys([old, new, plain]))  # distinct, in this order
    measured = dict(zip(arms, measure_candidates(db, report.run_id, arms, split="tune", max_prompts=req.measure_prompts,
                                               temperature=req.temperature, repeats=req.repeats, seed=req.seed,
                                               progress=progress)))
    m_old, m_new, m_plain = measured[old], measured[new], measured[plain]
    loss, ci = 0.0, None
    if moved:
        loss = m_old.tokens_per_s / m_new.tokens_per_s - 1 if m_new.tokens_per_s > 0 else math.nan
        ratio = speedup_ci(m_old.validated.measurement, m_new.validated.measurement)  # None from one prompt
        ci = (ratio[0] - 1, ratio[1] - 1) if ratio and math.isfinite(ratio[0]) and math.isfinite(ratio[1]) else None
    return Drift(benchmark, study_name, name, old.to_dict(), new.to_dict(), moved, m_old.tokens_per_s,
                 m_new.tokens_per_s, m_plain.tokens_per_s, loss, ci, m_old.predicted_tokens_per_s,
                 m_new.predicted_tokens_per_s, len(warm), report.run_id)


def run_drift(suite: Any, db: Database, trials: int, *, run_id: int | None = None,
              progress: Any = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Re-tune every benchmark of ``suite`` that names a study: (drift rows, notes).

    A suite without a study is a one-line note, not an error; benchmarks naming the same study share
    one re-tune.
    """
    studies = [b for b in suite.benchmark if b.study is not None]
    if not studies:
        return [], ["--retune: no benchmark of the suite names a study (study = ...): nothing to re-tune"]
    done: dict[tuple[str, str], dict[str, Any]] = {}
    for b in studies:
        key = (b.study, b.study_storage)
        if key not in done:
            done[key] = retune(db, b.name, b.study, b.study_storage, trials, run_id=run_id, progress=progress).to_dict()
    return [{**done[(b.study, b.study_storage)], "benchmark": b.name} for b in studies], []
