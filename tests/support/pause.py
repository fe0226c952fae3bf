"""The test side of ``specdec_tune.core.testpoints``: stop a real process at a named point and release it.

``Pause(folder, point)`` makes the two FIFOs; ``env`` goes to the process; ``wait(proc)`` returns once the
process has reached the point (it wrote its pid), ``release()`` lets it go on. Both are blocking FIFO
operations on both sides; the timeouts below only turn a process that died (or never reaches the
point) into a test failure instead of a hang.
"""
from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from pathlib import Path

from specdec_tune.core.testpoints import ENV_VAR


class Pause:
    def __init__(self, folder: Path, point: str) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        os.mkfifo(self.folder / "reached")
        os.mkfifo(self.folder / "go")
        self.env = {ENV_VAR: f"{point}:{self.folder}"}

    def wait(self, proc: subprocess.Popen, timeout: float = 300.0) -> int | None:
        """The pid the process wrote at the point, or None when it ended without reaching it."""
        fd = os.open(self.folder / "reached", os.O_RDONLY | os.O_NONBLOCK)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                ready, _, _ = select.select([fd], [], [], 1.0)
                if ready:
                    data = os.read(fd, 64)
                    if data:
                        return int(data.decode().split()[0])
                if proc.poll() is not None:
                    return None
            raise AssertionError(f"process {proc.pid} did not reach the pause point in {timeout} s")
        finally:
            os.close(fd)

    def release(self, timeout: float = 60.0) -> None:
        """Let the paused process go on (it returns from its open of ``go`` once this closes it)."""
        opened = threading.Thread(target=lambda: open(self.folder / "go", "w").close(), daemon=True)
        opened.start()
        opened.join(timeout)
        assert not opened.is_alive(), "the paused process never opened its go FIFO"
