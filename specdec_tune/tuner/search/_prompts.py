"""Whether a ``tune`` request can do its job on its workload's prompts: known before anything is profiled.

The split (``specdec_tune.core.splits``) gives the profile and the confirmation the tuning half (even positions)
and the held-out measurement the other half (odd positions); ``--max-prompts``, ``--measure-prompts`` and
``--heldout-prompts`` take the first prompts of their half. They are caps: a larger value takes the whole
half, and a note says how many were used.

Refused (one line, exit 2, nothing stored), because the run could not do what it is for:

- fewer than 2 held-out prompts (the workload's held-out half, or ``--heldout-prompts``): what each server's
  file carries is decided by the held-out speedup's 95 % CI, and a CI over prompts needs two
  (``stats.ci_unavailable``); with one, every file would carry plain decoding whatever was measured;
- ``--slo-tpot-ms`` with ``--max-new-tokens 1``: a request of one token has no TPOT, so every request
  would meet the bound and the SLO would decide nothing.

Finished, with a note saying what is unavailable and why, because the answer still stands:

- one tuning prompt per confirmed configuration: no CIs on the tuning prompts; the winner is the best
  measured, as it always is (by point values: the CIs there never chose it);
- ``--max-new-tokens 1``: no TPOT or inter-token gap; whether speculation pays for one-token requests
  is still a question the measurement answers (it does not: one cycle drafts one token at most);
- ``--repeats 1`` with the energy objective: no CI of joules per token (a CI over passes).
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec_tune.core.errors import InputError
from specdec_tune.core.splits import split_prompts
from specdec_tune.core.stats import MIN_CI_PROMPTS
from specdec_tune.tuner.search._request import TuneRequest

_DECIDES = "the held-out speedup's 95% CI, which decides what each server's file carries, needs >= 2 prompts"


@dataclass(frozen=True)
class PromptCounts:
    """A workload's prompts and its two halves."""

    workload: int
    tuning: int  # even positions: what the profile and the confirmation measure
    heldout: int  # odd positions: what the winner and every server's pick are measured on

    @classmethod
    def of(cls, prompts: int) -> PromptCounts:
        positions = range(prompts)
        return cls(prompts, len(split_prompts(positions, "tune")), len(split_prompts(positions, "holdout")))


def check_prompts(req: TuneRequest, prompts: int) -> list[str]:
    """Refuse a request that cannot finish its job on a workload of ``prompts`` prompts (module docstring);
    return the notes a run that finishes prints about its prompt counts.

    Raises:
        InputError: one line naming the flag or the workload, with the counts.
    """
    n = PromptCounts.of(prompts)
    if n.heldout < MIN_CI_PROMPTS:
        raise InputError(f"workload {req.workload!r} has {n.workload} prompt{'' if n.workload == 1 else 's'}: "
                         f"{n.tuning} for tuning (even positions) and {n.heldout} held out (odd positions); tune "
                         f"measures its winner on >= {MIN_CI_PROMPTS} held-out prompts ({_DECIDES}): give a workload "
                         f"of >= {2 * MIN_CI_PROMPTS} prompts")
    if req.heldout_prompts < MIN_CI_PROMPTS:
        raise InputError(f"--heldout-prompts {req.heldout_prompts}: tune measures its winner on >= {MIN_CI_PROMPTS} "
                         f"held-out prompts ({_DECIDES}); the workload's held-out split has {n.heldout}")
    if req.slo_tpot_ms is not None and req.max_new_tokens < 2:
        raise InputError(f"--slo-tpot-ms needs --max-new-tokens >= 2, got {req.max_new_tokens}: TPOT is the time per "
                         "token after the first, so a request of one token has none and every request would meet "
                         "the bound")
    return _notes(req, n)


def _notes(req: TuneRequest, n: PromptCounts) -> list[str]:
    notes = [f"{flag} {value}: the workload's {half} split has {have} prompt{'' if have == 1 else 's'}, all used"
             for flag, value, half, have in (("--max-prompts", req.max_prompts, "tuning", n.tuning),
                                             ("--measure-prompts", req.measure_prompts, "tuning", n.tuning),
                                             ("--heldout-prompts", req.heldout_prompts, "held-out", n.heldout))
             if value > have]
    if min(req.measure_prompts, n.tuning) < MIN_CI_PROMPTS:
        notes.append("one tuning prompt per confirmed configuration: no 95% CIs on the tuning prompts (a CI over "
                     f"prompts needs >= {MIN_CI_PROMPTS}); the winner is still the best measured")
    if req.repeats < 2 and "energy" in req.search_objectives:
        notes.append("--repeats 1: energy per token has no 95% CI (its CI is over passes and needs >= 2)")
    if req.max_new_tokens < 2:
        notes.append("--max-new-tokens 1: a request of one token has no TPOT or inter-token gap, and drafts one "
                     "token at most")
    return notes
