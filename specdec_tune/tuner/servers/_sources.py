"""Where ``export`` gets its :class:`TuningResult`: a finished study, or a stored profile run.

A study stores the result ``tune`` wrote (JSON in the study's user attributes, key ``result``). A
profile run has no tuning: the result is built from the run and the ``--config`` given (default: the
model's best configuration over N × θ for the run's first draft), with *predicted* numbers only.
"""
from __future__ import annotations

import math
from typing import Any

from specdec_tune.db import mask_url, sqlite_file
from specdec_tune.core.errors import InputError, StorageError
from specdec_tune.core.limits import MAX_SEARCHED_TOKENS, MAX_SPECULATIVE_TOKENS
from specdec_tune.tuner.model import NGRAM, NONE, Candidate, TuningResult

RESULT_KEY = "result"


def result_from_study(study_name: str, storage_url: str) -> TuningResult:
    """The result ``tune`` stored with study ``study_name``.

    Raises:
        StorageError: the storage cannot be opened.
        InputError: no such study, or the study holds no finished tuning.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    missing = sqlite_file(storage_url)
    if missing is not None and not missing.exists():  # opening it would create an empty file: say it is not there instead
        raise InputError(f"study storage {missing} does not exist (give --storage, or run `specdec-tune tune` first)")
    try:
        storage = optuna.storages.RDBStorage(storage_url, skip_table_creation=True)
        names = optuna.get_all_study_names(storage)
    except Exception as exc:  # bad URL, server down, not an Optuna database
        orig = getattr(exc, "orig", None) or exc
        first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        raise StorageError(f"cannot read study storage {mask_url(storage_url)}: {first}") from None
    if study_name not in names:
        raise InputError(f"no study {study_name!r} in {mask_url(storage_url)}; studies: {', '.join(names) or '(none)'}")
    study = optuna.load_study(study_name=study_name, storage=storage)
    raw = study.user_attrs.get(RESULT_KEY)
    if not raw:
        raise InputError(f"study {study_name!r} holds no tuning result yet (run `specdec-tune tune --study "
                         f"{study_name}` to the end, or export a profile run with --run)")
    try:
        return TuningResult.from_dict(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"study {study_name!r} holds a result this version cannot read: {exc}") from None


def parse_config(text: str, default_drafter: str) -> Candidate:
    """``N,θ[,drafter]`` -> a candidate (``0`` or drafter ``none``: plain decoding).

    Raises:
        InputError: not two or three fields, N not an int in 0..``MAX_SPECULATIVE_TOKENS``, θ not in [0, 1).
    """
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (2, 3) or not all(parts):
        raise InputError(f"--config {text!r} must be N,θ[,drafter] (e.g. 4,0.3,mini-draft-1l)")
    try:
        n = int(parts[0])
        theta = float(parts[1])
    except ValueError:
        raise InputError(f"--config {text!r}: N must be an integer and θ a number") from None
    if not 0 <= n <= MAX_SPECULATIVE_TOKENS:
        raise InputError(f"--config {text!r}: N must be in 0..{MAX_SPECULATIVE_TOKENS}")
    if not (math.isfinite(theta) and 0.0 <= theta < 1.0):
        raise InputError(f"--config {text!r}: θ must be in [0, 1)")
    drafter = parts[2] if len(parts) == 3 else default_drafter
    if n == 0 or drafter == NONE:
        return Candidate(NONE, 0)
    return Candidate(drafter, n, theta)


def result_from_run(db: Any, run_id: int, config: str | None = None) -> TuningResult:
    """A result from profile run ``run_id`` and ``config`` (``N,θ[,drafter]``), numbers predicted.

    Without ``config`` the model's best (N, θ) for the run's first draft is taken. ``per_batch_size`` is
    the model's best N at each batch size the run measured T_v(B, k) for (when more than one).

    Raises:
        NotFoundError: no such run, or the draft is not in it.
        InputError: a bad ``config``, or one the run cannot predict (N beyond its N_max).
    """
    from specdec_tune.db import get_run
    from specdec_tune.tuner.model import (
        SpecConfig,
        best_configs,
        best_n_per_batch_size,
        load_run_profile,
        predict_baseline,
        predict_config,
        replay_reach,
    )

    run = get_run(db, run_id)
    drafts = run.draft_names
    if config is None:
        if not drafts:
            raise InputError(f"run {run_id} profiled no draft; give --config N,θ,drafter")
        rp = load_run_profile(db, run_id, drafts[0])
        best = best_configs(rp, top=1)
        if not best:
            raise InputError(f"run {run_id} cannot predict any configuration for {drafts[0]!r}; give --config")
        sc = best[0][0]
        cand = Candidate(drafts[0], sc.spec.num_speculative_tokens, sc.spec.threshold)
    else:
        cand = parse_config(config, drafts[0] if drafts else NONE)
        if cand.drafter == NGRAM:
            cand = Candidate(NGRAM, cand.num_speculative_tokens)  # n-gram confidences are 1: θ does nothing
    if cand.is_plain:
        rp = load_run_profile(db, run_id, baseline_only=True)
        pred = base = predict_baseline(rp)
        per_b: dict[int, int] = {}
    else:
        rp = load_run_profile(db, run_id, cand.drafter)
        pred = predict_config(rp, SpecConfig(cand.num_speculative_tokens, cand.threshold))
        base = predict_baseline(rp)
        sizes = sorted(rp.model.verify_s)
        per_b = (best_n_per_batch_size(rp.model, sizes, range(1, min(rp.traced_n_max, MAX_SEARCHED_TOKENS) + 1),
                                       threshold=cand.threshold)
                 if len(sizes) > 1 else {})
    hw = run.hardware
    return TuningResult(
        candidate=cand, server="any", target=run.target.name,
        workload=run.workload.name if run.workload else "–",
        hardware=f"{hw.device_name} ({hw.device})" + (f" ×{hw.device_count}" if hw.device_count > 1 else ""),
        per_batch_size=per_b, measured_tokens_per_s=None, predicted_tokens_per_s=pred.tokens_per_s,
        baseline_tokens_per_s=base.tokens_per_s, speedup=pred.tokens_per_s / base.tokens_per_s,
        speedup_ci=None, heldout=False, run_id=run_id,
        predicted_basis=f"run {run_id}'s profiled prompts at the profile's machine speed",
    )


__all__ = ["RESULT_KEY", "parse_config", "result_from_run", "result_from_study", "StorageError"]
