"""What each inference server can express, and the best predicted configuration inside each server's space.

The dashboard keeps no copy of the capability table and no rules of its own: the table and its
``unsupported`` check come from the :class:`~specdec_tune.dashboard.wiring.ServerRoom` the entry script
installed (the tuner's ``tuner.servers``). Without one the servers table says it is not available.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec_tune.dashboard.measured import short_name
from specdec_tune.dashboard.why import WhyInfo
from specdec_tune.dashboard.wiring import ServerRoom, server_room
from specdec_tune.tuner.model import Candidate


def server_names() -> tuple[str, ...]:
    """The servers of the installed capability table (none when the dashboard runs without one)."""
    room = server_room()
    return tuple(f.name for f in room.servers) if room else ()


@dataclass(frozen=True)
class ServerRow:
    """One server's space as a user reads it, and the best predicted configuration inside it.

    Attributes:
        server: the ``--server`` name.
        title: the server's name as users write it.
        version: the version the capability facts were checked against.
        capabilities: one line per capability (drafters, θ, schedules, per-batch-size N ...).
        best: label of the best predicted configuration the server can run (``plain decoding`` if none).
        tokens_per_s: its predicted end-to-end tokens/s.
        speedup: its predicted speedup over plain decoding.
        cannot: why the overall best configuration is outside this server's space (empty if inside).
        notes: what a user of this server must know.
    """

    server: str
    title: str
    version: str
    capabilities: dict[str, str]
    best: str
    tokens_per_s: float
    speedup: float
    cannot: str
    notes: tuple[str, ...]


def server_rows(why: WhyInfo, room: ServerRoom | None = None) -> tuple[ServerRow, ...] | None:
    """Per server, the best of the predicted (draft, N, θ) grid it can express (``None``: no server room).

    The grid is the one the Why it wins page maps (constant schedule, θ rule ``before``, the run's
    batch size); the tuner's own search (Tuning study page) also covers schedules and n-gram sizes.

    Args:
        why: the page's predictions.
        room: the server facts (default: the installed :func:`~specdec_tune.dashboard.wiring.server_room`).
    """
    room = room or server_room()
    if room is None:
        return None
    cells = []
    for hm in why.heatmaps:
        for ti, theta in enumerate(hm.thresholds):
            for ni, n in enumerate(hm.ns):
                tps = hm.tokens_per_s[ti][ni]
                if tps is not None:
                    cells.append((tps, Candidate(hm.draft, n, theta)))
    cells.sort(key=lambda c: -c[0])
    overall = cells[0][1] if cells else None
    base = why.baseline.tokens_per_s
    rows = []
    for facts in room.servers:
        inside = next(((tps, c) for tps, c in cells if room.unsupported(facts.name, c) is None), None)
        tps, cand = inside if inside else (base, None)
        label = "plain decoding" if cand is None else Candidate(short_name(cand.drafter), cand.num_speculative_tokens,
                                                                 cand.threshold).label()
        rows.append(ServerRow(
            server=facts.name, title=facts.title, version=facts.version, capabilities=dict(facts.capabilities),
            best=label, tokens_per_s=tps, speedup=tps / base,
            cannot=(room.unsupported(facts.name, overall) or "") if overall else "", notes=tuple(facts.notes),
        ))
    return tuple(rows)
