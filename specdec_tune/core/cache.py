"""Where specdec-tune keeps what it measures or builds once per machine and reuses across checkouts.

``$SPECDEC_CACHE_DIR`` if set (tests point it at a temporary folder), else ``$XDG_CACHE_HOME/specdec-tune``,
else ``~/.cache/specdec-tune``. Entries are keyed by what they depend on (host, CPU, torch version,
models or sources), so two checkouts or two machines sharing a home folder never overwrite each
other's. Deleting the folder is always safe: everything in it is measured or built again.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "SPECDEC_CACHE_DIR"


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    explicit = os.environ.get(ENV_VAR, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "specdec-tune"
