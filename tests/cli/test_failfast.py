"""A newcomer's mistakes fail fast, in one line, and keep what is stored: a model name that is no model,
a folder that is not a model, a database or export folder that cannot be written, an unprofiled batch
size, and Ctrl-C or ``kill -9`` in the middle of ``profile`` and ``tune``."""
from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import pytest

from specdec_tune.cli import main
from specdec_tune.engine import names, resolve_source
from specdec_tune.core.errors import ModelLoadError, StorageError


def cli(argv: list[str]) -> tuple[int, str, str]:
    """``specdec-tune argv`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def one_error_line(code: int, err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and all(n in lines[0] for n in needles), lines[0]


@pytest.fixture
def hub(monkeypatch):
    """The hub as the test says it is: ``hub(None)`` answers, ``hub("why")`` cannot be reached; the
    probes made are counted (``hub.calls``). No test here touches the network."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(names, "_HUB_STATE", {}, raising=False)

    class Hub:
        calls = 0

        def __call__(self, why):
            def probe(endpoint):
                Hub.calls += 1
                return why

            monkeypatch.setattr(names, "_probe_hub", probe, raising=False)
            return self

    return Hub()


# -- model names ---------------------------------------------------------------------------------------


def test_a_typo_fails_in_seconds_offline_and_suggests_the_bundled_name(hub, tiny_model_dirs):
    hub("no answer from https://huggingface.co within 1 s")
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as info:
        resolve_source("mini-draft-1")
    assert time.perf_counter() - start < 2.0
    message = str(info.value)
    assert "'mini-draft-1'" in message and "did you mean 'mini-draft-1l'" in message
    assert "cannot be reached" in message and "\n" not in message
    code, _, err = cli(["generate", "--target", tiny_model_dirs["target"], "--draft", "nosuchdraft", "--prompt", "x",
                        "--device", "cpu"])
    one_error_line(code, err, "'nosuchdraft'", "did you mean 'mini-draft-", "bundled: mini-target")
    assert hub.calls == 1  # one probe per process, however many names are resolved


def test_hf_hub_offline_is_offline_without_a_probe(hub, monkeypatch):
    hub(None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE is set"):
        resolve_source("gpt2")
    assert hub.calls == 0


def test_hub_ids_pass_where_the_hub_answers(hub):
    hub(None)
    assert resolve_source("gpt2") == "gpt2"  # no org: still a hub id
    assert resolve_source("some-org/some-model") == "some-org/some-model"
    assert resolve_source("mini-target").endswith("mini-target")  # bundled names never ask the hub
    with pytest.raises(ModelLoadError, match="not a bundled model, a local folder or a valid hub id"):
        resolve_source("two words")


def test_the_probe_never_waits_for_a_silent_hub(monkeypatch):
    import huggingface_hub.utils

    class Silent:
        def head(self, *args, **kwargs):
            time.sleep(30)

    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: Silent())
    start = time.perf_counter()
    why = names._probe_hub("https://hub.invalid")
    assert time.perf_counter() - start < 2.0 and "no answer from https://hub.invalid within" in why


def test_tune_refuses_an_unknown_draft_before_anything_is_stored(hub, tiny_model_dirs, tmp_path):
    from specdec_tune.db import list_runs, open_database

    hub("no answer")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    code, _, err = cli(["tune", "--target", tiny_model_dirs["target"], "--drafts", f"{tiny_model_dirs['draft']},nosuchdraft",
                        "--workload", "functions", "--device", "cpu", "--db", url])
    one_error_line(code, err, "'nosuchdraft'", "did you mean")
    assert list_runs(open_database(url)) == []


# -- model folders -------------------------------------------------------------------------------------


def test_a_folder_that_is_not_a_model_names_what_it_lacks(tmp_path, tiny_model_dirs):
    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "config.json").write_text((Path(tiny_model_dirs["target"]) / "config.json").read_text())
    (folder / "tokenizer_config.json").write_text("{}")
    code, _, err = cli(["generate", "--target", str(folder), "--prompt", "x", "--device", "cpu"])
    one_error_line(code, err, f"model folder '{folder}' is not a model: it lacks weights and a tokenizer",
                   "tokenizer.json")
    (folder / "config.json").unlink()
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="lacks config.json and a tokenizer"):
        resolve_source(str(folder))
    with pytest.raises(ModelLoadError, match="is a file, not a model folder"):
        resolve_source(str(folder / "model.safetensors"))
    assert resolve_source(tiny_model_dirs["draft"]) == tiny_model_dirs["draft"]


