"""The check at the end of a profile (issue 37, F7): does the model calibrated on the run reproduce what the
run measured, and did the loop run what the micro-benchmarks timed?

- **Calibration identity.** Plain decoding predicted from the run's own terms, with the hooks' tax put back,
  against the profile's hooked plain pass. The terms are means with one-off costs left out
  (``core.stats.robust_mean``), the pass's wall time is not: a gap beyond 3 % says the pass paid one-off
  costs (graph captures, new cache slots, GC pauses) or the model misses a term. On the H200 the two were
  17 % apart (956 against 1157 tokens/s) and nothing said so.
- **In-loop ÷ isolated.** A verify or a later draft forward that costs more than 1.5× inside the loop than
  alone did not run what was benchmarked (the H100's draft ran eagerly in the loop after its graph capture
  failed: 30×).
"""
from __future__ import annotations

from collections.abc import Sequence

from specdec_tune.db import Database, IdentityCheck, get_run, list_measured
from specdec_tune.tuner.model._load import load_run_profile
from specdec_tune.tuner.model._predict import predict_baseline
from specdec_tune.tuner.model._profile import RunProfile

PLAIN_BOUND = 0.03  # predicted ÷ measured plain decoding within 3 %
LOOP_RATIO_BOUND = 1.5  # in-loop ÷ isolated at most 1.5×


def identity_check(base: RunProfile, drafts: Sequence[RunProfile], measured_tokens_per_s: float) -> IdentityCheck:
    """The check of a run from its baseline profile, its drafts' profiles and its hooked plain pass's rate."""
    pred = predict_baseline(base)
    forwards = sum(p.new_tokens for p in base.prompts)  # the hooked pass: a prefill and M - 1 forwards per prompt
    predicted = pred.new_tokens / (pred.seconds + base.plain_hook_tax_s * forwards)
    error = predicted / measured_tokens_per_s - 1
    warnings = []
    if abs(error) > PLAIN_BOUND:
        warnings.append(f"calibration identity: the model calibrated on this run predicts its plain decoding at "
                        f"{predicted:.1f} tokens/s, the hooked pass measured {measured_tokens_per_s:.1f} "
                        f"({error:+.1%}, beyond ±{PLAIN_BOUND:.0%}): one-off costs in the pass (graph captures, new "
                        "cache slots, GC) or a term the model misses")
    ratios = {}
    for rp in drafts:
        ratios[rp.draft or ""] = dict(rp.loop_ratios)
        warnings += [f"{rp.draft}: {w}" for w in rp.calibration_warnings]
        for what, ratio in sorted(rp.loop_ratios.items()):
            if ratio > LOOP_RATIO_BOUND:
                forward = "the target's verify" if what == "verify" else "a later draft forward"
                warnings.append(f"{rp.draft}: {forward} costs {ratio:.2f}× as much inside the decode loop as alone "
                                f"(beyond {LOOP_RATIO_BOUND:g}×): the loop did not run what was benchmarked "
                                "(an eager fallback, a failed graph capture?)")
    return IdentityCheck(plain_predicted_tokens_per_s=predicted, plain_measured_tokens_per_s=measured_tokens_per_s,
                         plain_error=error, in_loop_ratios=ratios, warnings=tuple(dict.fromkeys(warnings)))


def run_identity_check(db: Database, run_id: int) -> IdentityCheck | None:
    """:func:`identity_check` of a stored run (None: it has no hooked plain pass, e.g. an interrupted run)."""
    measured = next((m for m in list_measured(db, run_id) if m.draft is None and m.config.get("hooked")), None)
    if measured is None or not measured.measured_tokens_per_s:
        return None
    run = get_run(db, run_id)
    drafts = [load_run_profile(db, run_id, d.name) for d in run.drafts]
    return identity_check(load_run_profile(db, run_id, baseline_only=True), drafts, measured.measured_tokens_per_s)
