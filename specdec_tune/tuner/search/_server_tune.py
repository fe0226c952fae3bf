"""``tune --backend vllm``: tune for the server, measured on the server.

After the engine profile (acceptance: E[τ], E[L] per configuration from its traces):

1. **Calibrate**: vLLM runs plain decoding and each drafter at a few N (:data:`CALIBRATION_NS`) on the
   tuning prompts at every batch size asked; the model's time terms are fitted to the server
   (``tuner.servers.ServerModel``).
2. **Rank** every configuration of vLLM's space (drafter × N, constant, θ = 0) by the *server*
   prediction at the smallest batch size; brute force, since the space is small.
3. **Confirm**: the top ``measure_top`` not measured yet run on vLLM on the tuning prompts; the winner
   is the best *measured* (calibration runs count too). Configurations it is not measurably faster
   than (paired CI of the ratio reaching 1) are reported as close calls (:func:`close_calls`), and
   among such a tie the calibrated model decides where it interpolates (:func:`pick_among_tied`).
4. **Schedule**: the calibrated server model proposes the best N per batch size (0 = do not
   speculate); at every batch size above the smallest, the proposals and the winner's N run on vLLM
   (tuning prompts) beside the calibration runs, and the best *measured* N there becomes that batch
   size's entry of ``num_speculative_tokens_per_batch_size`` (:func:`schedule_from_measured`).
5. **Held out**: on the held-out prompts, at every batch size, vLLM runs plain decoding, the winner
   at its constant N and the schedule *as a whole* (one server with the schedule: a server's
   behaviour under a schedule is not the sum of its constant-N runs). Reported per batch size.

vLLM fixes its speculative config when the engine starts, so each configuration is one engine start
(its cost is reported) and configurations cannot be interleaved the way the engine's are: each
start runs its repeats with the batch sizes interleaved, and the CI of a speedup pairs the same
prompts but not the same minutes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec_tune.db import Database
from specdec_tune.core.errors import InputError
from specdec_tune.core.stats import RateSamples, speedup_ci
from specdec_tune.tuner.model import NGRAM, Candidate, Evaluator, Objective
from specdec_tune.tuner.search._server_objective import guard_schedule, predicted_server_value, server_slo, server_value
from specdec_tune.tuner.search._server_objective import sort_key
from specdec_tune.tuner.servers import (
    ServerModel,
    best_server_n_per_batch_size,
    calibrate_from,
    mean_prompt_tokens,
    predict_server,
    vllm_config,
)

CALIBRATION_NS = (2, 5)  # per model draft; n-gram at NGRAM_CALIBRATION_N
NGRAM_CALIBRATION_N = 3

__all__ = ["CALIBRATION_NS", "ServerTuneReport", "close_calls", "pick_among_tied", "run_server_tune",
           "schedule_from_measured"]


@dataclass
class ServerTuneReport:
    """What ``tune --backend vllm`` measured and predicted (every rate labelled)."""

    model: ServerModel
    winner: Candidate
    schedule: dict[int, int]
    schedule_measured: dict[int, dict[int, float]] = field(default_factory=dict)  # B -> N -> measured tokens/s
    close_calls: list[dict[str, Any]] = field(default_factory=list)  # not measurably slower than the best measured
    best_measured: str = ""  # the best measured configuration's label (the winner unless it was a close call)
    calibration: list[dict[str, Any]] = field(default_factory=list)
    ranked: list[dict[str, Any]] = field(default_factory=list)
    confirmation: list[dict[str, Any]] = field(default_factory=list)
    heldout: list[dict[str, Any]] = field(default_factory=list)  # per batch size
    start_seconds: list[float] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)  # why each batch size's N is what it is (held out)
    objective: dict[str, Any] = field(default_factory=dict)  # the objective, measured held out at the first B

    def to_dict(self) -> dict[str, Any]:
        return {"backend": "vllm", "versions": self.versions, "server_model": self.model.to_dict(),
                "winner": self.winner.to_dict(), "schedule": {str(b): n for b, n in self.schedule.items()},
                "schedule_measured": {str(b): {str(n): v for n, v in by_n.items()}
                                      for b, by_n in self.schedule_measured.items()},
                "close_calls": self.close_calls, "best_measured": self.best_measured,
                "calibration": self.calibration, "ranked": self.ranked, "confirmation": self.confirmation,
                "heldout": self.heldout, "start_seconds": self.start_seconds,
                "reasons": {str(b): r for b, r in self.reasons.items()}, "objective": self.objective}


def _row(m, predicted: float | None = None, objective: Objective | None = None) -> dict[str, Any]:
    out = {"config": m.config.label, "batch_size": m.batch_size, "measured_tokens_per_s": m.tokens_per_s,
           "ci95": list(m.ci95) if m.ci95 else None, "predicted_tokens_per_s": predicted,
           "mean_acceptance_length": m.mean_acceptance_length, "measured_id": m.measured_id}
    if objective is not None and (objective.name != "throughput" or objective.slo.active):
        value, ci = server_value(m, objective)
        out.update(objective=objective.name, objective_value=value, objective_ci=None if ci is None else list(ci),
                   slo=server_slo(m, objective))
    return out


def schedule_from_measured(proposed: dict[int, int], measured: dict[int, dict[int, float]], b0: int) -> dict[int, int]:
    """The per-batch-size N: at every batch size but ``b0`` (where the measured winner holds) the N
    (0 = plain decoding) with the best measured tokens/s; the model's proposal where nothing was
    measured."""
    out = dict(proposed)
    for b, by_n in measured.items():
        if b != b0 and by_n:
            out[b] = max(by_n, key=lambda n: (by_n[n], -n))
    return out


def close_calls(winner: RateSamples, others: dict[str, RateSamples]) -> list[dict[str, Any]]:
    """The measured configurations ``winner`` (the best measured) is not measurably faster than: the
    paired 95% CI of winner ÷ other (same prompts) reaches 1. More tuning prompts would be needed to
    tell them apart."""
    out = []
    for label, s in others.items():
        if s.prompt_ids != winner.prompt_ids:
            continue  # not paired: measured on other prompts
        ci = speedup_ci(winner, s)  # None (one prompt): measurement cannot tell them apart either
        if ci is None or ci[0] <= 1.0:
            out.append({"config": label, "ratio": winner.tokens_per_s / s.tokens_per_s,
                        "ci95": None if ci is None else list(ci)})
    return sorted(out, key=lambda r: r["ratio"])


def pick_among_tied(tied: Sequence[Candidate], predicted: dict[Candidate, float], calibration_ns: Sequence[int]) -> Candidate:
    """The winner: ``tied[0]`` (the best measured) unless measurement could not tell it from the others
    in ``tied`` (:func:`close_calls`); then the one the calibrated model predicts fastest among those
    where the model interpolates: plain decoding, a draft model at N within the calibration's N
    (``calibration_ns``), n-gram at its calibration N. The model's acceptance comes from every
    profiled prompt, more than the few each confirmation measures; beyond the calibrated N it
    extrapolates and was seen to over-predict (docs/results.md), so it decides nothing there."""
    def interpolated(c: Candidate) -> bool:
        if c.is_plain:
            return True
        if c.drafter == NGRAM:
            return c.num_speculative_tokens == NGRAM_CALIBRATION_N
        return min(calibration_ns) <= c.num_speculative_tokens <= max(calibration_ns)

    inside = [c for c in tied if interpolated(c) and c in predicted]
    return max(inside, key=lambda c: predicted[c]) if len(tied) > 1 and inside else tied[0]


def _space(drafts: Sequence[str], n_max: int) -> list[Candidate]:
    return [Candidate(d, n) for d in drafts for n in range(1, n_max + 1)]


@dataclass
class _Server:
    """Runs configurations on vLLM for one run: the tuner's own vLLM export of each, stored as it goes."""

    db: Database
    run_id: int
    target: str
    options: dict[str, Any]  # vllm_python, threads, progress, repeats

    def measure(self, candidates: Sequence[Candidate], batch_sizes: Sequence[int], split: str,
                max_prompts: int) -> list[Any]:
        return self.run([vllm_config(self.target, c) for c in candidates], batch_sizes, split, max_prompts)

    def run(self, configs: Sequence[Any], batch_sizes: Sequence[int], split: str, max_prompts: int) -> list[Any]:
        """One engine start per configuration, each running every batch size; [] for no configuration."""
        from specdec_tune.profiler import measure_on_server

        if not configs:
            return []
        return measure_on_server(self.db, self.run_id, list(configs), batch_sizes=tuple(batch_sizes), split=split,
                                 max_prompts=max_prompts, **self.options)


