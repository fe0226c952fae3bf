"""The Streamlit script ``specdec-tune dashboard`` runs: wire the tuner's server room into the dashboard,
then draw the dashboard.

This is the composition root of the dashboard process: the dashboard itself reads only ``db`` and
``tuner.model`` (``docs/architecture.md``, Import contracts), so the capability table and the exporters
of ``tuner.servers`` reach it from here, as plain data and two functions.
"""
from __future__ import annotations

from specdec_tune import dashboard
from specdec_tune.tuner import servers
from specdec_tune.tuner.model import Candidate, TuningResult


def _unsupported(server: str, candidate: Candidate) -> str | None:
    return servers.expressible(servers.server_space(server), candidate)


def _export_files(result: TuningResult) -> dashboard.ExportFiles:
    files, left_out = servers.download_files(result, ["all"])
    return dashboard.ExportFiles(files, left_out)


def server_room() -> dashboard.ServerRoom:
    """The dashboard's view of ``tuner.servers``: the capability table, its check and the exporters."""
    facts = tuple(dashboard.ServerFacts(name=s.name, title=s.title, version=s.version, capabilities=s.capabilities(),
                                        notes=tuple(s.notes)) for s in servers.SERVERS.values())
    return dashboard.ServerRoom(servers=facts, unsupported=_unsupported, formats=tuple(servers.FORMATS),
                                export_files=_export_files)


if __name__ == "__main__":
    dashboard.install(server_room())
    dashboard.show()
