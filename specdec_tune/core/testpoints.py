"""Pause points for tests that run several real processes on one database.

A test of two ``tune`` (or ``profile``) processes must know that the first one is at a given point (it
holds a study's lease, or has its profile run open) while it starts or releases the other; sleeping
and hoping is no synchronisation. Inert unless ``$SPECDEC_TEST_PAUSE`` is ``POINT:DIR``: at ``POINT``
the process writes its pid into the FIFO ``DIR/reached`` and then waits until the test opens and
closes the FIFO ``DIR/go``. Both are blocking opens of FIFOs the test made
(``tests/support/pause.py``), so each side waits on the other and on nothing else.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "SPECDEC_TEST_PAUSE"


def pause_point(point: str) -> None:
    """Wait here for the test when ``$SPECDEC_TEST_PAUSE`` names ``point`` (see the module docstring)."""
    asked = os.environ.get(ENV_VAR, "")
    name, _, folder = asked.partition(":")
    if name != point or not folder:
        return
    with open(Path(folder) / "reached", "w") as fh:  # blocks until the test reads
        fh.write(f"{os.getpid()}\n")
    with open(Path(folder) / "go") as fh:  # blocks until the test opens it; returns when it closes it
        fh.read()