def _calibration_candidates(drafts: Sequence[str], n_max: int) -> tuple[list[Candidate], list[int]]:
    """Plain decoding, each model draft at :data:`CALIBRATION_NS` (within N_max) and n-gram at one N."""
    ns = sorted({min(n, n_max) for n in CALIBRATION_NS})
    if len(ns) < 2 and n_max >= 2:
        ns = [1, n_max]
    calib_c = [Candidate("none", 0)] + [Candidate(d, n) for d in drafts if d != NGRAM for n in ns]
    if NGRAM in drafts:
        calib_c.append(Candidate(NGRAM, min(NGRAM_CALIBRATION_N, n_max)))
    return calib_c, ns


def _measured_schedule(srv: _Server, winner: Candidate, schedule: dict[int, int], bs: list[int],
                       calib: Sequence[tuple[Candidate, Any]], max_prompts: int,
                       objective: Objective) -> tuple[dict, dict, list]:
    """At each batch size above the smallest, the best *measured* N among the model's proposals, the
    winner's N and plain decoding (tuning prompts). Returns (schedule, B -> N -> tokens/s, new runs)."""
    b0 = bs[0]
    at_b: dict[int, dict[int, Any]] = {b: {} for b in bs}
    for c, m in calib:
        if c.is_plain or c.drafter == winner.drafter:
            at_b[m.batch_size][c.num_speculative_tokens] = m
    extra = sorted({n for b, n in schedule.items() if b != b0 and n} | {winner.num_speculative_tokens}
                   - {n for b in bs[1:] for n in at_b.get(b, {})})
    more = srv.measure([Candidate(winner.drafter, n) for n in extra], bs[1:], "tune", max_prompts)
    for n, m in zip([n for n in extra for _ in bs[1:]], more):
        at_b.setdefault(m.batch_size, {})[n] = m
    measured = {b: {n: m.tokens_per_s for n, m in at_b.get(b, {}).items()} for b in bs[1:]}
    key = sort_key(objective)
    ranked = {b: {n: -key(m)[0] for n, m in at_b.get(b, {}).items()} for b in bs[1:]}  # higher is better
    return schedule_from_measured(schedule, ranked, b0), measured, more


