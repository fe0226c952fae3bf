"""Leases (``leases``): which process is working on a shared thing now, stored where every process that
shares the results database sees it.

The helpers are compare-and-swap steps; deciding when a holder is dead (and so may be replaced) is the
caller's. The key is the primary key, so of two processes inserting one key at once exactly one
succeeds (SQLite serialises the writers with ``BEGIN IMMEDIATE``; PostgreSQL refuses the second
insert). Renewing, releasing and taking over match the holding's ``token``, so a process whose lease
was taken over cannot renew or release the new holder's.
"""
from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from specdec_tune.db import _models as m
from specdec_tune.db._connection import Database
from specdec_tune.db._records import record_from
from specdec_tune.db._session import session_scope


@dataclass(frozen=True)
class LeaseRecord:
    """One holding of a lease.

    Attributes:
        key: :func:`lease_key` of ``subject``.
        subject: what is held, in words (for messages).
        token: this holding's id (random): renew, release and take-over match it.
        command: what the holder is doing (``tune``).
        pid, host: the holding process.
        pid_scope: where ``pid`` names that process (boot and pid namespace), or None when unknown.
        acquired_at, heartbeat_at: aware UTC times; the holder renews ``heartbeat_at`` while it works.
    """

    key: str
    subject: str
    token: str
    command: str
    pid: int
    host: str
    pid_scope: str | None
    acquired_at: dt.datetime
    heartbeat_at: dt.datetime


def lease_key(subject: str) -> str:
    """The key of ``subject``: fixed length, whatever the subject's (paths and study names can be long)."""
    return hashlib.sha256(subject.encode()).hexdigest()


def insert_lease(db: Database, lease: LeaseRecord) -> bool:
    """Store ``lease`` unless its key is held: True when stored (this process holds it now)."""
    with session_scope(db, write=True) as s:
        if s.get(m.Lease, lease.key) is not None:
            return False
        try:
            with s.begin_nested():  # PostgreSQL: another process may insert the same key concurrently
                s.add(m.Lease(**vars(lease)))
        except IntegrityError:
            return False
        return True


def get_lease(db: Database, key: str) -> LeaseRecord | None:
    """The current holding of ``key``, or None."""
    with session_scope(db) as s:
        row = s.scalar(select(m.Lease).where(m.Lease.key == key))
        return None if row is None else record_from(LeaseRecord, row)


def take_over_lease(db: Database, old_token: str, lease: LeaseRecord) -> bool:
    """Replace the holding ``old_token`` of ``lease.key`` by ``lease``: True when it still was that holding
    (of two processes taking over one dead holder's lease, one succeeds)."""
    values = {k: v for k, v in vars(lease).items() if k != "key"}
    with session_scope(db, write=True) as s:
        done = s.execute(update(m.Lease).where(m.Lease.key == lease.key, m.Lease.token == old_token).values(**values))
        return done.rowcount == 1


def renew_lease(db: Database, key: str, token: str) -> bool:
    """Stamp the holding's heartbeat now: False when ``token`` no longer holds ``key`` (taken over)."""
    with session_scope(db, write=True) as s:
        done = s.execute(update(m.Lease).where(m.Lease.key == key, m.Lease.token == token)
                         .values(heartbeat_at=m.utcnow()))
        return done.rowcount == 1


def release_lease(db: Database, key: str, token: str) -> bool:
    """Give the lease up: False when ``token`` no longer held it (nothing is deleted then)."""
    with session_scope(db, write=True) as s:
        done = s.execute(delete(m.Lease).where(m.Lease.key == key, m.Lease.token == token))
        return done.rowcount == 1
