"""What the dashboard shows from the tuner's server room, handed to it by the process that starts it.

The dashboard reads the results database and the throughput model (``tuner.model``) itself. The
capability table and the exporters belong to ``tuner.servers``, which the dashboard does not import
(``docs/architecture.md``, import contracts): the ``specdec-tune dashboard`` entry script
(``specdec_tune/cli/_dashboard_app.py``, the composition root) installs a :class:`ServerRoom` here
before the first page runs. A dashboard started without one says so on the two places that need it
(the servers table of *Why it wins* and the export downloads of *Tuning study*).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdec_tune.tuner.model import Candidate, TuningResult


@dataclass(frozen=True)
class ServerFacts:
    """One server's row of the capability table, as a user reads it.

    Attributes:
        name: the ``--server`` name.
        title: the server's name as users write it.
        version: the version the facts were checked against.
        capabilities: one line per capability (drafters, θ, schedules, per-batch-size N ...).
        notes: what a user of this server must know.
    """

    name: str
    title: str
    version: str
    capabilities: dict[str, str]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class ExportFiles:
    """One tuning result's export, for download.

    Attributes:
        files: format (``vllm`` ... and ``readme``) -> relative path -> content; llamacpp with its GGUF files.
        left_out: format not in the download -> why (one line; the README's "Formats not written" says it too).
    """

    files: dict[str, dict[str, bytes]]
    left_out: dict[str, str]


@dataclass(frozen=True)
class ServerRoom:
    """The server facts and exporters the dashboard shows.

    Attributes:
        servers: every server of the capability table, in its order.
        unsupported: ``(server name, candidate) -> None`` when the server can run the candidate, else why not.
        formats: the export formats, in order.
        export_files: a tuning result -> its export's files (and the formats left out, with why).
    """

    servers: tuple[ServerFacts, ...]
    unsupported: Callable[[str, Candidate], str | None]
    formats: tuple[str, ...]
    export_files: Callable[[TuningResult], ExportFiles]


_room: ServerRoom | None = None


def install(room: ServerRoom | None) -> None:
    """Hand the dashboard its server room (``None`` removes it)."""
    global _room
    _room = room


def server_room() -> ServerRoom | None:
    """The installed server room, or ``None`` when the dashboard was started without one."""
    return _room
