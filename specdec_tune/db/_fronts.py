"""Store and read the lossy acceptance front and the teacher-forced positions of a profile run.

``bias_front``: per (draft, temperature, method, ε, source) the rejection and bias per verified
position (:class:`BiasFrontRow`); ``teacher_forced_positions``: per target-sampled generation, 1 - TV
and the draft's top probability at each generated position (:class:`TeacherForcedRow`). Both are what
``profile --temperature T`` measures with a model draft (docs/model.md, Lossy acceptance and
Acceptance from TV).
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from sqlalchemy import insert, select

from specdec_tune.db import _models as m
from specdec_tune.db._connection import Database
from specdec_tune.db._reads import require_run
from specdec_tune.db._records import BiasFrontRow, TeacherForcedRow, field_values, record_from
from specdec_tune.db._session import session_scope
from specdec_tune.core.errors import InputError

FRONT_METHODS = ("exact", "opt", "uno")
FRONT_SOURCES = ("theory", "measured")


def _probability(name: str, x: float) -> float:
    x = float(x)
    if not (math.isfinite(x) and -1e-9 <= x <= 1 + 1e-9):
        raise InputError(f"{name}={x!r} must be a probability in [0, 1]")
    return min(max(x, 0.0), 1.0)


def add_bias_front(db: Database, run_id: int, rows: Iterable[BiasFrontRow]) -> int:
    """Store front points of run ``run_id``; return how many.

    Raises:
        InputError: an unknown method or source, or a rate that is not a probability.
    """
    out = []
    for row in rows:
        if row.method not in FRONT_METHODS or row.source not in FRONT_SOURCES:
            raise InputError(f"front point needs a method in {FRONT_METHODS} and a source in {FRONT_SOURCES}, "
                             f"got {row.method!r}, {row.source!r}")
        values = {**field_values(BiasFrontRow, row), "run_id": run_id,
                  "rejection": _probability("rejection", row.rejection), "bias": _probability("bias", row.bias),
                  "epsilon": _probability("epsilon", row.epsilon), "positions": int(row.positions)}
        out.append(values)
    return _insert(db, run_id, m.BiasFront, out)


def add_teacher_forced(db: Database, run_id: int, rows: Iterable[TeacherForcedRow]) -> int:
    """Store teacher-forced generations of run ``run_id``; return how many."""
    out = []
    for row in rows:
        if len(row.one_minus_tv) != len(row.top_q):
            raise InputError(f"teacher-forced prompt {row.prompt_index}: {len(row.one_minus_tv)} 1 - TV values for "
                             f"{len(row.top_q)} top probabilities")
        out.append({**field_values(TeacherForcedRow, row), "run_id": run_id,
                    "one_minus_tv": [_probability("1 - TV", x) for x in row.one_minus_tv],
                    "top_q": [_probability("top q", x) for x in row.top_q]})
    return _insert(db, run_id, m.TeacherForcedPosition, out)


def _insert(db: Database, run_id: int, table: type[m.Base], rows: list[dict]) -> int:
    with session_scope(db, write=True) as s:
        require_run(s, db, run_id)
        if rows:
            s.execute(insert(table.__table__), rows)
    return len(rows)


def load_bias_front(db: Database, run_id: int, draft: str | None = None) -> list[BiasFrontRow]:
    """The run's front points (of one draft, or all), ordered by draft, source, method and ε."""
    t = m.BiasFront
    query = select(t).where(t.run_id == run_id)
    if draft is not None:
        query = query.where(t.draft == draft)
    query = query.order_by(t.draft, t.source, t.method, t.epsilon, t.id)
    with session_scope(db) as s:
        require_run(s, db, run_id)
        return [record_from(BiasFrontRow, r) for r in s.scalars(query)]


def load_teacher_forced(db: Database, run_id: int, draft: str, temperature: float | None = None) -> list[TeacherForcedRow]:
    """The run's teacher-forced generations of ``draft`` in prompt order."""
    t = m.TeacherForcedPosition
    query = select(t).where(t.run_id == run_id, t.draft == draft)
    if temperature is not None:
        query = query.where(t.temperature == temperature)
    with session_scope(db) as s:
        require_run(s, db, run_id)
        return [record_from(TeacherForcedRow, r, one_minus_tv=tuple(r.one_minus_tv), top_q=tuple(r.top_q))
                for r in s.scalars(query.order_by(t.prompt_index, t.id))]