# -- databases and export folders ----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/proc/specdec.db", "/sys/kernel/specdec.db"])
def test_a_kernel_file_system_is_no_place_for_a_database(path):
    if not Path(path).parent.is_dir():
        pytest.skip(f"{Path(path).parent} is not mounted here")
    code, _, err = cli(["db", "upgrade", "--db", f"sqlite:///{path}"])
    one_error_line(code, err, "file system, which exposes the kernel", "no place for a database file")
    assert "damaged" not in err
    with pytest.raises(StorageError, match="no place for a database file"):
        from specdec_tune.tuner.search import open_storage

        open_storage(f"sqlite:///{path}")


def test_a_read_only_current_folder_is_named(world_dir, unprivileged):
    """``--db`` left out in a read-only folder: the folder is named in full (not "."), nothing created."""
    world_dir.chmod(0o555)
    code, err = unprivileged(_cli_in, str(world_dir), ["db", "upgrade"])
    one_error_line(code, err, f"directory {world_dir} is read-only")
    code, err = unprivileged(_cli_in, str(world_dir), ["db", "upgrade", "--db", "sqlite:///sub.db"])
    one_error_line(code, err, f"directory {world_dir} is read-only")
    assert list(world_dir.iterdir()) == []


def _cli_in(cwd: str, argv: list[str]) -> tuple[int, str]:
    import os

    os.chdir(cwd)
    code, _, err = cli(argv)
    return code, err


def finished_study(folder: Path) -> list[str]:
    """A storage in ``folder`` holding one finished study (its tuning result): the ``export`` flags to read it."""
    import optuna

    from specdec_tune.tuner.model import Candidate, TuningResult

    storage = f"sqlite:///{folder / 'studies.db'}"
    result = TuningResult(candidate=Candidate("mini-draft-1l", 4), server="any", target="mini-target",
                          workload="functions", per_batch_size={1: 4})
    optuna.create_study(study_name="done", storage=storage).set_user_attr("result", result.to_dict())
    (folder / "studies.db").chmod(0o644)
    return ["export", "--study", "done", "--storage", storage, "--format", "vllm"]


def test_export_to_a_folder_it_cannot_create_is_one_line(tmp_path, world_dir, cli_as_unprivileged):
    export = finished_study(world_dir)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = cli([*export, "--out", str(blocker / "sub")])
    one_error_line(code, err, f"--out {blocker / 'sub'} cannot be created: {blocker} is a file")
    if Path("/proc").is_dir():
        code, _, err = cli([*export, "--out", "/proc/specdec-export/x"])
        one_error_line(code, err, "--out /proc/specdec-export/x cannot be created", "proc file system")
        assert not Path("/proc/specdec-export").exists()
    world_dir.chmod(0o555)
    code, err = cli_as_unprivileged([*export, "--out", str(world_dir / "out")])
    one_error_line(code, err, f"--out {world_dir / 'out'} cannot be created: {world_dir} is read-only")
    assert [p.name for p in world_dir.iterdir()] == ["studies.db"]


# -- predictions at a batch size the profile did not measure -------------------------------------------

TINY = ["--device", "cpu", "--repeats", "2", "--k-max", "3", "--n-max", "4", "--max-prompts", "2",
        "--max-new-tokens", "8", "--context-lens", "8,16"]


