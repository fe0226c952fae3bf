"""Which gauge of the machine's speed makes stored predictions closest to what was measured: none (the
profile's speed), the machine probe, or plain decoding measured in the same call.

Reads results databases (nothing is measured). For every ``measure`` call that measured plain
decoding next to speculative configurations (rows of one run stored within seconds of each other on
the same prompts), it undoes each speculative row's stored rescaling (``prediction_machine_speed``)
and compares three predictions of its tokens/s with the measured value:

- ``profile``: at the profile's machine speed;
- ``probe``: rescaled by the machine probe's ratio (what ``measure`` stored before 2026-11-26);
- ``plain``: rescaled by plain decoding's measured ÷ predicted tokens/s in the same call (what it
  stores since, ``tuner.search._validate._speeds``).

Synthetic-acceptance rows are skipped. Probe factors are recomputed from the stored probe seconds,
so rows stored with either rescaling are compared alike.

    python benchmarks/speed_gauge.py sqlite:////tmp/a.db sqlite:////tmp/b.db ...
"""
from __future__ import annotations

import statistics
import sys

from specdec_tune.db import list_measured, open_database
from specdec_tune.tuner.model import load_run_profile


def calls(rows):
    """Rows grouped by the ``measure`` call that stored them (same run and prompts, stored within 5 s)."""
    groups: list[list] = []
    for r in rows:
        last = groups[-1][-1] if groups else None
        if (last is not None and last.run_id == r.run_id and last.config.get("prompt_ids") == r.config.get("prompt_ids")
                and abs((r.created_at - last.created_at).total_seconds()) < 5):
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def errors(url: str) -> dict[str, list[float]]:
    """|relative tokens/s error| of each speculative row under each gauge."""
    db = open_database(url)
    out: dict[str, list[float]] = {"profile": [], "probe": [], "plain": []}
    probes: dict[int, float | None] = {}
    for group in calls(list_measured(db)):
        plain = [r for r in group if r.draft is None and r.predicted_tokens_per_s]
        if len(plain) != 1 or len(group) < 2:
            continue
        run = group[0].run_id
        if run not in probes:
            probes[run] = load_run_profile(db, run, baseline_only=True).machine_probe_s
        p = plain[0]
        plain_raw = p.predicted_tokens_per_s / (p.config.get("prediction_machine_speed") or 1.0)
        gauge = p.measured_tokens_per_s / plain_raw
        for r in group:
            if r.draft is None or not r.predicted_tokens_per_s or r.config.get("synthetic_acceptance"):
                continue
            raw = r.predicted_tokens_per_s / (r.config.get("prediction_machine_speed") or 1.0)
            now = r.config.get("machine_probe_s")
            probe = probes[run] / now if probes[run] and now else 1.0
            for name, factor in (("profile", 1.0), ("probe", probe), ("plain", gauge)):
                out[name].append(abs(raw * factor / r.measured_tokens_per_s - 1.0))
    return out


def main(urls: list[str]) -> None:
    if not urls:
        sys.exit("usage: speed_gauge.py DB_URL [DB_URL ...]")
    total: dict[str, list[float]] = {"profile": [], "probe": [], "plain": []}
    for url in urls:
        try:
            got = errors(url)
        except Exception as e:  # a database of another schema or without runs: say so and go on
            print(f"{url}: skipped ({type(e).__name__}: {e})")
            continue
        for k, v in got.items():
            total[k] += v
    n = len(total["plain"])
    print(f"{n} speculative measurements with plain decoding measured in the same call")
    for name, v in total.items():
        if v:
            ranked = sorted(v)
            print(f"  rescaled to {name:8s} median |tokens/s error| {statistics.median(v):.1%}, "
                  f"p90 {ranked[int(0.9 * (len(v) - 1))]:.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
