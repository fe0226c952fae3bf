"""Contract tests of the results database, run against every backend (Optuna-style).

SQLite always runs. PostgreSQL runs when ``$SPECDEC_TEST_POSTGRES_URL`` names a server we may
create databases on, or when ``initdb``/``pg_ctl`` and psycopg are installed, in which case a
throwaway server is started on 127.0.0.1 for the session; otherwise it is skipped with the reason.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from specdec_tune.db import (
    BiasFrontRow,
    DraftRecord,
    TelemetryRow,
    TimingRow,
    TraceRow,
    add_acceptance,
    add_bias_front,
    add_measured_run,
    add_run_draft,
    add_telemetry,
    add_timing_samples,
    add_traces,
    create_run,
    current_revision,
    delete_run,
    finish_run,
    get_or_create_hardware,
    get_or_create_model,
    get_or_create_workload,
    get_run,
    head_revision,
    known_revisions,
    list_measured,
    list_runs,
    load_acceptance,
    load_bias_front,
    load_telemetry,
    load_timings,
    load_traces,
    open_database,
    session_scope,
    upgrade,
)
from specdec_tune.db._migrate import alembic_config
from specdec_tune.db._models import Base
from specdec_tune.core.errors import InputError, NotFoundError, StorageError

# ---------------------------------------------------------------------------------------------
# Backends (the PostgreSQL server fixture, postgres_server, is in conftest.py)

_counter = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def new_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[Callable[[], str]]:
    """A factory of URLs of new, empty databases on the backend under test."""
    created: list[str] = []
    if request.param == "sqlite":
        yield lambda: f"sqlite:///{tmp_path}/db{next(_counter)}.sqlite"
        return
    server = request.getfixturevalue("postgres_server")
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")

    def make() -> str:
        name = f"specdec_test_{os.getpid()}_{next(_counter)}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        created.append(name)
        return sa.make_url(server).set(database=name).render_as_string(hide_password=False)

    yield make
    with admin.connect() as conn:
        for name in created:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin.dispose()


@pytest.fixture
def db(new_url):
    with open_database(new_url()) as database:
        yield database


def _basics(db) -> tuple[int, int, int]:
    hw = get_or_create_hardware(db, {"device": "cpu", "device_name": "Test CPU", "memory_mb": 2048})
    target = get_or_create_model(
        db,
        {
            "name": "zoo/target",
            "num_parameters": 10_000_000_000,
            "num_layers": 4,
            "dtype": "float32",
            "tokenizer_hash": "ab",
        },
    )
    wl = get_or_create_workload(db, {"name": "chat", "content_hash": "c0ffee", "prompt_count": 3})
    return hw, target, wl


# ---------------------------------------------------------------------------------------------
# The contract



OLD_NOW = "2026-01-02 03:04:05"


def _insert_old_rows(url: str, settings_json: str, statements: list[str], tables: tuple[str, ...]) -> None:
    """Rows written by an older schema: one machine, one target, profile run 1 (with ``settings_json``),
    then ``statements``; PostgreSQL's id sequences of ``tables`` are moved past the explicit ids."""
    catalog = [
        "INSERT INTO hardware (id, fingerprint, device, device_name, device_count, extra, "
        f"created_at) VALUES (1, 'f1', 'cpu', 'Old CPU', 1, '{{}}', '{OLD_NOW}')",
        "INSERT INTO models (id, fingerprint, name, extra, created_at) "
        f"VALUES (1, 'm1', 'old/target', '{{}}', '{OLD_NOW}')",
        "INSERT INTO profile_runs (id, target_model_id, hardware_id, settings, status, "
        f"started_at) VALUES (1, 1, 1, '{settings_json}', 'completed', '{OLD_NOW}')",
    ]
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in catalog + statements:
                conn.exec_driver_sql(statement)
        if engine.dialect.name == "postgresql":  # explicit ids leave the sequences behind
            with engine.begin() as conn:
                for table in tables:
                    conn.exec_driver_sql(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), 1)")
    finally:
        engine.dispose()


