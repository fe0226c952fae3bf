"""Which configuration each server's files carry, and why: decided here, built in :mod:`._exports`.

A server's files carry, in this order of preference:

1. The tuner's measured decision for that server (:class:`~specdec_tune.tuner.model.ServerDecision`,
   recorded by ``tune`` in ``TuningResult.best_per_server``): its pick when the held-out speedup's
   95 % CI lower bound is at least 1, else plain decoding (docs/servers.md, Exports).
2. Without one (``export --run``, a study from before decisions were recorded): the winner, unless
   its measured held-out CI reaches below 1 (then plain decoding, and why); a server that cannot
   express the winner gets the best recorded inside its own space, when ``all`` formats were asked.

The :class:`Shipped` record is what the files are built from *and* what the README renders, so the
two state the same configuration.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import NONE, Candidate, ServerDecision, TuningResult, decide, decisions
from specdec_tune.tuner.servers._table import SERVERS, expressible, server_space

Files = list[tuple[str, str]]  # (relative path, text)


@dataclass(frozen=True)
class Shipped:
    """What one format's files carry, and why.

    Attributes:
        fmt: the format (a server of the capability table).
        result: the result the files are built from (its candidate, per-batch-size N and numbers).
        decision: the tuner's measured decision for the server (``None``: none recorded).
        note: how ``result`` differs from the overall winner, and why (``None``: it is the winner).
        files: the files built from ``result`` (empty until built).
    """

    fmt: str
    result: TuningResult
    decision: ServerDecision | None = None
    note: str | None = None
    files: Files = ()  # type: ignore[assignment]


def server_best(result: TuningResult, fmt: str) -> TuningResult | None:
    """The best configuration inside ``fmt``'s space (``result.best_per_server``) as a result of its own,
    or ``None`` when the tuner recorded none. Its numbers are its own: a measured decision's held-out
    numbers, else those of a study from before decisions were recorded (predicted, measured on tuning
    prompts at most); its schedule is its own per-batch-size N."""
    entry = result.best_per_server.get(fmt)
    if not entry:
        return None
    d = decisions(result).get(fmt)
    if d is not None:
        return _decided(result, fmt, d)
    c = Candidate.from_dict(entry)
    if c == result.candidate:
        return None
    return replace(result, candidate=c, server=fmt, draft_path=None if c.drafter != result.candidate.drafter
                   else result.draft_path, per_batch_size={int(b): int(n) for b, n in
                                                           (entry.get("per_batch_size") or {}).items()},
                   measured_tokens_per_s=entry.get("measured_tokens_per_s"),
                   predicted_tokens_per_s=entry.get("predicted_tokens_per_s"), baseline_tokens_per_s=None,
                   speedup=None, speedup_ci=None, heldout=False, predicted_basis="")


def _decided(result: TuningResult, fmt: str, d: ServerDecision) -> TuningResult:
    """The result ``fmt``'s files are built from under a measured decision: its shipped configuration
    (plain decoding when the held-out CI reached below 1) and the pick's own measured numbers."""
    c = d.shipped
    same_draft = not c.is_plain and c.drafter == result.candidate.drafter
    return replace(result, candidate=c, server=fmt, draft_path=result.draft_path if same_draft else None,
                   per_batch_size=dict(d.per_batch_size) if d.speculates else {},
                   per_batch_size_reasons=dict(d.per_batch_size_reasons or result.per_batch_size_reasons)
                   if d.speculates else {},
                   measured_tokens_per_s=d.measured_tokens_per_s, predicted_tokens_per_s=d.predicted_tokens_per_s,
                   baseline_tokens_per_s=d.baseline_tokens_per_s, speedup=d.speedup, speedup_ci=d.speedup_ci,
                   heldout=d.heldout, predicted_basis=d.predicted_basis)


def _guarded(result: TuningResult) -> tuple[TuningResult, str | None]:
    """The winner, unless its measured CI reaches below 1: then plain decoding, and why. A result
    without a measured CI (``export --run``: predicted only) is returned as it is."""
    if result.candidate.is_plain or result.speedup_ci is None:
        return result, None
    verdict, why = decide(result.candidate, result.speedup, result.speedup_ci, heldout=result.heldout)
    if verdict == "speculate":
        return result, None
    return replace(result, candidate=Candidate(NONE, 0), per_batch_size={}), why


def refusal_text(fmt: str, result: TuningResult) -> str | None:
    """Why ``fmt`` cannot run ``result``'s configuration (one line), None when it can; a lossy setting's
    line states the bias computed for it, so the user sees what the refused setting would have cost."""
    c = result.candidate
    reason = expressible(server_space(fmt), c)
    if reason is None:
        return None
    if c.acceptance != "exact" and result.bias:
        b = result.bias
        measured = "" if b.get("measured_bias") is None else f", {b['measured_bias']:.4f} measured"
        reason += (f"; this setting's bias: {b['bias']:.4f} per verified position (computed, {b.get('label', '')}"
                   f"{measured})")
    return f"cannot export {c.label()} as {fmt}: {reason}"


def carried(result: TuningResult, fmt: str, every: bool = True) -> Shipped:
    """What ``fmt``'s files carry (module docstring), not yet built.

    Raises:
        InputError: the server cannot express the winner and nothing else was recorded for it (or
            ``every`` is false).
    """
    d = decisions(result).get(fmt)
    if d is not None:
        if d.speculates and d.candidate == result.candidate:
            note = None
        elif d.speculates:
            why = expressible(server_space(fmt), result.candidate)
            note = (f"the overall winner is {result.candidate.label()}" + (f" ({why})" if why else "")
                    + f"; this file carries {d.selected or 'the best inside its own space'}")
        else:
            note = d.reason
        return Shipped(fmt, _decided(result, fmt, d), d, note)
    guarded, note = _guarded(result)
    refusal = refusal_text(fmt, guarded)
    if refusal is None:
        return Shipped(fmt, guarded, None, note)
    alt = server_best(result, fmt) if every else None
    if alt is None:
        raise InputError(refusal)
    return Shipped(fmt, alt, None, f"{refusal}; wrote {SERVERS[fmt].title}'s best inside its own space instead: "
                                   f"{alt.candidate.label()}")
