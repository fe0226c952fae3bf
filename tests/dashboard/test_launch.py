"""`specdec-tune dashboard`: bad input is one line and exit 2; an older database is migrated and served;
Ctrl-C stops the server and its Streamlit child."""
from __future__ import annotations

import socket
import urllib.request

import pytest
import sqlalchemy as sa

from specdec_tune.cli import main
from specdec_tune.dashboard.launch import check_port, url_for
from specdec_tune.db import current_revision, get_run, head_revision, known_revisions, open_database, upgrade
from specdec_tune.core.errors import InputError
from tests.support.dashboard_data import RunningDashboard, free_port


def one_line_error(capsys, args: list[str]) -> str:
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_bad_database_urls(capsys, tmp_path):
    assert "not a database URL" in one_line_error(capsys, ["dashboard", "--db", "nonsense", "--port", str(free_port())])
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    line = one_line_error(capsys, ["dashboard", "--db", f"sqlite:///{text}", "--port", str(free_port())])
    assert "not a SQLite database" in line and text.read_text() == "my notes\n"  # left untouched
    line = one_line_error(capsys, ["dashboard", "--db", f"sqlite:///{tmp_path}/no/such/dir.db", "--port",
                                   str(free_port())])
    assert "does not exist" in line


def test_bad_storage(capsys, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("x")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    line = one_line_error(capsys, ["dashboard", "--db", db, "--storage", f"sqlite:///{text}", "--port", str(free_port())])
    assert "study storage" in line and "not a SQLite database" in line
    assert "study storage" in one_line_error(capsys, ["dashboard", "--db", db, "--storage", "::bad::",
                                                      "--port", str(free_port())])


def test_port_in_use_and_bad_host(capsys, tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_line_error(capsys, ["dashboard", "--db", db, "--port", str(port)])
        assert f"127.0.0.1:{port}" in line and "in use" in line
    assert "not a TCP port" in one_line_error(capsys, ["dashboard", "--db", db, "--port", "70000"])
    assert "cannot be resolved" in one_line_error(capsys, ["dashboard", "--db", db, "--host", "bad..host"])


def test_check_port_power():
    """The check refuses a port something listens on, and accepts it once that is closed."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    with pytest.raises(InputError, match="in use"):
        check_port("127.0.0.1", port)
    sock.close()
    check_port("127.0.0.1", port)
    assert url_for("0.0.0.0", 8501) == "http://127.0.0.1:8501" and url_for("::", 1) == "http://[::1]:1"


def _old_database(url: str) -> None:
    """A database at the first schema revision holding one run (as an older specdec-tune wrote it)."""
    upgrade(url, known_revisions()[0])
    engine = sa.create_engine(url)
    now = "2026-01-02 03:04:05"
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO hardware (id, fingerprint, device, device_name, device_count, extra, "
                             f"created_at) VALUES (1, 'f1', 'cpu', 'Old CPU', 1, '{{}}', '{now}')")
        conn.exec_driver_sql(f"INSERT INTO models (id, fingerprint, name, extra, created_at) VALUES (1, 'm1', "
                             f"'old/target', '{{}}', '{now}')")
        conn.exec_driver_sql("INSERT INTO profile_runs (id, target_model_id, hardware_id, settings, status, "
                             f"started_at) VALUES (1, 1, 1, '{{\"n_max\": 4}}', 'completed', '{now}')")
    engine.dispose()


@pytest.mark.slow
def test_older_schema_is_migrated_served_and_stopped_by_ctrl_c(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    _old_database(url)
    assert current_revision(url) == known_revisions()[0] != head_revision()
    board = RunningDashboard(url)
    try:
        assert board.first_line.startswith(f"dashboard: {board.url}") and "Ctrl-C" in board.first_line
        with urllib.request.urlopen(board.url + "/_stcore/health", timeout=10) as resp:
            assert resp.status == 200
        assert current_revision(url) == head_revision()  # migrated, not wiped
        with open_database(url) as db:
            assert get_run(db, 1).target.name == "old/target"
    finally:
        out, err = board.stop()
    assert board.proc.returncode == 0, (out, err)
    assert "dashboard stopped" in out
    check_port("127.0.0.1", board.port)  # the Streamlit child let go of the port: nothing left behind
