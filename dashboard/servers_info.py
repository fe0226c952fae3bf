"""What each inference server can express, read from ``tuner.servers`` (the tuner's capability table).

The dashboard never keeps its own copy of that table: without ``tuner.servers`` it lists the server
names the ``tune`` command accepts and says the capability table is not installed.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    if mod is None:
        return KNOWN_SERVERS
    for name in ("SERVERS", "CAPABILITIES", "SERVER_SPACES"):
        table = getattr(mod, name, None)
        if table:
            return tuple(str(k) for k in table if str(k) != "any")
    return KNOWN_SERVERS


@dataclass(frozen=True)
class ServerRow:
    """One server's space, as a user reads it."""

    server: str
    expresses: str
    cannot: str
    version: str


def capability_rows() -> tuple[ServerRow, ...] | None:
    """One row per server from ``tuner.servers`` (``None`` when the module is not installed)."""
    mod = _servers_module()
    if mod is None:
        return None
    return ()