@pytest.fixture(scope="module")
def tiny_workload(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("failfast") / "w.jsonl"
    path.write_text('{"id": "a", "prompt": "def add(a, b):"}\n{"id": "b", "prompt": "class Point:"}\n'
                    '{"id": "c", "prompt": "for i in range(10):"}\n{"id": "d", "prompt": "print(i, i * i)"}\n')
    return str(path)


@pytest.mark.slow
def test_predict_interpolates_between_profiled_batch_sizes_and_says_so(tiny_model_dirs, tiny_workload, tmp_path):
    import json

    url = f"sqlite:///{tmp_path / 'r.db'}"
    code, _, err = cli(["profile", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"],
                        "--workload", tiny_workload, "--db", url, "--batch-sizes", "1,3", *TINY])
    assert code == 0, err
    predict = ["predict", "--run", "1", "-N", "2", "--db", url]
    code, out, _ = cli([*predict, "--batch-size", "2", "--json"])
    obj = json.loads(out)
    assert code == 0 and obj["label"] == "predicted, interpolated between profiled B = 1 and 3"
    assert obj["interpolated_between"] == [1, 3] and obj["tokens_per_s"] > 0
    code, out, _ = cli([*predict, "--batch-size", "2"])
    assert code == 0 and out.startswith("predicted, interpolated between profiled B = 1 and 3: ")
    for b in ("1", "3"):
        code, out, _ = cli([*predict, "--batch-size", b, "--json"])
        assert json.loads(out)["label"] == "predicted" and json.loads(out)["interpolated_between"] is None
    code, _, err = cli([*predict, "--batch-size", "4"])
    one_error_line(code, err, "--batch-size 4 is outside run 1's profiled batch sizes 1, 3", "never extrapolate",
                   "--batch-sizes 1,3,4")


# -- Ctrl-C and kill -9 --------------------------------------------------------------------------------


def _ctrl_c() -> None:
    """What pressing Ctrl-C does: SIGINT to this process (Python's handler, or the search's own)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture
def sigint_handled():
    """Python's own SIGINT handler for the test: a process started in the background by a
    non-interactive shell (``nohup ... &``, some CI runners) inherits SIGINT ignored, and Python then
    installs no handler, so the planted Ctrl-C would be lost (a clean-clone run so started failed here)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupted_line(code: int, err: str) -> str:
    assert code == 130 and "Traceback" not in err and "Trial " not in err, err
    lines = [line for line in err.splitlines() if "interrupt" in line]
    assert len(lines) == 1, err
    return lines[0]


def test_ctrl_c_during_profile_says_what_was_kept(tiny_model_dirs, tiny_workload, tmp_path, monkeypatch, sigint_handled):
    from specdec_tune.db import get_run, load_timings, open_database
    from specdec_tune.profiler.session import ProfileSession

    monkeypatch.setattr(ProfileSession, "bench_prefill", lambda self: _ctrl_c())
    url = f"sqlite:///{tmp_path / 'r.db'}"
    code, _, err = cli(["profile", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"],
                        "--workload", tiny_workload, "--db", url, *TINY])
    line = _interrupted_line(code, err)
    assert line == ("interrupted: profile run 1 kept as interrupted with forward timings T_v(k), T_s; "
                    "re-run the same command to profile again")
    db = open_database(url)
    assert get_run(db, 1).status == "interrupted" and load_timings(db, 1, kind="verify")


@pytest.mark.slow
def test_ctrl_c_during_tune_keeps_the_trials_in_one_line(tiny_model_dirs, tiny_workload, tmp_path, tune_flags,
                                                         monkeypatch, sigint_handled):
    import optuna

    from specdec_tune.tuner.model import Evaluator

    score, calls = Evaluator.score, []

    def score_then_ctrl_c(self, candidate):
        calls.append(candidate)
        if len(calls) == 3:
            _ctrl_c()  # in the middle of a trial: the search finishes it, stores it and stops
        return score(self, candidate)

    monkeypatch.setattr(Evaluator, "score", score_then_ctrl_c)
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    code, out, err = cli(["tune", "--target", tiny_model_dirs["target"], "--drafts", tiny_model_dirs["draft"],
                          "--workload", tiny_workload, "--db", f"sqlite:///{tmp_path / 'r.db'}", "--storage", storage,
                          "--study", "s", "--trials", "40", *tune_flags])
    line = _interrupted_line(code, err)
    trials = optuna.load_study(study_name="s", storage=storage).get_trials()
    kept = [t for t in trials if t.state.name == "COMPLETE"]
    assert line == f"interrupted: {len(kept)} trials kept; re-run the same command to resume" and len(kept) >= 1
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}  # none left RUNNING, none FAIL