def _heldout_rows(srv: _Server, model: ServerModel, evaluator: Evaluator, winner: Candidate, schedule: dict[int, int],
                  bs: list[int], max_prompts: int, max_new_tokens: int,
                  objective: Objective | None = None) -> tuple[list[dict[str, Any]], list[Any]]:
    """Plain decoding, the winner at its constant N and the schedule as a whole, on the held-out prompts."""
    configs = [vllm_config(srv.target, Candidate("none", 0))]
    labels: dict[str, str] = {}
    if not winner.is_plain:
        configs.append(vllm_config(srv.target, winner))
        labels["constant"] = configs[-1].label
        if len(set(schedule.values())) > 1:
            configs.append(vllm_config(srv.target, winner, schedule))
            labels["schedule"] = configs[-1].label
    held = srv.run(configs, bs, "holdout", max_prompts)
    rows = []
    for b in bs:
        at = {m.config.label: m for m in held if m.batch_size == b}
        plain = at["plain"]
        row: dict[str, Any] = {"batch_size": b, "schedule_n": schedule[b], "plain": _row(plain, None, objective)}
        for key, label in labels.items():
            m = at[label]
            predicted = (predict_server(model, evaluator, winner, b, max_new_tokens, mean_prompt_tokens(m)).tokens_per_s
                         if key == "constant" else None)
            ci = speedup_ci(m.samples, plain.samples)
            row[key] = {**_row(m, predicted, objective), "speedup": m.tokens_per_s / plain.tokens_per_s,
                        "speedup_ci": None if ci is None else list(ci)}
        rows.append(row)
    return rows, held


def _winner(measured: dict[Candidate, Any], by_pred: dict[Candidate, float], ns: Sequence[int],
            objective: Objective) -> tuple[Candidate, Candidate, list[dict[str, Any]]]:
    """(winner, best measured, close calls): the best measured by the objective; for throughput, among
    configurations measurement cannot tell apart, the calibrated model decides (:func:`pick_among_tied`)."""
    best = min(measured, key=lambda c: sort_key(objective)(measured[c]))
    if objective.name != "throughput" or objective.slo.active:
        return best, best, []
    close = close_calls(measured[best].samples, {m.config.label: m.samples for c, m in measured.items() if c != best})
    tied = [best] + [c for c in measured if measured[c].config.label in {r["config"] for r in close}]
    return pick_among_tied(tied, by_pred, ns), best, close


