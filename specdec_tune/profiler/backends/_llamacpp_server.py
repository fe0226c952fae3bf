"""Run a ``llama-server`` on 127.0.0.1 and read what it decoded and how its drafts fared.

Read in llama.cpp 0c1e57098 (vendored by llama-cpp-python 0.3.36), ``tools/server``:

- ``POST /completion`` with a *token-id* prompt adds no BOS (``server-common.cpp``,
  ``tokenize_mixed``: BOS only for a string prompt), so the server decodes the very ids our engine
  does. ``temperature <= 0`` is argmax (``src/llama-sampler.cpp``, ``llama_sampler_temp_impl``);
  ``return_tokens`` returns the generated ids; ``ignore_eos`` decodes ``n_predict`` tokens;
  ``cache_prompt: false`` prefills every prompt afresh. The response's ``timings`` carry
  ``draft_n`` and ``draft_n_accepted`` (``server_slot_stats::to_json``, present once it drafted) and
  its ``generation_settings`` the speculative types it ran (``speculative.types``, from
  ``task_params::to_json``; n_max, n_min and p_min are not reported, the counters show them).
- ``GET /metrics`` (with ``--metrics``) holds ``llamacpp:spec_decode_num_drafts_total`` (verify steps
  with a draft), ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and
  ``..._num_accepted_tokens_per_pos_total{position="i"}`` (verify steps whose first i + 1 draft
  tokens were accepted: vLLM's per-position counter, so :class:`SpecCounters` holds both). A slot
  adds its request to these counters when it is *reset* for the next request
  (``callback_on_reset``), so :meth:`LlamaServer.counters` first sends a one-token request, and
  the server must run one slot (``-np 1``) for that request to reset the same slot.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec_tune.profiler.backends._llamacpp import LlamacppError
from specdec_tune.profiler.backends._vllm import SpecCounters

START_TIMEOUT_S = 300.0
CALL_TIMEOUT_S = 600.0
HOST = "127.0.0.1"
_METRIC = re.compile(r'^llamacpp:(spec_decode_[a-z_]+?)(?:\{position="(\d+)"\})?\s+(\S+)$')


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Completion:
    """One ``/completion`` answer."""

    token_ids: list[int]
    draft_tokens: int  # timings.draft_n (0 when the server drafted nothing)
    draft_accepted: int  # timings.draft_n_accepted
    settings: dict[str, Any] = field(default_factory=dict)  # generation_settings
    timings: dict[str, Any] = field(default_factory=dict)


def parse_metrics(text: str) -> SpecCounters:
    """The speculative counters of a ``/metrics`` page (zeros when the server has not drafted yet)."""
    totals: dict[str, float] = {}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if not m:
            continue
        name, pos, value = m.groups()
        if pos is not None:
            per_pos[int(pos)] = int(float(value))
        else:
            totals[name] = float(value)
    return SpecCounters(drafts=int(totals.get("spec_decode_num_drafts_total", 0)),
                        draft_tokens=int(totals.get("spec_decode_num_draft_tokens_total", 0)),
                        accepted=int(totals.get("spec_decode_num_accepted_tokens_total", 0)),
                        accepted_per_pos=tuple(per_pos.get(i, 0) for i in range(max(per_pos, default=-1) + 1)))


class LlamaServer:
    """A ``llama-server`` process (a context manager): ``argv`` is the command as exported (a
    ``launch.sh`` or ``llama-server ...``); ``--host 127.0.0.1 --port P`` and ``extra`` are appended.

    The process runs in a session of its own, so stopping it also stops a server started by a
    shell script. Its output goes to :attr:`log_path` (removed when it stops); errors quote its last
    lines.
    """

    def __init__(self, argv: Sequence[str], *, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
                 extra: Sequence[str] = ("--metrics", "-np", "1")) -> None:
        self.port = free_port()
        self.argv = [*argv, "--host", HOST, "--port", str(self.port), *extra]
        self.cwd, self.env = cwd, env
        self.log_path = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> LlamaServer:
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail, code = self.log_tail(), self._proc.returncode
                self.close()
                raise LlamacppError(f"llama-server exited with code {code}: {tail}")
            try:
                if self._request("GET", "/health", timeout=5).get("status") == "ok":
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, LlamacppError):
                pass
            time.sleep(0.2)
        tail = self.log_tail()
        self.close()
        raise LlamacppError(f"llama-server did not answer /health within {START_TIMEOUT_S:.0f} s: {tail}")

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server (SIGTERM to its session, SIGKILL after 10 s)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            self.log_path.unlink(missing_ok=True)
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        self.log_path.unlink(missing_ok=True)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    def _request(self, method: str, path: str, body: dict | None = None, *, timeout: float = CALL_TIMEOUT_S,
                 raw: bool = False) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise LlamacppError(f"llama-server {method} {path}: HTTP {exc.code} {exc.read().decode(errors='replace')[:300]}") from None
        return text if raw else json.loads(text)

    def complete(self, prompt_ids: Sequence[int], n_predict: int) -> Completion:
        """Greedy completion of a token-id prompt: exactly ``n_predict`` new tokens (EOS ignored)."""
        out = self._request("POST", "/completion", {
            "prompt": [int(t) for t in prompt_ids], "n_predict": int(n_predict), "temperature": 0.0,
            "ignore_eos": True, "cache_prompt": False, "return_tokens": True, "stream": False})
        timings = out.get("timings") or {}
        return Completion(token_ids=[int(t) for t in out.get("tokens") or []],
                          draft_tokens=int(timings.get("draft_n", 0)), draft_accepted=int(timings.get("draft_n_accepted", 0)),
                          settings=out.get("generation_settings") or {}, timings=timings)

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own tokenization of ``text`` (no BOS)."""
        return [int(t) for t in self._request("POST", "/tokenize", {"content": text, "add_special": False})["tokens"]]

    def counters(self) -> SpecCounters:
        """The server's speculative counters over every request answered so far (module docstring:
        a one-token request first flushes the last request's slot into them)."""
        self.complete([0], 1)
        return parse_metrics(self._request("GET", "/metrics", raw=True))


def completions_with_counters(server: LlamaServer, prompts: Sequence[Sequence[int]],
                              n_predict: int) -> tuple[list[Completion], list[SpecCounters]]:
    """Greedy completions of ``prompts`` one after another, and the server's counters over each of
    them (the difference of :meth:`LlamaServer.counters` around each request)."""
    done: list[Completion] = []
    deltas: list[SpecCounters] = []
    before = server.counters()
    for ids in prompts:
        done.append(server.complete(ids, n_predict))
        after = server.counters()
        n = len(after.accepted_per_pos)
        deltas.append(SpecCounters(after.drafts - before.drafts, after.draft_tokens - before.draft_tokens,
                                   after.accepted - before.accepted,
                                   tuple(a - b for a, b in zip(after.accepted_per_pos, before.padded(n)))))
        before = after
    return done, deltas
