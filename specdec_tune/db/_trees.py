"""Token-tree and staged-drafting data of a profile run (``tree_traces``; docs/model.md, Token trees
and staged drafting): what the profiler records and the tuner's tree model reads back."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from specdec_tune.db import _models as m
from specdec_tune.db._connection import Database
from specdec_tune.db._writes import _bulk
from specdec_tune.db._reads import require_run
from specdec_tune.db._session import session_scope
from specdec_tune.core.errors import InputError

TREE_KINDS = ("ranks", "siblings", "staged", "overhead", "rollouts", "sequences")


@dataclass(frozen=True)
class TreeTraceRecord:
    """One prompt's tree data for one draft.

    Attributes:
        kind: ``ranks`` (greedy: per output position the target token's rank in the draft's
            distribution and the draft's top probabilities), ``siblings`` (sampling: per position the
            acceptance of successive i.i.d. and top-k drafts), ``staged`` (an inner drafter's counts),
            ``overhead`` (the engine's own time per tree cycle), ``rollouts`` (an EAGLE-3 head: per output
            position and chain step the target token's rank and the head's top probabilities,
            ``profiler.head_profile``) or ``sequences`` (suffix decoding: the prompt's token ids and its greedy
            output, in the order profiled).
        prompt_index: the profiled prompt.
        temperature: 0 for greedy data.
        data: the JSON document (``profiler.tree_profile`` documents its keys).
    """

    kind: str
    prompt_index: int | None
    temperature: float
    data: dict[str, Any] = field(default_factory=dict)


def add_tree_traces(db: Database, run_id: int, draft: str, rows: Iterable[TreeTraceRecord]) -> int:
    """Store tree data of one draft; return how many rows.

    Raises:
        InputError: an unknown kind or a temperature that is not a finite number >= 0.
    """
    out = []
    for row in rows:
        if row.kind not in TREE_KINDS:
            raise InputError(f"tree trace kind {row.kind!r} is not valid; valid: {', '.join(TREE_KINDS)}")
        if not math.isfinite(row.temperature) or row.temperature < 0:
            raise InputError(f"tree trace temperature {row.temperature!r} must be a finite number >= 0")
        out.append(dict(run_id=run_id, draft=draft, kind=row.kind, temperature=float(row.temperature),
                        prompt_index=row.prompt_index, data=dict(row.data)))
    return _bulk(db, run_id, m.TreeTrace, out)


def load_tree_traces(db: Database, run_id: int, draft: str, kind: str | None = None) -> list[TreeTraceRecord]:
    """Tree data of one draft in recording order, optionally of one kind."""
    t = m.TreeTrace
    query = select(t.kind, t.prompt_index, t.temperature, t.data).where(t.run_id == run_id, t.draft == draft)
    if kind is not None:
        query = query.where(t.kind == kind)
    with session_scope(db) as s:
        require_run(s, db, run_id)
        return [TreeTraceRecord(k, p, temp, dict(data)) for k, p, temp, data in s.execute(query.order_by(t.id))]


def as_mapping(records: Iterable[TreeTraceRecord]) -> Mapping[tuple[str, int | None], TreeTraceRecord]:
    """Records keyed by (kind, prompt index)."""
    return {(r.kind, r.prompt_index): r for r in records}