def _heldout_objective(rows: list[dict[str, Any]], objective: Objective) -> dict[str, Any]:
    """The objective's held-out measured value with CI and the SLO's outcome at the smallest batch size."""
    first = rows[0]
    win = first.get("constant") or first["plain"]

    def side(x: dict[str, Any]) -> dict[str, Any]:
        value = x.get("objective_value", x["measured_tokens_per_s"])
        ci = x.get("objective_ci", x.get("ci95"))
        return {"label": x["config"], "value": value, "ci": ci, "measured": "held-out prompts (vLLM)",
                "slo": x.get("slo")}

    return {**objective.to_dict(), "describe": objective.describe(), "winner": side(win), "plain": side(first["plain"])}


def run_server_tune(db: Database, run_id: int, evaluator: Evaluator, *, target: str, drafts: Sequence[str],
                    batch_sizes: Sequence[int], n_max: int, max_new_tokens: int, measure_top: int,
                    measure_prompts: int, heldout_prompts: int, repeats: int, vllm_python: str | None,
                    threads: int = 1, progress=None, objective: Objective | None = None,
                    gpu_price: float | None = None) -> ServerTuneReport:
    """The whole server loop (module docstring), by ``objective`` (default: throughput).

    Raises:
        InputError: a batch size that does not divide the prompts, or no drafter.
        VllmError: vLLM failed (its last log line in the message).
    """
    objective = objective or Objective()
    bs = sorted({int(b) for b in batch_sizes})
    if not drafts:
        raise InputError("--backend vllm needs at least one drafter")
    srv = _Server(db, run_id, target, dict(vllm_python=vllm_python, threads=threads, progress=progress,
                                            repeats=repeats, gpu_price=gpu_price))
    calib_c, ns = _calibration_candidates(drafts, n_max)
    cal = srv.measure(calib_c, bs, "tune", measure_prompts)
    model = calibrate_from(cal)
    b0 = bs[0]
    preds = [predict_server(model, evaluator, c, b0, max_new_tokens) for c in _space(drafts, n_max)]
    sign = -1.0 if objective.direction == "maximize" else 1.0
    preds.sort(key=lambda p: sign * predicted_server_value(objective, evaluator, p.candidate, p.tokens_per_s, b0))
    measured = dict(zip(calib_c, [m for m in cal if m.batch_size == b0]))  # configurations × batch sizes, in order
    todo = [p.candidate for p in preds if p.candidate not in measured][:measure_top]
    conf = srv.measure(todo, (b0,), "tune", measure_prompts)
    measured.update(zip(todo, conf))
    by_pred = {p.candidate: p.tokens_per_s for p in preds}
    by_pred[Candidate("none", 0)] = model.predict(b0, "plain", max_new_tokens)
    winner, best, close = _winner(measured, by_pred, ns, objective)
    schedule = ({b: 0 for b in bs} if winner.is_plain else
                best_server_n_per_batch_size(model, evaluator, winner.drafter, range(1, n_max + 1), bs, max_new_tokens))
    schedule_measured: dict[int, dict[int, float]] = {}
    if not winner.is_plain:
        schedule[b0] = winner.num_speculative_tokens  # the measured winner holds at the smallest batch size
        if len(bs) > 1:
            calib = list(zip([c for c in calib_c for _ in bs], cal))
            schedule, schedule_measured, more = _measured_schedule(srv, winner, schedule, bs, calib, measure_prompts,
                                                                   objective)
            conf += more
    rows, held = _heldout_rows(srv, model, evaluator, winner, schedule, bs, heldout_prompts, max_new_tokens, objective)
    guarded, reasons = guard_schedule(schedule, rows)
    all_m = cal + conf + held
    return ServerTuneReport(
        model=model, winner=winner, schedule=guarded, schedule_measured=schedule_measured, close_calls=close,
        best_measured=measured[best].config.label, calibration=[_row(m, None, objective) for m in cal],
        ranked=[p.to_dict() for p in preds[: max(measure_top, 10)]],
        confirmation=[{**_row(measured[c], by_pred.get(c), objective), "candidate": c.to_dict(), "winner": c == winner}
                      for c in measured],
        heldout=rows, start_seconds=[m.start_seconds for m in all_m if m.start_seconds is not None],
        versions=all_m[0].versions if all_m else {}, reasons=reasons, objective=_heldout_objective(rows, objective))
