"""Several processes on one results database (issue 35, row 4): a ``tune`` holds its study's lease, a
second one asking for the same study is refused in one line naming the first, other studies work side
by side, a study holds the trials of one profile run only, a killed holder's lease is taken over, and
two ``profile`` processes store two runs. The processes are real (``python -m specdec_tune.cli``); where
one must be at a given point while another starts, it waits there on a FIFO (``tests/support/pause.py``)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import multiprocessing
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_tune.db import LeaseRecord, get_lease, insert_lease, lease_key, list_runs, load_timings, open_database
from specdec_tune.db import release_lease, renew_lease, take_over_lease
from specdec_tune.core.errors import BusyError, InputError
from specdec_tune.tuner.search import StudyLease, TuneRequest, open_storage, run_tune
from specdec_tune.tuner.search._lease import host, pid_scope
from tests.support._lease_worker import insert_at_barrier
from tests.support.pause import Pause
from tests.db.test_contract import new_url  # noqa: F401 - the backends fixture (SQLite; PostgreSQL where there is one)

ROOT = Path(__file__).resolve().parents[3]
PROFILE_FLAGS = ("--device", "cpu", "--repeats", "2", "--k-max", "3", "--n-max", "4", "--max-prompts", "2",
                 "--max-new-tokens", "8", "--context-lens", "8,16", "--threads", "1")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _lease(subject: str, token: str, *, pid: int = 1, host_name: str = "elsewhere", scope: str | None = None,
           age_s: float = 0.0) -> LeaseRecord:
    beat = _now() - dt.timedelta(seconds=age_s)
    return LeaseRecord(lease_key(subject), subject, token, "tune", pid, host_name, scope, beat, beat)


# ----------------------------------------------------------------------------------------- the lease table


@pytest.mark.slow
def test_of_processes_inserting_one_lease_at_once_one_wins(new_url):  # noqa: F811
    url = new_url()
    open_database(url).close()  # migrated once, before the race
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=insert_at_barrier, args=(url, "study 's'", f"t{i}", barrier, results))
             for i in range(4)]
    for p in procs:
        p.start()
    outcome = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    winners = [token for token, won in outcome.items() if won]
    assert len(winners) == 1 and len(outcome) == 4
    assert get_lease(open_database(url), lease_key("study 's'")).token == winners[0]


def test_lease_steps_match_the_holding_token(new_url):  # noqa: F811
    db = open_database(new_url())
    first = _lease("study 'x'", "a")
    assert insert_lease(db, first) and not insert_lease(db, _lease("study 'x'", "b"))
    assert get_lease(db, first.key).token == "a" and get_lease(db, lease_key("study 'y'")) is None
    assert not renew_lease(db, first.key, "b") and not release_lease(db, first.key, "b")
    # of two processes taking over one dead holder's lease, one succeeds
    assert take_over_lease(db, "a", _lease("study 'x'", "c")) and not take_over_lease(db, "a", _lease("study 'x'", "d"))
    assert not renew_lease(db, first.key, "a") and renew_lease(db, first.key, "c")
    assert release_lease(db, first.key, "c") and get_lease(db, first.key) is None


def test_a_held_study_is_refused_with_its_holder_and_given_back(tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    with StudyLease(db, "study 's' in x") as first:
        with pytest.raises(BusyError) as refused:
            StudyLease(db, "study 's' in x").acquire()
        line = str(refused.value)
        assert "\n" not in line and line.startswith("study 's' in x: in use by another process")
        assert f"pid {os.getpid()} on host {host()}" in line and "--study" in line
        with StudyLease(db, "study 'other' in x"):  # another study is free
            pass
        first.check()
    assert get_lease(db, lease_key("study 's' in x")) is None  # given back
    StudyLease(db, "study 's' in x").acquire().release()


def test_a_dead_holders_lease_is_taken_over(tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid of this machine that names no process now
    # a fresh heartbeat, but on this machine and its pid is gone: taken over at once
    insert_lease(db, _lease("s1", "dead", pid=gone.pid, host_name=host(), scope=pid_scope()))
    lease = StudyLease(db, "s1").acquire()
    assert lease.taken_over.token == "dead" and get_lease(db, lease_key("s1")).token == lease.token
    lease.release()
    # another machine's holder: alive while its heartbeat is fresh, dead once it is stale
    insert_lease(db, _lease("s2", "far", pid=os.getpid(), age_s=30))
    with pytest.raises(BusyError, match="last heartbeat 30 s ago"):
        StudyLease(db, "s2", stale_s=60).acquire()
    assert StudyLease(db, "s2", stale_s=20).acquire().taken_over.token == "far"
    # a live process of this machine keeps its lease
    insert_lease(db, _lease("s3", "live", pid=os.getppid(), host_name=host(), scope=pid_scope(), age_s=5))
    with pytest.raises(BusyError, match=f"pid {os.getppid()}"):
        StudyLease(db, "s3").acquire()


def test_a_lease_taken_over_stores_nothing_and_is_not_released_by_its_old_holder(tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    old = StudyLease(db, "s").acquire()
    new = _lease("s", "new", pid=12345)
    assert take_over_lease(db, old.token, new)  # as a process that found `old` dead would
    with pytest.raises(BusyError, match="taken over by pid 12345 on host elsewhere.*stored no result"):
        old.check()
    old.release()
    assert get_lease(db, new.key).token == "new"


def test_check_renews_the_heartbeat(tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    lease = StudyLease(db, "s").acquire()
    held = get_lease(db, lease.key)
    assert take_over_lease(db, lease.token, dataclasses.replace(held, heartbeat_at=_now() - dt.timedelta(hours=1)))
    lease.check()
    assert (_now() - get_lease(db, lease.key).heartbeat_at).total_seconds() < 60
    lease.release()


# ------------------------------------------------------------------------- a study belongs to one profile run


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("concurrency") / "w.jsonl"
    prompts = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
               "x = [i for i in range(3)]", "return a + b", "self.x = x"]
    path.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    return str(path)


def _studies(storage_url: str) -> dict[str, int]:
    """Each study's profile run, after checking that every completed trial was predicted from that run and
    that the result stored with it (if any) names it too."""
    import optuna

    from specdec_tune.tuner.model import TuningResult

    storage = open_storage(storage_url)
    bound = {}
    for name in optuna.get_all_study_names(storage):
        study = optuna.load_study(study_name=name, storage=storage)
        run_id = study.user_attrs["tune"]["run_id"]
        trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        assert trials and {t.user_attrs.get("run_id") for t in trials} == {run_id}, name
        if "result" in study.user_attrs:
            assert TuningResult.from_dict(study.user_attrs["result"]).run_id == run_id, name
        bound[name] = run_id
    return bound


@pytest.mark.slow
def test_a_new_profile_run_gets_its_own_study(tiny_model_dirs, workload, tmp_path):
    """Trials predicted from two profiles never share a study: a fresh profile of the same request gets a
    study of its own, and a --study made from another run is refused before anything is profiled."""
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    storage = f"sqlite:///{tmp_path / 's.db'}"
    req = TuneRequest(target=tiny_model_dirs["target"], drafts=(tiny_model_dirs["draft"], "ngram"), workload=workload,
                      trials=3, measure_top=2, batch_sizes=(1, 2), n_max=4, max_prompts=2, max_new_tokens=8,
                      profile_repeats=2, measure_prompts=2, heldout_prompts=2, repeats=1, device="cpu", threads=1)
    first = run_tune(db, req, storage)
    second = run_tune(db, dataclasses.replace(req, reprofile=True), storage)  # a fresh profile, the same request
    assert second.run_id != first.run_id and second.study != first.study
    assert (first.study, second.study) == (req.study_name(first.run_id), req.study_name(second.run_id))
    assert second.study.endswith(f"-run{second.run_id}")
    assert _studies(storage) == {first.study: first.run_id, second.study: second.run_id}
    with pytest.raises(InputError, match=f"study '{first.study}' holds trials predicted from profile run "
                                         f"{first.run_id}"):
        run_tune(db, dataclasses.replace(req, study=first.study, reprofile=True), storage)
    assert len(list_runs(db)) == 2  # refused before profiling
    again = run_tune(db, req, storage)  # the same command: the newest profile, its study, resumed
    assert (again.run_id, again.study, again.profiled, again.new_trials) == (second.run_id, second.study, False, 0)


# ------------------------------------------------------------------------------------ two real processes


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(extra or {})}


@pytest.fixture
def start(tmp_path):
    """``start(argv, name, env)``: ``specdec-tune argv`` in a process of its own (stdout and stderr to
    ``name.out`` / ``name.err``); one still running when the test ends (a failed test may leave one paused)
    is killed."""
    started: list[subprocess.Popen] = []

    def run(argv: list[str], name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        out, err = (tmp_path / f"{name}.out").open("w"), (tmp_path / f"{name}.err").open("w")
        started.append(subprocess.Popen([sys.executable, "-m", "specdec_tune.cli", *argv], cwd=tmp_path,
                                        env=_env(env), stdout=out, stderr=err))
        return started[-1]

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ended(proc: subprocess.Popen, tmp_path: Path, name: str) -> tuple[int, str, str]:
    code = proc.wait(600)
    return code, (tmp_path / f"{name}.out").read_text(), (tmp_path / f"{name}.err").read_text()


def _tune(tiny_model_dirs, workload, db_url, tune_flags, *extra) -> list[str]:
    return ["tune", "--target", tiny_model_dirs["target"], "--drafts", f"{tiny_model_dirs['draft']},ngram",
            "--workload", workload, "--db", db_url, *tune_flags, "--trials", "3", "--threads", "1", "--json", *extra]


@pytest.mark.slow
def test_two_tunes_on_one_database_never_mix(tiny_model_dirs, workload, tmp_path, tune_flags, start):
    """The first tune holds its study (paused while profiling); the same command in a second process is
    refused in one line naming the first and stores nothing; a tune of another study runs side by side.
    Then the first is killed (kill -9): the same command finds its pid gone, takes the lease over at once
    (no waiting for the heartbeat to go stale) and says so. No study holds trials of two profile runs."""
    db_url = f"sqlite:///{tmp_path / 'c.db'}"
    argv = _tune(tiny_model_dirs, workload, db_url, tune_flags)
    pause = Pause(tmp_path / "pause", "profile-run")
    first = start(argv, "first", pause.env)
    assert pause.wait(first) == first.pid  # it holds the lease and has opened profile run 1
    code, out, err = _ended(start(argv, "second"), tmp_path, "second")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, out, err)
    assert lines[0].startswith("error: studies 'tune-") and "in use by another process" in lines[0]
    assert f"pid {first.pid} on host {platform.node() or 'unknown host'} (tune, since " in lines[0]
    assert "wait for it to end" in lines[0] and "--study" in lines[0]
    db = open_database(db_url)
    assert [(r.id, r.status) for r in list_runs(db)] == [(1, "running")]  # the refused one stored nothing

    code, out, err = _ended(start([*argv, "--study", "side"], "side"), tmp_path, "side")
    assert code == 0, err
    side = json.loads(out)
    assert (side["study"], side["run_id"], side["profiled"]) == ("side", 2, True)

    first.kill()
    first.wait()
    code, out, err = _ended(start(argv, "again"), tmp_path, "again")
    assert code == 0, err
    again = json.loads(out)
    # the newest completed profile that answers the request is the side tune's run 2: reused, in a study of its own
    assert (again["run_id"], again["profiled"], again["completed_trials"]) == (2, False, 3)
    assert again["study"].startswith("tune-") and again["study"].endswith("-run2")
    assert any(n.startswith(f"took the study's lease over from pid {first.pid} ") for n in again["notes"])
    assert _studies(f"sqlite:///{tmp_path / 'c-studies.db'}") == {"side": 2, again["study"]: 2}
    assert get_lease(db, lease_key(f"study 'side' in sqlite:///{tmp_path / 'c-studies.db'}")) is None  # given back


@pytest.mark.slow
def test_two_profiles_at_once_store_two_runs(tiny_model_dirs, workload, tmp_path, start):
    """Two profile processes with both runs open at once (each waits on its FIFO): two completed runs,
    each with its own samples, none overwritten."""
    db_url = f"sqlite:///{tmp_path / 'p.db'}"
    argv = ["profile", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"], "--workload",
            workload, "--db", db_url, *PROFILE_FLAGS, "--json"]
    pauses = [Pause(tmp_path / f"pause{i}", "profile-run") for i in range(2)]
    procs = [start(argv, f"p{i}", p.env) for i, p in enumerate(pauses)]
    assert [p.wait(proc) for p, proc in zip(pauses, procs)] == [proc.pid for proc in procs]
    db = open_database(db_url)
    assert sorted((r.id, r.status) for r in list_runs(db)) == [(1, "running"), (2, "running")]
    for p in pauses:
        p.release()
    ended = [_ended(proc, tmp_path, f"p{i}") for i, proc in enumerate(procs)]
    assert all(code == 0 for code, _, _ in ended), [err for _, _, err in ended]
    assert sorted(json.loads(out)["run_id"] for _, out, _ in ended) == [1, 2]
    runs = list_runs(db)
    assert sorted((r.id, r.status) for r in runs) == [(1, "completed"), (2, "completed")]
    verify = [load_timings(db, r.id, kind="verify") for r in sorted(runs, key=lambda r: r.id)]
    assert all(verify) and len(verify[0]) == len(verify[1])  # the same settings: as many samples each
