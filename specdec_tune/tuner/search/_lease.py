"""One process per study: the lease ``tune`` holds while it profiles, searches, confirms and stores.

Two ``tune`` processes on one study would mix trials predicted from two profiles and overwrite each
other's stored result. So ``tune`` first takes the study's lease in the results database
(:func:`specdec_tune.db.insert_lease`: of two processes inserting it at once, one wins), renews it
every ``HEARTBEAT_S`` seconds from a thread while it works, checks it still holds it before it stores
the result, and gives it back when it ends, however it ends. A second process asking for the same
study is refused before it profiles, with one line naming the first (pid, host, since when) and what
to do. A lease whose holder died (``kill -9``, a lost machine) blocks nobody for long: on the holder's
own machine (same boot and pid namespace) it is taken over as soon as its pid is gone, anywhere else
once its heartbeat is ``STALE_S`` seconds old.
"""
from __future__ import annotations

import datetime as dt
import os
import platform
import threading
import uuid
from pathlib import Path

from specdec_tune.db import Database, LeaseRecord, get_lease, insert_lease, lease_key, release_lease, renew_lease
from specdec_tune.db import sqlite_file, take_over_lease
from specdec_tune.core.errors import BusyError, SpecdecError

HEARTBEAT_S = 10.0
STALE_S = 90.0  # several missed heartbeats: a busy database delays one by at most its 5 s busy timeout


def host() -> str:
    return platform.node() or "unknown host"


def pid_scope() -> str | None:
    """Where a pid names one process: this boot of the kernel and this pid namespace (None: unknown)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def holder_gone(lease: LeaseRecord, now: dt.datetime, stale_s: float = STALE_S) -> bool:
    """Whether ``lease``'s holder is dead: its heartbeat is older than ``stale_s``, or it ran in this
    machine's pid namespace and its pid is gone."""
    if (now - lease.heartbeat_at).total_seconds() > stale_s:
        return True
    here = pid_scope()
    return here is not None and lease.pid_scope == here and lease.host == host() and not _alive(lease.pid)


def describe(lease: LeaseRecord, now: dt.datetime) -> str:
    """The holder in words: pid, host, since when, last heartbeat."""
    age = max((now - lease.heartbeat_at).total_seconds(), 0.0)
    return (f"pid {lease.pid} on host {lease.host} ({lease.command}, since "
            f"{lease.acquired_at:%Y-%m-%d %H:%M:%S} UTC, last heartbeat {age:.0f} s ago)")


class StudyLease:
    """The lease of one study (a context manager): taken on entry, renewed while held, given back on exit.

    Args:
        subject: what is held, in words (:func:`study_subject`); its key is :func:`~specdec_tune.db.lease_key`.
        heartbeat_s, stale_s: how often the holder renews, and how old a heartbeat proves its holder dead.
    """

    def __init__(self, db: Database, subject: str, command: str = "tune", *, heartbeat_s: float = HEARTBEAT_S,
                 stale_s: float = STALE_S) -> None:
        self.db, self.subject, self.command = db, subject, command
        self.key, self.token = lease_key(subject), uuid.uuid4().hex
        self.heartbeat_s, self.stale_s = heartbeat_s, stale_s
        self.taken_over: LeaseRecord | None = None  # the dead holder this lease was taken from
        self._stop = threading.Event()
        self._lost = False
        self._thread: threading.Thread | None = None

    def _record(self) -> LeaseRecord:
        now = _now()
        return LeaseRecord(self.key, self.subject, self.token, self.command, os.getpid(), host(), pid_scope(), now, now)

    def acquire(self) -> StudyLease:
        """Take the lease, or take it over from a dead holder.

        Raises:
            BusyError: a live process holds it (one line naming it and what to do).
        """
        for _ in range(3):  # a holder may release, or another process take over, between the steps
            if insert_lease(self.db, self._record()):
                break
            held = get_lease(self.db, self.key)
            if held is None:
                continue
            if not holder_gone(held, _now(), self.stale_s):
                raise BusyError(f"{self.subject}: in use by another process, {describe(held, _now())}; wait for "
                                "it to end and run this command again (it then reuses that profile and study), or "
                                "give another --study to tune separately")
            if take_over_lease(self.db, held.token, self._record()):
                self.taken_over = held
                break
        else:
            raise BusyError(f"{self.subject} changed hands three times while this process asked for it; "
                            "run the command again")
        if sqlite_file(self.db.url) is not None or self.db.backend != "sqlite":  # others can see it: renew it
            self._thread = threading.Thread(target=self._beat, name="study-lease", daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not renew_lease(self.db, self.key, self.token):
                    self._lost = True
                    return
            except SpecdecError:  # a busy database: the next beat tries again (STALE_S allows for it)
                continue

    def check(self) -> None:
        """Raise unless this process still holds the lease (call it before storing a result).

        Raises:
            BusyError: another process took the lease over (this one looked dead: stopped, or its heartbeat
                could not be written for ``stale_s`` seconds); nothing more is stored.
        """
        if not self._lost and renew_lease(self.db, self.key, self.token):
            return
        self._lost = True
        held = get_lease(self.db, self.key)
        who = describe(held, _now()) if held is not None else "a process that has ended since"
        raise BusyError(f"{self.subject} was taken over by {who} while this process worked on it (it looked dead "
                        "to that one); this process stored no result: run the command again")

    def release(self) -> None:
        """Stop renewing and give the lease back (a lease taken over meanwhile is left to its new holder)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._lost:
            return
        try:
            release_lease(self.db, self.key, self.token)
        except SpecdecError:  # the database failed at the very end: the lease is then taken over as a dead one's
            pass

    def __enter__(self) -> StudyLease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def study_subject(study: str | None, family: str, storage_url: str) -> str:
    """What a ``tune`` holds, in words: the study named with ``--study``, or the family of default-named
    studies of this request (one per profile run, ``family-run<id>``) on this host."""
    if study:
        return f"study {study!r} in {storage_id(storage_url)}"
    return f"studies {family + '-run*'!r} of host {host()} in {storage_id(storage_url)}"


def storage_id(storage_url: str) -> str:
    """The study storage in words that are the same from any folder (a SQLite file's absolute path)."""
    from specdec_tune.db import mask_url

    path = sqlite_file(storage_url)
    return f"sqlite:///{path}" if path is not None else mask_url(storage_url)
