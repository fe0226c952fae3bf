"""The tuner's Optuna search over a stored profile: optimum, server spaces, resume, kill -9, two workers."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec_tune.db import default_storage_url, open_database
from specdec_tune.core.errors import InputError, StorageError
from specdec_tune.tuner.model import Candidate, Evaluator
from specdec_tune.tuner.search import (
    best_per_server,
    brute_force,
    check_storage,
    open_storage,
    run_search,
    server_search_space,
    unsupported,
)
from specdec_tune.tuner.servers import SERVERS

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def profile_db(tiny_model_dirs, tmp_path_factory):
    """One stored profile (tiny model draft + n-gram, N_max 6, B in {1, 2}) and its run id."""
    from specdec_tune.profiler.session import ProfileSettings, run_profile

    root = tmp_path_factory.mktemp("tune_search")
    workload = root / "w.jsonl"
    workload.write_text('{"id": "a", "prompt": "def add(a, b):"}\n{"id": "b", "prompt": "class Point:"}\n'
                        '{"id": "c", "prompt": "for i in range(10):"}\n{"id": "d", "prompt": "print(i, i * i)"}\n')
    url = f"sqlite:///{root / 'results.db'}"
    settings = ProfileSettings(device="cpu", repeats=2, k_max=7, n_max=6, max_prompts=2, max_new_tokens=12,
                               context_lens=(8, 16), batch_sizes=(1, 2), overhead_ns=(1, 3), overhead_prompts=1)
    run_id = run_profile(open_database(url), tiny_model_dirs["target"], [tiny_model_dirs["draft"], "ngram"],
                         str(workload), settings).run_id
    return url, run_id, tiny_model_dirs["draft"], root


def _space(profile_db, server="any"):
    _, _, draft, _ = profile_db
    return server_search_space(server, [draft], 6, True)


def _storage(tmp_path):
    return open_storage(f"sqlite:///{tmp_path / 'studies.db'}")


@pytest.mark.slow
def test_bruteforce_search_finds_the_models_optimum(profile_db, tmp_path):
    url, run_id, _, _ = profile_db
    space = _space(profile_db)
    ev = Evaluator(open_database(url), run_id)
    exhaustive = brute_force(Evaluator(open_database(url), run_id), space)
    # the check has power: the optimum is neither the first point enumerated nor tied with the worst
    assert exhaustive[0].candidate != next(space.candidates())
    assert exhaustive[0].predicted_tokens_per_s > exhaustive[-1].predicted_tokens_per_s * 1.01
    out = run_search(ev, space, storage=_storage(tmp_path), study_name="s", trials=space.size)
    # points the profile cannot predict (n-gram N beyond its longest recorded lookup) are pruned
    assert out.sampler == "bruteforce" and out.completed == len(exhaustive) and len(out.study.get_trials()) == space.size
    # the trials run count apart by how they ended, and add up (issue 35: "200 completed (205 new)")
    assert out.new_states == {"COMPLETE": len(exhaustive), "PRUNED": space.size - len(exhaustive)}
    assert out.new_trials == sum(out.new_states.values()) == space.size > len(exhaustive)
    assert out.ranked[0].candidate == exhaustive[0].candidate
    assert out.ranked[0].predicted_tokens_per_s == pytest.approx(exhaustive[0].predicted_tokens_per_s, rel=1e-12)
    assert out.study.best_value == pytest.approx(exhaustive[0].predicted_tokens_per_s, rel=1e-12)
    # every trial stores its prediction; every point was predicted once (no duplicate evaluations)
    trials = [t for t in out.study.get_trials() if t.state.name == "COMPLETE"]
    assert all(t.user_attrs["source"] == "simulation" or t.user_attrs["candidate"]["drafter"] in ("ngram", "none")
               for t in trials)
    assert all(t.value == ev.score(Candidate.from_dict(t.user_attrs["candidate"])).predicted_tokens_per_s for t in trials)
    assert len({Candidate.from_dict(t.user_attrs["candidate"]) for t in trials}) == len(exhaustive) == ev.predictions


@pytest.mark.slow
def test_tpe_search_caches_duplicates_and_gets_close(profile_db, tmp_path):
    url, run_id, _, _ = profile_db
    space = _space(profile_db)
    ev = Evaluator(open_database(url), run_id)
    out = run_search(ev, space, storage=_storage(tmp_path), study_name="t", trials=60)
    assert out.sampler == "tpe" and out.completed == 60
    distinct = {Candidate.from_dict(t.user_attrs["candidate"]) for t in out.study.get_trials() if "candidate" in t.user_attrs}
    assert ev.predictions == len(distinct)  # a point proposed twice was predicted once
    best = brute_force(ev, space)[0].predicted_tokens_per_s
    assert out.ranked[0].predicted_tokens_per_s >= 0.95 * best


class _Landscape(Evaluator):
    """Synthetic predictions (no profile): speculation pays most at N = 5, more with θ and the heuristic
    schedule, so the whole space's optimum is one that vLLM cannot run and vLLM's best is one point of many."""

    def __init__(self) -> None:
        self.cache, self.memory, self.mode, self.predictions = {}, None, "greedy", 0

    def score(self, c):
        from specdec_tune.tuner.model import Scored

        if c not in self.cache:
            self.predictions += 1
            tps = 90.0 if c.is_plain else (95.0 - c.num_speculative_tokens if c.is_ngram else
                                           100 + 10 * (1 - abs(c.num_speculative_tokens - 5) / 5)
                                           + 15 * c.threshold * (c.schedule == "heuristic"))
            self.cache[c] = Scored(c, tps, tps / 90.0, 2.0, "synthetic")
        return self.cache[c]


def test_each_servers_best_is_found_where_the_main_study_never_sampled(tmp_path):
    """A short TPE study over the whole space samples a few points; each server's best inside its own space
    is still the model's optimum there (every point of the server's space predicted), though the study
    never visited it, so the confirmation measures it."""
    ev = _Landscape()
    space = server_search_space("any", ["d"], 16, True)
    out = run_search(ev, space, storage=_storage(tmp_path), study_name="short", trials=3)
    visited = {s.candidate for s in out.ranked}
    bests = best_per_server(ev, ["d"], 16, True)
    assert set(bests) == set(SERVERS)
    for server, best in bests.items():
        exhaustive = brute_force(_Landscape(), server_search_space(server, ["d"], 16, True))
        assert best.candidate == exhaustive[0].candidate and unsupported(server, best.candidate) is None
    assert bests["vllm"].candidate == Candidate("d", 5) and Candidate("d", 5) not in visited  # never sampled ...
    # ... so reading the server's best off the study's trials (a plausible shortcut) would miss it
    from_study = [s for s in out.ranked if unsupported("vllm", s.candidate) is None]
    assert not from_study or from_study[0].predicted_tokens_per_s < bests["vllm"].predicted_tokens_per_s
    # a θ grid given to tune (benchmarks) restricts the servers that have θ, and only them
    grid = best_per_server(ev, ["d"], 16, True, ("llamacpp", "hf", "vllm"), thresholds=(0.0, 0.5))
    assert grid["hf"].candidate == Candidate("d", 5, 0.5, "hf", "heuristic") and grid["vllm"] == bests["vllm"]
    assert bests["hf"].candidate == Candidate("d", 5, 0.95, "hf", "heuristic")


@pytest.mark.slow
@pytest.mark.parametrize("server", SERVERS)
def test_search_stays_inside_the_servers_space(profile_db, tmp_path, server):
    url, run_id, _, _ = profile_db
    space = _space(profile_db, server)
    out = run_search(Evaluator(open_database(url), run_id), space, storage=_storage(tmp_path), study_name=server,
                     trials=space.size)
    for t in out.study.get_trials(states=[__import__("optuna").trial.TrialState.COMPLETE]):
        c = Candidate.from_dict(t.user_attrs["candidate"])
        assert unsupported(server, c) is None, (server, c)
    winner = out.ranked[0].candidate
    if server in ("vllm", "sglang", "trtllm"):
        assert all(s.candidate.threshold == 0 and s.candidate.schedule == "constant" for s in out.ranked)
        assert "threshold" not in out.study.best_trial.params
    if server == "hf":
        assert all(s.candidate.threshold == 0 or s.candidate.threshold_rule == "hf" for s in out.ranked)
    if server == "llamacpp":
        assert {s.candidate.threshold_rule for s in out.ranked} == {"before"} and len(space.thresholds) > 1
    # the restricted winner is the best of the whole space's points that this server can express
    whole = brute_force(Evaluator(open_database(url), run_id), _space(profile_db))
    assert winner == next(s.candidate for s in whole if unsupported(server, s.candidate) is None)


@pytest.mark.slow
def test_resume_and_interrupt_keep_completed_trials(profile_db, tmp_path):
    url, run_id, _, _ = profile_db
    space, storage = _space(profile_db), _storage(tmp_path)
    first = run_search(Evaluator(open_database(url), run_id), space, storage=storage, study_name="r", trials=8)
    # completed trials only: a trial that repeats an earlier point is pruned (it is not re-evaluated)
    kept = {t.number: (t.params, t.value) for t in first.study.get_trials() if t.state.name == "COMPLETE"}
    seen = []

    def interrupt(trial):  # Ctrl-C after the 4th trial of the second run was stored
        seen.append((trial.number, trial.state.name))
        if len(seen) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_search(Evaluator(open_database(url), run_id), space, storage=storage, study_name="r", trials=30,
                   on_trial=interrupt)
    import optuna

    stored = optuna.load_study(study_name="r", storage=storage).get_trials()
    interrupted = {t.number for t in stored if t.state.name == "COMPLETE"}
    assert interrupted == set(kept) | {n for n, state in seen if state == "COMPLETE"}
    again = run_search(Evaluator(open_database(url), run_id), space, storage=storage, study_name="r", trials=20)
    assert again.completed == 20
    after = {t.number: (t.params, t.value) for t in again.study.get_trials()}
    assert all(after[n] == kept[n] for n in kept) and interrupted <= set(after)


def _worker(url, run_id, storage, study, trials, log, pause=0.0):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tests.support._tune_worker", url, str(run_id), storage, study,
                             str(trials), str(log), str(pause)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _logged(log: Path) -> list[tuple[int, int, str]]:
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    return [(int(p), int(n), s) for p, n, s in rows]


@pytest.mark.slow
def test_kill_9_loses_no_completed_trial(profile_db, tmp_path):
    import optuna

    url, run_id, _, _ = profile_db
    storage_url, log = f"sqlite:///{tmp_path / 'k.db'}", tmp_path / "log"
    proc = _worker(url, run_id, storage_url, "k", 200, log, pause=0.2)
    deadline = time.time() + 120
    while sum(s == "COMPLETE" for _, _, s in _logged(log)) < 6 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = {n for _, n, s in _logged(log) if s == "COMPLETE"}
    assert len(done) >= 6
    study = optuna.load_study(study_name="k", storage=open_storage(storage_url))
    stored = {t.number for t in study.get_trials() if t.state.name == "COMPLETE"}
    assert done <= stored
    out = run_search(Evaluator(open_database(url), run_id), _space(profile_db), storage=open_storage(storage_url),
                     study_name="k", trials=len(stored) + 5)
    assert out.completed == len(stored) + 5


# A worker killed in the middle of a trial: the trial holds its first parameter and a heartbeat, and the
# process sleeps until it is killed.
_KILLED_MID_TRIAL = """
import sys, time
import optuna
from specdec_tune.tuner.search import open_storage
storage = open_storage(sys.argv[1])
trial = optuna.load_study(study_name=sys.argv[2], storage=storage).ask()
trial.suggest_categorical("drafter", sys.argv[3].split(","))
storage.record_heartbeat(trial._trial_id)
print(trial.number, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_trial_left_running_by_kill_9_is_failed_and_run_again(profile_db, tmp_path):
    """The next run fails the killed worker's trial (its heartbeat went stale) and runs its point again, even
    when it starts right after the kill; no trial stays RUNNING for ever."""
    url, run_id, _, _ = profile_db
    storage_url, space = f"sqlite:///{tmp_path / 'stale.db'}", _space(profile_db)
    run_search(Evaluator(open_database(url), run_id), space, storage=open_storage(storage_url), study_name="s", trials=4)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_MID_TRIAL, storage_url, "s", ",".join(space.drafters)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    killed = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    out = run_search(Evaluator(open_database(url), run_id), space, storage=open_storage(storage_url), study_name="s",
                     trials=6)
    trials = out.study.get_trials()
    assert trials[killed].state.name == "FAIL" and not [t for t in trials if t.state.name == "RUNNING"]
    (again,) = [t for t in trials if t.system_attrs.get("failed_trial") == killed]
    assert again.state.name == "COMPLETE" and again.params["drafter"] == trials[killed].params["drafter"]
    assert out.completed == 6


@pytest.mark.slow
def test_two_workers_on_one_postgresql_study(profile_db, postgres_server, tmp_path):
    import optuna
    import sqlalchemy as sa

    url, run_id, _, _ = profile_db
    name = f"tune_two_{os.getpid()}"
    admin = sa.create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    storage_url = postgres_server.rsplit("/", 1)[0] + f"/{name}"
    open_storage(storage_url)  # create the tables once, before two processes race to
    log = tmp_path / "log"
    workers = [_worker(url, run_id, storage_url, "two", 40, log) for _ in range(2)]
    for w in workers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err.decode()[-2000:]
    study = optuna.load_study(study_name="two", storage=open_storage(storage_url))
    trials = study.get_trials()
    numbers = [t.number for t in trials]
    assert sorted(numbers) == list(range(len(trials)))  # no number twice, none missing
    complete = {t.number for t in trials if t.state.name == "COMPLETE"}
    logged = _logged(log)
    assert len({p for p, _, _ in logged}) == 2  # both workers ran trials
    assert {n for _, n, s in logged if s == "COMPLETE"} == complete  # each stored trial is one worker's, none lost
    assert len(logged) == len({n for _, n, _ in logged})
    assert 40 <= len(complete) <= 41  # the budget is the study's, shared (one may be in flight at the end)


def test_storage_is_kept_apart_from_the_results_database(profile_db, tmp_path):
    url, _, _, root = profile_db
    with pytest.raises(InputError, match="alembic_version"):
        check_storage(url, url)
    with pytest.raises(InputError):
        check_storage(f"sqlite:///{root}/../{root.name}/results.db", url)  # same file, other spelling
    with pytest.raises(StorageError, match="results tables"):
        open_storage(url)
    default = default_storage_url(url)
    assert default.endswith("results-studies.db")
    check_storage(default, url)
    open_storage(default)
    open_database(url)  # both databases still open: neither stamped over the other's alembic_version


def test_unreachable_storage_is_one_line():
    with pytest.raises(StorageError, match="cannot open study storage"):
        open_storage("postgresql+psycopg://nobody@127.0.0.1:1/none")
    with pytest.raises(StorageError):
        open_storage("sqlite:////no/such/dir/x.db")


@pytest.mark.slow
def test_a_study_without_completed_trials_is_refused(profile_db, tmp_path):
    url, run_id, _, _ = profile_db

    class Broken(Evaluator):
        def score(self, c):
            raise InputError("cannot predict")

    with pytest.raises(InputError, match="no completed trial"):
        run_search(Broken(open_database(url), run_id), _space(profile_db), storage=_storage(tmp_path),
                   study_name="empty", trials=3)


def test_a_study_made_for_other_settings_is_not_mixed(profile_db, tmp_path):
    url, run_id, _, _ = profile_db
    storage = _storage(tmp_path)
    run_search(Evaluator(open_database(url), run_id), _space(profile_db), storage=storage, study_name="m", trials=3,
               attrs={"workload": "a"})
    with pytest.raises(InputError, match="other settings"):
        run_search(Evaluator(open_database(url), run_id), _space(profile_db, "vllm"), storage=storage,
                   study_name="m", trials=3, attrs={"workload": "a"})


@pytest.mark.slow
def test_memory_objective_gives_the_pareto_front(profile_db, tmp_path):
    url, run_id, draft, _ = profile_db
    space = _space(profile_db, "vllm")

    def memory(c):  # any second objective that trades against throughput on these tiny random models
        return 50.0 - c.num_speculative_tokens + (5.0 if c.drafter == draft else 0.0)

    out = run_search(Evaluator(open_database(url), run_id, memory=memory), space, storage=_storage(tmp_path),
                     study_name="p", trials=space.size, objectives=("throughput", "memory"))
    points = brute_force(Evaluator(open_database(url), run_id, memory=memory), space)
    front = {s.candidate for s in points if not any(
        o.predicted_tokens_per_s >= s.predicted_tokens_per_s and o.memory_bytes <= s.memory_bytes
        and (o.predicted_tokens_per_s, o.memory_bytes) != (s.predicted_tokens_per_s, s.memory_bytes) for o in points)}
    assert {s.candidate for s in out.pareto} == front and len(front) > 1


@pytest.mark.slow
def test_threshold_kinds_enter_the_space_and_the_search_finds_their_optimum(profile_db, tmp_path):
    """``tune --threshold-kinds``: the space holds cumulative θ > 0 and the adaptive kind's starts (θ <= 0.9,
    constant schedule) and steps; brute force over it finds the model's optimum; a server keeps only
    the kinds it can express (none has cumulative or adaptive)."""
    from dataclasses import replace

    url, run_id, draft, _ = profile_db
    kinds = ("per-token", "cumulative", "adaptive")
    space = replace(server_search_space("any", [draft], 6, True, kinds), thresholds=(0.25, 0.6, 0.95))
    points = list(space.candidates())
    model = [c for c in points if c.drafter == draft]
    assert {c.threshold_kind for c in model} == set(kinds)
    assert all(c.threshold > 0 for c in model if c.threshold_kind == "cumulative")
    adaptive = [c for c in model if c.threshold_kind == "adaptive"]
    assert {c.threshold_step for c in adaptive} == {0.02, 0.05, 0.1} and max(c.threshold for c in adaptive) == 0.6
    assert all(c.schedule == "constant" for c in adaptive) and len(set(points)) == len(points)
    ev = Evaluator(open_database(url), run_id)
    exhaustive = brute_force(ev, space)
    out = run_search(ev, space, storage=_storage(tmp_path), study_name="kinds", trials=space.size)
    assert out.sampler == "bruteforce" and out.ranked[0].candidate == exhaustive[0].candidate
    seen = {Candidate.from_dict(t.user_attrs["candidate"]) for t in out.study.get_trials() if "candidate" in t.user_attrs}
    assert seen == {s.candidate for s in exhaustive}  # the define-by-run search walks exactly the enumerated points
    for server in SERVERS:
        assert server_search_space(server, [draft], 6, True, kinds).threshold_kinds == ("per-token",), server
    with pytest.raises(InputError, match="--threshold-kinds"):
        server_search_space("any", [draft], 6, True, ("per-token", "cumulatve"))
