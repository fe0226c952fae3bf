"""A process of tests/tuner/search/test_lease.py's insert race: open the database, wait at the barrier, insert one
lease (kept apart from the test module so that a spawned process imports no more than the database)."""
from __future__ import annotations

import datetime as dt


def insert_at_barrier(url: str, subject: str, token: str, barrier, results) -> None:
    from specdec_tune.db import LeaseRecord, insert_lease, lease_key, open_database

    db = open_database(url)
    now = dt.datetime.now(dt.timezone.utc)
    lease = LeaseRecord(lease_key(subject), subject, token, "tune", 1, "elsewhere", None, now, now)
    barrier.wait()  # every process inserts at once
    results.put((token, insert_lease(db, lease)))
