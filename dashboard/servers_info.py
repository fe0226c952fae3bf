"""What each inference server can express, read from ``tuner.servers`` (the tuner's capability table),
and the best predicted configuration inside each server's space.

The dashboard keeps no copy of that table and no rules of its own: :func:`tuner.servers.expressible`
decides whether a server can run a configuration. Without ``tuner.servers`` the page says the table is
not installed and the server picker lists the names ``tune --server`` accepts.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec_tune.dashboard.measured import short_name
from specdec_tune.dashboard.why import WhyInfo

# The names `specdec-tune tune --server` accepts (issue 10); used only to label the picker.
KNOWN_SERVERS = ("vllm", "sglang", "trtllm", "llamacpp", "hf")


def _servers_module():  # type: ignore[no-untyped-def]
    try:
        from specdec_tune.tuner import servers
    except ImportError:
        return None
    return servers


def server_names() -> tuple[str, ...]:
    """The servers the tuner knows (``any`` excluded)."""
    mod = _servers_module()
    table = getattr(mod, "SERVERS", None) if mod is not None else None
    return tuple(table) if table else KNOWN_SERVERS


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


def server_rows(why: WhyInfo) -> tuple[ServerRow, ...] | None:
    """Per server, the best of the predicted (draft, N, θ) grid it can express (``None``: no table).

    The grid is the one the Why it wins page maps (constant schedule, θ rule ``before``, the run's
    batch size); the tuner's own search (Tuning study page) also covers schedules and n-gram sizes.
    """
    mod = _servers_module()
    if mod is None:
        return None
    from specdec_tune.tuner.configs import Candidate

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
    for name, space in mod.SERVERS.items():
        inside = next(((tps, c) for tps, c in cells if mod.expressible(space, c) is None), None)
        tps, cand = inside if inside else (base, None)
        label = "plain decoding" if cand is None else Candidate(short_name(cand.drafter), cand.num_speculative_tokens,
                                                                 cand.threshold).label()
        rows.append(ServerRow(
            server=name, title=space.title, version=space.version, capabilities=space.capabilities(), best=label,
            tokens_per_s=tps, speedup=tps / base, cannot=(mod.expressible(space, overall) or "") if overall else "",
            notes=tuple(space.notes),
        ))
    return tuple(rows)
