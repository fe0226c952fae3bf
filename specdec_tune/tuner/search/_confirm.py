"""Measured confirmation of ``tune``, for the overall winner and for every server's own best.

The model ranks, the clock decides, and nothing ships unmeasured (docs/commands.md, tune):

1. **Confirmation set**: the search's best predictions, each server's best predicted inside its own
   space (:func:`~._optuna.best_per_server`, every point of the space predicted: a server's best is
   found even where the main study never sampled it) and plain decoding; a configuration several
   servers share is one entry. Measured interleaved on the tuning prompts.
2. **Picks**: the overall winner is the best measured (speedup over plain decoding pass by pass);
   each server's pick is the best measured among the configurations it can express (plain decoding
   always can).
3. **Held out**: the winner, every pick and plain decoding are measured interleaved on the held-out
   prompts in one call, each distinct configuration once however many servers picked it.
4. **Decision** per server (:func:`specdec_tune.tuner.model.decide`): its pick ships when the held-out
   speedup's paired 95 % CI lower bound is at least 1, else its file carries plain decoding and the
   record says why, with the numbers (:class:`~specdec_tune.tuner.model.ServerDecision`).

Choosing on the tuning prompts and reporting on the held-out ones keeps the reported speedup free of
the selection's optimism (the best of several noisy measurements is biased up).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdec_tune.db import Database
from specdec_tune.tuner.model import NONE, Candidate, Scored, ServerDecision, decide
from specdec_tune.tuner.search._measure import Measured, measure_candidates, measured_speedup
from specdec_tune.tuner.search._space import unsupported
from specdec_tune.tuner.servers import SERVERS

PLAIN = Candidate(NONE, 0)


@dataclass
class Confirmation:
    """What the confirmation measured.

    Attributes:
        tuning: the confirmation set measured on the tuning prompts (plain decoding last).
        winner: the best measured of ``tuning`` (tuning prompts).
        picks: server -> the best measured of ``tuning`` that the server can express.
        heldout: configuration -> its held-out measurement (the winner, every pick, plain decoding).
    """

    tuning: list[Measured]
    winner: Measured
    picks: dict[str, Measured]
    heldout: dict[Candidate, Measured]

    @property
    def plain(self) -> Measured:
        """Plain decoding on the held-out prompts (the baseline of every held-out speedup)."""
        return self.heldout[PLAIN]


def distinct(candidates: Sequence[Candidate]) -> list[Candidate]:
    """``candidates`` without repeats, in order, plain decoding last (measured once, interleaved with all)."""
    seen: list[Candidate] = []
    for c in candidates:
        c = PLAIN if c.is_plain else c
        if c not in seen and c != PLAIN:
            seen.append(c)
    return seen + [PLAIN]


def best_measured(measured: Sequence[Measured], server: str | None = None) -> Measured:
    """The best measured speedup over plain decoding (among what ``server`` can express, when given)."""
    allowed = [m for m in measured if server is None or unsupported(server, m.candidate) is None]
    return max(allowed, key=lambda m: m.speedup if m.speedup is not None else m.tokens_per_s)


def confirm(db: Database, run_id: int, top: Sequence[Scored], bests: Mapping[str, Scored], *, measure_prompts: int,
            heldout_prompts: int, pick: Callable[[Sequence[Measured]], Measured] | None = None,
            **common: Any) -> Confirmation:
    """Stages 1-3 of the module docstring: measure, pick, hold out.

    Args:
        db: the results database (every measurement is stored with its prediction).
        run_id: the profile run.
        top: the search's best predictions (confirmed whatever server they suit).
        bests: server -> its best predicted inside its own space.
        measure_prompts: tuning prompts per configuration.
        heldout_prompts: held-out prompts per configuration.
        pick: the best of a list of measurements (default :func:`best_measured`: the measured speedup;
            ``tune --objective`` passes the objective's measured value).
        common: ``temperature``, ``repeats``, ``seed``, ``progress``, ``threads``, ``gpu_price`` for the
            measurements.
    """
    pool = distinct([t.candidate for t in top] + [b.candidate for b in bests.values()])
    tuning = measure_candidates(db, run_id, pool, split="tune", max_prompts=measure_prompts, **common)
    choose = pick or best_measured
    winner = choose(tuning)
    picks = {srv: choose([m for m in tuning if unsupported(srv, m.candidate) is None]) for srv in bests}
    held = distinct([winner.candidate] + [m.candidate for m in picks.values()])
    measured = measure_candidates(db, run_id, held, split="holdout", max_prompts=heldout_prompts, **common)
    return Confirmation(tuning, winner, picks, {m.candidate: m for m in measured})


def _selected(conf: Confirmation, server: str, best: Scored | None) -> str:
    c = conf.picks[server].candidate
    k = len(conf.tuning)
    if c == conf.winner.candidate:
        how = f"the overall winner: the best measured of the {k} configurations confirmed on the tuning prompts"
    else:
        runs = sum(unsupported(server, m.candidate) is None for m in conf.tuning)
        how = (f"the best measured on the tuning prompts of the {runs} confirmed configurations "
               f"{SERVERS[server].title} can run")
    if best is not None and best.candidate != c:
        how += f"; the best predicted inside its space, {best.candidate.label()}, measured slower"
    elif best is not None:
        how += "; also the best predicted inside its space (every point predicted)"
    return how


def server_decisions(conf: Confirmation, bests: Mapping[str, Scored],
                     schedule: Callable[[Candidate], dict[int, int]]) -> dict[str, ServerDecision]:
    """Stage 4: each server's :class:`ServerDecision` from its pick's held-out measurement.

    Args:
        conf: what :func:`confirm` measured.
        bests: server -> its best predicted inside its own space.
        schedule: configuration -> its N per batch size (B = 1: its own N), for the files.
    """
    base = conf.plain
    out = {}
    for server, pick in conf.picks.items():
        c = pick.candidate
        held = conf.heldout[c]
        speedup, ci = measured_speedup(held, base)
        verdict, why = decide(c, speedup, ci, heldout=held.heldout)
        prediction = held.validated.prediction
        out[server] = ServerDecision(
            server=server, candidate=c, decision=verdict, reason=why,
            selected=_selected(conf, server, bests.get(server)),
            predicted_tokens_per_s=held.predicted_tokens_per_s,
            predicted_speedup=None if prediction is None else float(prediction.speedup),
            measured_tokens_per_s=held.tokens_per_s, baseline_tokens_per_s=base.tokens_per_s, speedup=speedup,
            speedup_ci=ci, heldout=held.heldout, per_batch_size={} if c.is_plain else schedule(c),
            predicted_basis=held.predicted_basis)
    return out