class TestStorageContract:
    def test_get_or_create_deduplicates_and_distinguishes(self, db):
        hw, target, wl = _basics(db)
        assert _basics(db) == (hw, target, wl)
        # 2048 and 2048.0 are the same machine; a different driver is a different one.
        same = get_or_create_hardware(
            db, {"device": "cpu", "device_name": "Test CPU", "memory_mb": 2048.0}
        )
        other = get_or_create_hardware(
            db,
            {
                "device": "cpu",
                "device_name": "Test CPU",
                "memory_mb": 2048,
                "driver_version": "550",
            },
        )
        assert same == hw and other != hw
        retrained = get_or_create_model(
            db,
            {
                "name": "zoo/target",
                "num_parameters": 10_000_000_000,
                "num_layers": 4,
                "dtype": "float32",
                "tokenizer_hash": "cd",
            },
        )
        assert retrained != target

    def test_run_round_trip(self, db):
        hw, target, wl = _basics(db)
        draft_id = get_or_create_model(db, {"name": "zoo/draft", "num_parameters": 1000})
        run_id = create_run(
            db, target_model_id=target, hardware_id=hw, workload_id=wl,
            drafts=[DraftRecord("zoo/draft", draft_id), "ngram"],
            settings={"n_max": 8, "temperatures": [0.0, 1.0]}, label="nightly",
            specdec_version="9.9.9", git_revision="abc123",
        )  # fmt: skip
        add_run_draft(db, run_id, "ngram")  # already there: no duplicate
        add_run_draft(db, run_id, "zoo/draft2")
        run = get_run(db, run_id)
        assert run.status == "running" and run.finished_at is None and run.duration_s is None
        assert run.target.num_parameters == 10_000_000_000  # needs BIGINT
        assert run.hardware.memory_mb == 2048.0 and run.workload.prompt_count == 3
        assert [d.name for d in run.drafts] == ["zoo/draft", "ngram", "zoo/draft2"]
        assert run.drafts[0].model_id == draft_id and run.drafts[1].model_id is None
        assert run.settings.n_max == 8 and run.settings.model_extra == {"temperatures": [0.0, 1.0]}  # unknown: kept
        assert (run.label, run.specdec_version, run.git_revision) == ("nightly", "9.9.9", "abc123")
        assert run.started_at.tzinfo is not None

        finish_run(db, run_id, "completed", notes="ok")
        run = get_run(db, run_id)
        assert run.status == "completed" and run.notes == "ok" and run.duration_s >= 0
        assert [r.id for r in list_runs(db, status="completed")] == [run_id]
        assert list_runs(db, status="running") == []
        assert [r.id for r in list_runs(db, target="zoo/target")] == [run_id]

    def test_samples_round_trip(self, db):
        hw, target, _ = _basics(db)
        run_id = create_run(db, target_model_id=target, hardware_id=hw, drafts=["d"])
        timings = [
            TimingRow("verify", k=k, batch_size=1, context_len=64, seconds=0.001 * k)
            for k in range(1, 9)
        ] + [TimingRow("draft_step", 1, 1, 64, 2.5e-4, draft="d")]
        assert add_timing_samples(db, run_id, timings) == 9
        add_timing_samples(
            db,
            run_id,
            [
                {
                    "kind": "verify",
                    "k": 1,
                    "batch_size": 1,
                    "context_len": 0,
                    "seconds": 9.0,
                    "warmup": True,
                }
            ],
        )
        assert load_timings(db, run_id) == timings
        assert len(load_timings(db, run_id, include_warmup=True)) == 10
        assert load_timings(db, run_id, kind="draft_step") == timings[-1:]

        traces = [
            TraceRow(i, (0.9, 0.5, 0.1), num_accepted=i % 4, prompt_index=0) for i in range(7)
        ]
        assert add_traces(db, run_id, "d", "greedy", 0.0, traces) == 7
        add_traces(db, run_id, "d", "sampling", 1.0, traces[:2])
        assert load_traces(db, run_id, "d", "greedy") == traces
        assert len(load_traces(db, run_id, "d", "sampling", temperature=1.0)) == 2

        acc_id = add_acceptance(
            db, run_id, draft="d", mode="greedy", temperature=0.0, num_speculative=3, cycles=7,
            position_attempts=[7, 5, 3], position_accepts=[5, 3, 0], alpha=[5 / 7, 0.6, math.nan],
            beta=[5 / 7, 3 / 7, 0.0], confidence_bins={"edges": [0, 0.5, 1], "accepted": [1, 4]},
            teacher_forced_tokens=100, greedy_agreement=0.71, one_minus_tv=0.64,
            in_loop={"verify_s": {"2": 0.01}}, continuations=[(0, 3, 0.5, True)], tv_temperature=1.0,
        )  # fmt: skip
        (acc,) = load_acceptance(db, run_id, mode="greedy")
        assert (acc.in_loop, acc.continuations, acc.tv_temperature) == ({"verify_s": {"2": 0.01}}, ((0, 3, 0.5, True),), 1.0)
        assert acc.id == acc_id and acc.position_attempts == (7, 5, 3)
        assert acc.alpha[:2] == pytest.approx((5 / 7, 0.6)) and acc.alpha[2] is None  # NaN -> null
        assert acc.confidence_bins["accepted"] == [1, 4] and acc.one_minus_tv == 0.64
        assert load_acceptance(db, run_id, draft="other") == []

        mid = add_measured_run(
            db,
            run_id,
            draft="d",
            config={"N": 3, "threshold": 0.3},
            measured_tokens_per_s=100.0,
            predicted_tokens_per_s=110.0,
            measured_tau=2.0,
            seconds=1.5,
            new_tokens=150,
        )
        add_measured_run(
            db,
            run_id,
            draft=None,
            config={"N": 0},
            measured_tokens_per_s=50.0,
            seconds=3.0,
            new_tokens=150,
        )
        measured = list_measured(db, run_id)
        assert [x.id for x in measured][0] == mid and measured[1].draft is None
        assert (
            measured[0].relative_error == pytest.approx(0.1) and measured[1].relative_error is None
        )
        assert measured[0].config == {"N": 3, "threshold": 0.3}

        tele = [TelemetryRow(t=0.5 * i, power_w=100.0 + i, energy_j=10.0 * i) for i in range(4)]
        assert add_telemetry(db, run_id, reversed(tele)) == 4
        assert load_telemetry(db, run_id) == tele

    def test_bulk_insert_many_rows(self, db):
        hw, target, _ = _basics(db)
        run_id = create_run(db, target_model_id=target, hardware_id=hw)
        rows = [TimingRow("verify", 1 + i % 8, 1, i, 1e-3) for i in range(12_000)]  # > one chunk
        assert add_timing_samples(db, run_id, rows) == 12_000
        assert len(load_timings(db, run_id)) == 12_000

    def test_interrupted_run_keeps_committed_batches(self, db):
        hw, target, _ = _basics(db)
        run_id = create_run(db, target_model_id=target, hardware_id=hw)
        add_timing_samples(db, run_id, [TimingRow("verify", 2, 1, 10, 0.01)])
        with pytest.raises(InputError, match="timing kind 'bogus'"):
            # A bad row anywhere in a batch stores none of that batch.
            add_timing_samples(
                db,
                run_id,
                [TimingRow("verify", 2, 1, 11, 0.01), TimingRow("bogus", 2, 1, 12, 0.01)],
            )
        finish_run(db, run_id, "interrupted")
        assert get_run(db, run_id).status == "interrupted"
        assert [r.context_len for r in load_timings(db, run_id)] == [10]

    def test_session_scope_rolls_back_and_raises_storage_error(self, db):
        hw, target, _ = _basics(db)
        with pytest.raises(StorageError, match="database error in"):
            with session_scope(db) as s:
                s.execute(sa.text("UPDATE hardware SET device = 'gpu'"))
                s.execute(sa.text("SELECT * FROM no_such_table"))
        with pytest.raises(KeyError):
            with session_scope(db) as s:
                s.execute(sa.text("UPDATE hardware SET device = 'gpu'"))
                raise KeyError("boom")
        with session_scope(db) as s:
            assert s.execute(sa.text("SELECT device FROM hardware")).scalar_one() == "cpu"

    def test_missing_run_and_bad_values(self, db):
        hw, target, _ = _basics(db)
        with pytest.raises(
            NotFoundError, match=re.escape(f"no profile run with id 4242 in {db.display_url}")
        ):
            get_run(db, 4242)
        for call in (
            lambda: load_timings(db, 4242),
            lambda: finish_run(db, 4242),
            lambda: add_timing_samples(db, 4242, [TimingRow("verify", 1, 1, 1, 0.1)]),
        ):
            with pytest.raises(NotFoundError, match="4242"):
                call()
        run_id = create_run(db, target_model_id=target, hardware_id=hw)
        with pytest.raises(InputError, match="'done'"):
            finish_run(db, run_id, "done")
        with pytest.raises(InputError, match="devcie"):
            get_or_create_hardware(db, {"devcie": "cpu", "device_name": "x"})
        with pytest.raises(InputError, match="num_accepted=4"):
            add_traces(db, run_id, "d", "greedy", 0.0, [TraceRow(0, (0.5, 0.5), 4)])
        with pytest.raises(InputError, match="seconds"):
            add_timing_samples(db, run_id, [TimingRow("verify", 1, 1, 1, math.inf)])
        with pytest.raises(InputError, match="one length"):
            add_acceptance(
                db,
                run_id,
                draft="d",
                mode="greedy",
                temperature=0,
                num_speculative=2,
                cycles=1,
                position_attempts=[1],
                position_accepts=[1, 0],
                alpha=[1],
                beta=[1],
            )

    def test_delete_run_removes_its_rows_only(self, db):
        hw, target, _ = _basics(db)
        keep, drop = (
            create_run(db, target_model_id=target, hardware_id=hw, drafts=["d"]) for _ in range(2)
        )
        for run_id in (keep, drop):
            add_timing_samples(db, run_id, [TimingRow("verify", 1, 1, 1, 0.1)])
            add_traces(db, run_id, "d", "greedy", 0.0, [TraceRow(0, (0.9,), 1)])
            add_telemetry(db, run_id, [TelemetryRow(0.0, 50.0)])
        delete_run(db, drop)
        with pytest.raises(NotFoundError):
            get_run(db, drop)
        assert len(load_timings(db, keep)) == 1 and len(load_traces(db, keep, "d", "greedy")) == 1
        with session_scope(db) as s:
            assert s.execute(sa.text("SELECT COUNT(*) FROM timing_samples")).scalar_one() == 1
            assert s.execute(sa.text("SELECT COUNT(*) FROM run_drafts")).scalar_one() == 1

    # -- migrations ------------------------------------------------------------------------

    def test_migrate_empty_to_head_and_schema_matches_models(self, new_url):
        url = new_url()
        assert current_revision(url) is None
        assert upgrade(url) == (None, head_revision())
        assert upgrade(url) == (head_revision(), head_revision())  # idempotent
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        finally:
            engine.dispose()
        assert diff == [], f"ORM models and migrations disagree: {diff}"

    def test_migrate_previous_revision_keeps_data(self, new_url):
        url = new_url()
        revisions = known_revisions()
        assert len(revisions) >= 3 and revisions[-1] == head_revision()
        previous = "0001"  # the oldest schema: every later revision must keep its rows
        assert upgrade(url, previous) == (None, previous)
        _insert_old_rows(url, '{"n_max": 4}', [
            "INSERT INTO run_drafts (id, run_id, name, role) VALUES (1, 1, 'ngram', 'draft')",
            "INSERT INTO timing_samples (run_id, draft, kind, k, batch_size, context_len, seconds, "
            "warmup) VALUES (1, NULL, 'verify', 5, 1, 32, 0.0125, false)",
            "INSERT INTO acceptance_traces (run_id, draft, mode, temperature, cycle_index, "
            "confidences, num_accepted) VALUES (1, 'ngram', 'greedy', 0.0, 0, '[1.0, 1.0]', 1)",
        ], ("hardware", "models", "profile_runs", "run_drafts"))

        with open_database(url) as db:  # migrates on first use
            assert current_revision(url) == head_revision()
            run = get_run(db, 1)
            assert run.status == "completed" and run.settings.n_max == 4
            assert run.specdec_version is None and run.git_revision is None  # columns new in 0002
            assert [d.name for d in run.drafts] == ["ngram"]
            assert load_timings(db, 1) == [TimingRow("verify", 5, 1, 32, 0.0125)]
            assert load_traces(db, 1, "ngram", "greedy") == [TraceRow(0, (1.0, 1.0), 1)]
            add_telemetry(db, 1, [TelemetryRow(0.0, power_w=70.0)])  # table new in 0002
            assert load_telemetry(db, 1)[0].power_w == 70.0
            new_run = create_run(db, target_model_id=1, hardware_id=1)
            assert new_run == 2 and get_run(db, new_run).specdec_version is not None

    def test_migrate_0002_to_0003_keeps_measured_runs(self, new_url):
        url = new_url()
        upgrade(url, "0002")
        _insert_old_rows(url, "{}", [
            "INSERT INTO measured_runs (run_id, draft, config, measured_tokens_per_s, "
            "predicted_tokens_per_s, seconds, new_tokens, created_at) VALUES "
            f"(1, 'ngram', '{{\"N\": 3}}', 80.0, 84.0, 2.0, 160, '{OLD_NOW}')",
        ], ("hardware", "models", "profile_runs"))
        assert upgrade(url, "0003") == ("0002", "0003")
        with open_database(url) as db:
            (old,) = list_measured(db, 1)
            assert (old.draft, old.config, old.measured_tokens_per_s) == ("ngram", {"N": 3}, 80.0)
            assert old.ci95 is None and old.samples is None and old.prediction_inside_ci is None
            samples = {"prompt_ids": ["a"], "tokens": [[8, 8]], "seconds": [[0.1, 0.1]]}
            new_id = add_measured_run(
                db, 1, draft=None, config={}, measured_tokens_per_s=80.0, seconds=0.2,
                new_tokens=16, predicted_tokens_per_s=81.0, ci=(79.0, 82.0), samples=samples,
            )  # fmt: skip
            new = list_measured(db, 1)[-1]
            assert new.id == new_id and new.ci95 == (79.0, 82.0) and new.samples == samples
            assert new.prediction_inside_ci is True
            with pytest.raises(InputError, match="ci_low"):
                add_measured_run(
                    db, 1, draft=None, config={}, measured_tokens_per_s=1.0, seconds=1.0,
                    new_tokens=1, ci=(2.0, 1.0),
                )  # fmt: skip

    def test_migrate_0004_to_0005_keeps_traces_and_downgrades(self, new_url):
        """0005 adds the traces' token and target probabilities (NULL for old rows) and the lossy front and
        teacher-forced tables; its downgrade removes them and keeps the traces."""
        url = new_url()
        upgrade(url, "0004")
        _insert_old_rows(url, "{}", [
            "INSERT INTO acceptance_traces (run_id, draft, mode, temperature, cycle_index, confidences, "
            "num_accepted) VALUES (1, 'd', 'sampling', 1.0, 0, '[0.9, 0.4]', 1)",
        ], ("hardware", "models", "profile_runs", "acceptance_traces"))
        assert upgrade(url, "0005") == ("0004", "0005")
        with open_database(url) as db:
            (old,) = load_traces(db, 1, "d", "sampling")
            assert old.confidences == (0.9, 0.4) and old.token_probs is None and old.target_probs is None
            add_traces(db, 1, "d", "sampling", 1.0, [TraceRow(1, (0.5,), 0, 0, (0.3,), (0.2,))])
            assert load_traces(db, 1, "d", "sampling")[-1].target_probs == (0.2,)
            add_bias_front(db, 1, [BiasFrontRow("opt", 0.01, "theory", 0.1, 0.05, 10, 0.05, "d")])
            assert load_bias_front(db, 1)[0].bias == 0.05
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                command.downgrade(alembic_config(conn), "0004")
            tables = set(sa.inspect(engine).get_table_names())
        finally:
            engine.dispose()
        assert "bias_front" not in tables and "teacher_forced_positions" not in tables and "acceptance_traces" in tables

    def test_migrate_0007_to_0008_adds_leases_and_downgrades(self, new_url):
        """0008 adds ``leases`` (which process works on a study) and keeps every run; its downgrade drops it."""
        import datetime as dt

        from specdec_tune.db import LeaseRecord, get_lease, insert_lease, lease_key

        url = new_url()
        upgrade(url, "0007")
        _insert_old_rows(url, '{"n_max": 4}', [], ("hardware", "models", "profile_runs"))
        assert upgrade(url, "0008") == ("0007", "0008")
        now = dt.datetime.now(dt.timezone.utc)
        lease = LeaseRecord(lease_key("study 's'"), "study 's'", "t", "tune", 1, "h", None, now, now)
        with open_database(url) as db:
            assert get_run(db, 1).settings.n_max == 4
            assert insert_lease(db, lease) and not insert_lease(db, lease)
            assert get_lease(db, lease.key) == lease
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                command.downgrade(alembic_config(conn), "0007")
            tables = set(sa.inspect(engine).get_table_names())
        finally:
            engine.dispose()
        assert "leases" not in tables and "profile_runs" in tables

    def test_migrate_0008_to_0009_moves_calibration_out_of_confidence_bins(self, new_url):
        """Rows as the profiler stored them before 0009 (shapes from a committed fidelity run's database:
        the in-loop times under their older key names, the continuations, the TV temperature, all inside
        ``confidence_bins``) read through the typed record after the upgrade; the downgrade puts them back."""
        import json

        histogram = {"edges": [0.0, 0.5, 1.0], "drafted": [351, 193], "accepted": [273, 139]}
        in_loop = {"verify_s": {"2": 0.0031140840001171455, "3": 0.0033427560001655365}, "verify_n": {"2": 221, "3": 8},
                   "draft_first_s": 0.0003845435003313469, "draft_rest_s": 0.00024190099975385237,
                   "target_prefill_s": [0.03299033399889595], "draft_prefill_s": [0.002518346000215388]}
        continuations = [[0, 16, 0.19938363134860992, True], [2, 2, 0.06694160401821136, True]]
        old_bins = {  # id -> confidence_bins: a model draft's greedy and sampling rows, an n-gram's greedy row
            1: {**histogram, "tv_temperature": 1.0, "in_loop": in_loop, "continuations": continuations},
            2: {**histogram, "tv_temperature": 1.0},
            3: {**histogram, "tv_temperature": None, "in_loop": in_loop},
        }
        rows = [(1, "d", "greedy", 0.0), (2, "d", "sampling", 1.0), (3, "ngram", "greedy", 0.0)]
        url = new_url()
        upgrade(url, "0008")
        _insert_old_rows(url, '{"n_max": 2, "max_new_tokens": 48, "ks": [1, 2, 3]}', [
            "INSERT INTO acceptance (id, run_id, draft, mode, temperature, num_speculative, cycles, position_attempts, "
            "position_accepts, alpha, beta, confidence_bins, one_minus_tv, created_at) VALUES "
            f"({i}, 1, '{draft}', '{mode}', {t}, 2, 3, '[3, 2]', '[2, 1]', '[0.6, 0.5]', '[0.6, 0.3]', "
            f"'{json.dumps(old_bins[i])}', 0.7, '{OLD_NOW}')" for i, draft, mode, t in rows
        ], ("hardware", "models", "profile_runs", "acceptance"))
        assert upgrade(url, "0009") == ("0008", "0009")
        with open_database(url) as db:
            settings = get_run(db, 1).settings
            assert (settings.n_max, settings.max_new_tokens, settings.forward) == (2, 48, "hf")  # hf: not stored
            greedy, sampling, ngram = load_acceptance(db, 1)
            assert greedy.confidence_bins == sampling.confidence_bins == ngram.confidence_bins == histogram
            assert greedy.in_loop == ngram.in_loop == in_loop and sampling.in_loop is None
            assert greedy.continuations == tuple(tuple(c) for c in continuations)
            assert sampling.continuations is None and ngram.continuations is None
            assert (greedy.tv_temperature, sampling.tv_temperature, ngram.tv_temperature) == (1.0, 1.0, None)
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                command.downgrade(alembic_config(conn), "0008")
            with engine.connect() as conn:
                stored = dict(conn.execute(sa.text("SELECT id, confidence_bins FROM acceptance")).all())
            columns = {c["name"] for c in sa.inspect(engine).get_columns("acceptance")}
        finally:
            engine.dispose()
        assert {i: json.loads(v) if isinstance(v, str) else v for i, v in stored.items()} == old_bins
        assert not columns & {"in_loop", "continuations", "tv_temperature"}

    def test_failed_migration_changes_nothing(self, new_url):
        url = new_url()
        # Pinned: revision 0002 creates telemetry after its ALTERs, which this test blocks.
        previous = "0001"
        upgrade(url, previous)
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                # A table in the way of the next revision's CREATE TABLE, after its ALTERs.
                conn.exec_driver_sql("CREATE TABLE telemetry (x INTEGER)")
            with pytest.raises(StorageError, match="telemetry"):
                open_database(url)
            assert current_revision(url) == previous
            columns = {c["name"] for c in sa.inspect(engine).get_columns("profile_runs")}
            assert "git_revision" not in columns  # the revision's ALTER was rolled back too
        finally:
            engine.dispose()

    def test_database_from_newer_version_is_refused(self, new_url):
        url = new_url()
        upgrade(url)
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
        finally:
            engine.dispose()
        with pytest.raises(StorageError, match="revision '9999'.*newer specdec-tune"):
            open_database(url)
