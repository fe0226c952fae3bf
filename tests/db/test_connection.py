"""Bad database input (URLs, files, permissions), URL resolution, the `db` CLI and concurrency.

SQLite only: these are about files and processes on this machine.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from specdec_tune.cli import main
from specdec_tune.db import (
    TimingRow,
    add_timing_samples,
    create_run,
    current_revision,
    get_or_create_hardware,
    get_or_create_model,
    get_run,
    head_revision,
    known_revisions,
    load_timings,
    mask_url,
    open_database,
    resolve_url,
    upgrade,
)
from specdec_tune.db import _connection as connection_mod
from specdec_tune.core.errors import StorageError


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _seed_db(db) -> int:
    hw = get_or_create_hardware(db, {"device": "cpu", "device_name": "x"})
    model = get_or_create_model(db, {"name": "m"})
    run_id = create_run(db, target_model_id=model, hardware_id=hw)
    add_timing_samples(db, run_id, [TimingRow("verify", 3, 1, 7, 0.25)])
    return run_id


def _seed(url: str) -> int:
    """A database with one run and one timing sample; returns the run id."""
    with open_database(url) as db:
        return _seed_db(db)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, f"expected one error line, got: {err!r}"
    assert err.startswith("error: ")
    return err


# -- URL resolution --------------------------------------------------------------------------


def test_resolve_url_precedence(monkeypatch):
    monkeypatch.delenv("SPECDEC_DB", raising=False)
    assert resolve_url(None) == "sqlite:///specdec.db"
    monkeypatch.setenv("SPECDEC_DB", "sqlite:///from-env.db")
    assert resolve_url(None) == "sqlite:///from-env.db"
    assert resolve_url("sqlite:///from-arg.db") == "sqlite:///from-arg.db"


def test_mask_url_hides_passwords_only():
    assert (
        mask_url("postgresql+psycopg://me:s3cret@db:5432/x")
        == "postgresql+psycopg://me:***@db:5432/x"
    )
    assert "s3cret" not in mask_url("not a url://me:s3cret@host")
    assert (
        mask_url("sqlite:///file:a.db?mode=ro&uri=true") == "sqlite:///file:a.db?mode=ro&uri=true"
    )


def test_default_database_is_created_in_current_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECDEC_DB", raising=False)
    assert main(["db", "upgrade"]) == 0
    assert (tmp_path / "specdec.db").exists()
    with sqlite3.connect(tmp_path / "specdec.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_connections_set_pragmas(tmp_path):
    with open_database(f"sqlite:///{tmp_path}/p.db") as db, db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000


def test_in_memory_database_works(tmp_path):
    with open_database("sqlite://") as db:
        run_id = _seed_db(db)
        assert load_timings(db, run_id) == [TimingRow("verify", 3, 1, 7, 0.25)]
    assert list(tmp_path.iterdir()) == []


# -- bad input: one line, exit 2, nothing lost ------------------------------------------------


def test_file_that_is_not_a_database_is_refused_and_untouched(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("my precious notes\n" * 100)
    before = _digest(path)
    with pytest.raises(StorageError, match="is not a SQLite database"):
        open_database(f"sqlite:///{path}")
    assert main(["db", "upgrade", "--db", f"sqlite:///{path}"]) == 2
    assert str(path) in _error_line(capsys)
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no -wal/-shm created


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("foo://bar", "unknown database dialect 'foo'"),
        ("definitely not a url", "not a database URL"),
        ("results.db", "not a database URL (for a file: sqlite:///results.db)"),
        ("sqlite:////no/such/dir/x.db", "directory /no/such/dir does not exist"),
        (
            "postgresql+psycopg://me:s3cret@127.0.0.1:1/x",
            "postgresql+psycopg://me:***@127.0.0.1:1/x",
        ),
    ],
)
def test_unopenable_urls(url, expected, capsys):
    assert main(["db", "current", "--db", url]) == 2
    line = _error_line(capsys)
    assert expected in line and "s3cret" not in line
    if "://" in url and not url.startswith("postgres"):
        assert "valid: sqlite:///" in line or "create it" in line


def test_directory_instead_of_file(tmp_path, capsys):
    assert main(["db", "upgrade", "--db", f"sqlite:///{tmp_path}"]) == 2
    assert "is a directory" in _error_line(capsys)


def test_read_only_sqlite_uri_refuses_writes_and_keeps_data(tmp_path, capsys):
    path = tmp_path / "r.db"
    url = f"sqlite:///{path}"
    upgrade(url, known_revisions()[0])  # an old schema that needs migrating
    before = _digest(path)
    ro_url = f"sqlite:///file:{path}?mode=ro&uri=true"
    assert main(["db", "upgrade", "--db", ro_url]) == 2
    line = _error_line(capsys)
    assert "readonly" in line and ro_url in line
    assert _digest(path) == before and current_revision(url) == known_revisions()[0]
    # At head, a read-only URI can read, and writing fails with one StorageError.
    run_id = _seed(url)
    with open_database(ro_url) as db:
        assert get_run(db, run_id).id == run_id
        with pytest.raises(StorageError, match="readonly"):
            add_timing_samples(db, run_id, [TimingRow("verify", 1, 1, 1, 0.1)])
    with open_database(url) as db:
        assert len(load_timings(db, run_id)) == 1


def test_read_only_file_and_directory_permissions(world_dir, cli_as_unprivileged):
    """Permission bits as the user meets them (as root too: ``cli_as_unprivileged`` drops to an
    unprivileged user there, since root ignores them): one line each, the data intact."""
    url = f"sqlite:///{world_dir}/ro.db"
    run_id = _seed(url)
    before = _digest(world_dir / "ro.db")
    (world_dir / "ro.db").chmod(0o444)
    code, err = cli_as_unprivileged(["db", "upgrade", "--db", url])
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert "ro.db is read-only" in err
    world_dir.chmod(0o555)
    code, err = cli_as_unprivileged(["db", "upgrade", "--db", f"sqlite:///{world_dir}/new.db"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert f"directory {world_dir} is read-only" in err and not (world_dir / "new.db").exists()
    world_dir.chmod(0o755)
    assert _digest(world_dir / "ro.db") == before
    with open_database(url) as db:
        assert get_run(db, run_id).id == run_id


def test_read_only_checks_use_os_access(tmp_path, monkeypatch):
    # Runs also as root (where chmod cannot make a file read-only): it checks the messages.
    path = tmp_path / "ro.db"
    _seed(f"sqlite:///{path}")
    monkeypatch.setattr(connection_mod.os, "access", lambda p, mode: Path(p) != path)
    with pytest.raises(
        StorageError, match=rf"{path} is read-only; specdec-tune needs write access"
    ):
        open_database(f"sqlite:///{path}")
    monkeypatch.setattr(connection_mod.os, "access", lambda p, mode: Path(p) != tmp_path)
    with pytest.raises(StorageError, match=rf"directory {tmp_path} is read-only"):
        open_database(f"sqlite:///{path}")


def test_corrupt_database_reports_storage_error(tmp_path, capsys):
    path = tmp_path / "c.db"
    _seed(f"sqlite:///{path}")
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # keep the header, destroy the first page
    path.write_bytes(bytes(data))
    assert main(["db", "current", "--db", f"sqlite:///{path}"]) == 2
    line = _error_line(capsys)
    assert str(path) in line and "restore a backup or give another path" in line


# -- the CLI ----------------------------------------------------------------------------------


def test_cli_upgrade_and_current(tmp_path, capsys, monkeypatch):
    url = f"sqlite:///{tmp_path}/cli.db"
    assert main(["db", "current", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "none (empty database)" in out and not (tmp_path / "cli.db").exists()
    upgrade(url, known_revisions()[0])
    assert main(["db", "upgrade", "--db", url]) == 0
    out = capsys.readouterr().out
    assert f"revision before: {known_revisions()[0]}" in out
    assert f"revision after:  {head_revision()} (upgraded)" in out
    monkeypatch.setenv("SPECDEC_DB", url)
    assert main(["db", "current", "--json"]) == 0
    assert f'"current": "{head_revision()}"' in capsys.readouterr().out
    assert main(["db", "upgrade", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "url": url,
        "before": head_revision(),
        "after": head_revision(),
        "head": head_revision(),
    }


def test_other_applications_sqlite_database_is_left_alone(tmp_path, capsys):
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.close()
    assert main(["db", "upgrade", "--db", f"sqlite:///{path}"]) == 2
    assert "tables that specdec-tune did not create (customers)" in _error_line(capsys)
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert tables == ["customers"]
    conn.close()


# -- concurrency ------------------------------------------------------------------------------


def test_concurrent_first_use_and_writers(tmp_path):
    url = f"sqlite:///{tmp_path}/busy.db"
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def worker() -> None:
        try:
            barrier.wait()
            with open_database(url) as db:  # all three race to create the schema
                hw = get_or_create_hardware(db, {"device": "cpu", "device_name": "x"})
                model = get_or_create_model(db, {"name": "m"})
                run_id = create_run(db, target_model_id=model, hardware_id=hw)
                for i in range(15):
                    add_timing_samples(db, run_id, [TimingRow("verify", 1, 1, i, 1e-3)] * 20)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM alembic_version").scalar() == 1
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM hardware").scalar() == 1
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM timing_samples").scalar() == 3 * 15 * 20
    engine.dispose()
