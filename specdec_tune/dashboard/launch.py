"""Start the Streamlit app as a child process, wait until it serves, stop it cleanly.

``specdec-tune dashboard`` checks its input first (database, study storage, host and port: one line
and exit 2 each), then runs ``python -m streamlit run`` on the app script it is given (the CLI's entry script) headless, bound to the host it was given
(127.0.0.1 unless told otherwise), with usage statistics and the file watcher off. It polls
Streamlit's ``/_stcore/health`` before printing the URL, and on Ctrl-C stops the child and waits for it.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdec_tune.dashboard.sources import STORAGE_ENV, Sources
from specdec_tune.core.errors import InputError

APP = Path(__file__).with_name("app.py")
HEALTH_PATH = "/_stcore/health"


def check_port(host: str, port: int) -> None:
    """Raise :class:`InputError` unless ``host:port`` can be bound now (valid host, free port)."""
    if not 1 <= port <= 65535:
        raise InputError(f"--port {port} is not a TCP port; valid: 1-65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not a valid host name"
        raise InputError(f"--host {host!r} cannot be resolved ({reason}); e.g. 127.0.0.1 or 0.0.0.0") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # The same option the web server sets, so a port in TIME_WAIT counts as free and a listening one not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except PermissionError:
            raise InputError(f"--port {port} needs privileges on {host}; use a port above 1023") from None
        except OSError as exc:
            raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (port in use? choose another "
                             "with --port)") from None


def url_for(host: str, port: int) -> str:
    """The URL to open: a wildcard bind is reached through the loopback address."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def streamlit_command(host: str, port: int, app: Path = APP) -> list[str]:
    """The child process's command line."""
    return [
        sys.executable, "-m", "streamlit", "run", str(app),
        "--server.headless", "true", "--server.address", host, "--server.port", str(port),
        "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
        "--global.developmentMode", "false", "--server.runOnSave", "false", "--client.toolbarMode", "viewer",
        "--logger.level", "warning",
    ]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> bool:
    """Poll ``url`` + ``/_stcore/health`` until it answers 200 (``False``: the child died or time ran out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + HEALTH_PATH, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.25)
    return False


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> int:
    """Ask the child to stop (SIGTERM), wait, kill it if it will not; return its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@dataclass
class Dashboard:
    """A running dashboard child process and its URL."""

    proc: subprocess.Popen
    url: str


def start(sources: Sources, host: str = "127.0.0.1", port: int = 8501, timeout_s: float = 60.0,
          app: Path = APP) -> Dashboard:
    """Start Streamlit on ``host:port`` reading ``sources``; return once it answers its health check.

    Raises:
        InputError: the port cannot be bound, or Streamlit exited (or never answered) before serving.
    """
    check_port(host, port)
    env = dict(os.environ)
    env["SPECDEC_DB"] = sources.db_url
    if sources.storage_url:
        env[STORAGE_ENV] = sources.storage_url
    else:
        env.pop(STORAGE_ENV, None)
    env.setdefault("OMP_NUM_THREADS", "1")  # the app predicts with the model: no thread pool needed
    proc = subprocess.Popen(streamlit_command(host, port, app), env=env, stdout=subprocess.DEVNULL)
    url = url_for(host, port)
    try:
        healthy = wait_healthy(url, proc, timeout_s)
    except BaseException:  # Ctrl-C while starting: leave no orphan behind
        stop(proc)
        raise
    if not healthy:
        code = stop(proc)
        raise InputError(f"the dashboard did not start on {host}:{port} (streamlit exited with code {code}; its "
                         "message is above)" if code not in (None, -15) else
                         f"the dashboard did not answer {url}{HEALTH_PATH} within {timeout_s:.0f} s")
    return Dashboard(proc=proc, url=url)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve(sources: Sources, host: str, port: int, on_ready: Callable[[str], None], app: Path = APP) -> int:
    """Run the dashboard until Ctrl-C or SIGTERM (or until Streamlit exits); return 0 after a clean stop."""
    # Explicit handlers: a process started in the background inherits an ignored SIGINT, and a
    # supervisor stops with SIGTERM; both must stop the child instead of orphaning it.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            board = start(sources, host, port, app=app)
        except KeyboardInterrupt:
            return 0
        on_ready(board.url)
        try:
            return board.proc.wait()
        except KeyboardInterrupt:
            stop(board.proc)
            return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
