"""Revision 0004 (regression tables) and the db regression readers the dashboard's trend page uses."""
from __future__ import annotations

import sqlalchemy as sa

from specdec_tune.db import open_database, upgrade
from specdec_tune.db import _regress as q
from specdec_tune.db._migrate import alembic_config


def test_0004_upgrades_from_0003_and_downgrades_cleanly(tmp_path):
    from alembic import command

    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert upgrade(url, "0003") == (None, "0003")
    assert upgrade(url, "0004") == ("0003", "0004")
    tables = set(sa.inspect(sa.create_engine(url)).get_table_names())
    assert {"regress_runs", "regress_benchmarks", "regress_cells", "regress_calibration"} <= tables
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        cfg = alembic_config(conn)
        command.downgrade(cfg, "0003")
    tables = set(sa.inspect(sa.create_engine(url)).get_table_names())
    assert not any(t.startswith("regress_") for t in tables) and "measured_runs" in tables


def test_runs_cells_and_trend_round_trip(tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    ids = []
    for value, verdict in ((100.0, "baseline"), (90.0, "suspicious"), (80.0, "regression")):
        run = q.create_regress_run(db, "s", fingerprint={"threads": 1})
        q.add_regress_benchmark(db, run, "b", {"draft": "d"}, [{"prompt_id": "p", "seconds": [0.1]}])
        q.add_regress_cells(db, [q.RegressCellRecord("b", "tokens_per_s", verdict, 100.0, value, value / 100, run_id=run,
                                                     p_value=float("nan") if verdict == "baseline" else 0.001)])
        q.finish_regress_run(db, run, status="completed", verdict=verdict, exit_code=0)
        ids.append(run)
    other = q.create_regress_run(db, "s", kind="calibration", fingerprint={})
    q.finish_regress_run(db, other, status="completed", verdict="calibration", exit_code=0)
    assert [r.id for r in q.list_regress_runs(db, "s")] == ids[::-1]
    assert [r.id for r in q.list_regress_runs(db, "s", before=ids[2])] == ids[1::-1]
    trend = q.metric_trend(db, "s", "b", "tokens_per_s")
    assert [c.current_value for _, c in trend] == [100.0, 90.0, 80.0]
    assert trend[0][1].p_value is None  # NaN is stored as null
    assert q.load_regress_benchmarks(db, ids[0])[0].samples == [{"prompt_id": "p", "seconds": [0.1]}]
