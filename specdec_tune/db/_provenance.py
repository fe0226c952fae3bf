"""Where a result came from: the specdec-tune version and the git revision of its checkout."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path


@functools.cache
def specdec_version() -> str | None:
    """The installed specdec-tune version, or ``None`` when the package metadata is missing."""
    try:
        return metadata.version("specdec-tune")
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def git_revision() -> str | None:
    """The commit of the checkout this package runs from (``-dirty`` if modified), else ``None``.

    An installed wheel has no checkout and gives ``None``; the git call is bounded to two seconds
    so a slow file system cannot stall a profile run.
    """
    source = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(source), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True, text=True, timeout=2, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip()
    return text or None
