"""Model fidelity: profile a target with its drafts once, then measure a grid of configurations for
real and compare each with the model's prediction from that profile.

Usage: OMP_NUM_THREADS=1 python benchmarks/fidelity.py [--db sqlite:///fidelity.db] [--target mini-target]
       [--drafts mini-draft-1l,mini-draft-2l] [--workload functions] [--run ID] [--repeats 3]
Prints one line per configuration (measured and predicted tokens/s, relative error, τ) and a summary:
median and worst |predicted - measured| / measured, and whether the measured best is in the
predicted top 3.
"""
from __future__ import annotations

import argparse
import statistics
import time

from specdec_tune.db import open_database
from specdec_tune.profiler.session import ProfileSettings, run_profile
from specdec_tune.tuner.model import SpecConfig
from specdec_tune.tuner.validate import measure_predicted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="sqlite:///fidelity.db")
    ap.add_argument("--target", default="mini-target")
    ap.add_argument("--drafts", default="mini-draft-1l,mini-draft-2l")
    ap.add_argument("--workload", default="functions")
    ap.add_argument("--run", type=int, default=None, help="reuse a stored profile run")
    ap.add_argument("--ns", default="1,2,4,6,8,12")
    ap.add_argument("--thetas", default="0,0.3,0.6")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved passes over all configurations")
    args = ap.parse_args()
    drafts = args.drafts.split(",")
    db = open_database(args.db)
    run_id = args.run
    if run_id is None:
        t0 = time.perf_counter()
        run_id = run_profile(db, args.target, drafts, args.workload, ProfileSettings(device="cpu")).run_id
        print(f"profile run {run_id}: {time.perf_counter() - t0:.0f} s", flush=True)
    grid = [(draft, SpecConfig(int(n), float(theta)))
            for draft in drafts for n in args.ns.split(",") for theta in args.thetas.split(",")]
    t0 = time.perf_counter()
    # Interleaved: every repeat goes round all configurations, so machine drift hits them alike.
    validated = measure_predicted(db, run_id, grid, repeats=args.repeats)
    print(f"measured {len(grid)} configurations x {args.repeats} interleaved repeats: "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for v in validated:
        m = v.measurement
        rows.append((m.draft, m.config.num_speculative_tokens, m.config.threshold, m.tokens_per_s,
                     v.prediction.tokens_per_s, v.relative_error))
        spread = (max(m.per_repeat_tokens_per_s) - min(m.per_repeat_tokens_per_s)) / m.tokens_per_s
        print(f"{m.draft:>14} N={m.config.num_speculative_tokens:2d} θ={m.config.threshold:.1f}  measured "
              f"{m.tokens_per_s:6.1f} tok/s (repeat spread {spread * 100:4.1f}%)  predicted "
              f"{v.prediction.tokens_per_s:6.1f}  error {v.relative_error * 100:+6.1f}%  "
              f"τ measured {m.mean_tokens_per_cycle:.3f} predicted {v.prediction.expected_tokens_per_cycle:.3f}",
              flush=True)
    errors = [abs(r[5]) for r in rows]
    best = max(rows, key=lambda r: r[3])
    top3 = sorted(rows, key=lambda r: -r[4])[:3]
    print(f"run {run_id}: {len(rows)} configurations, median |error| {statistics.median(errors) * 100:.1f}%, "
          f"worst {max(errors) * 100:.1f}%; measured best {best[:3]} in predicted top 3: {best[:3] in [r[:3] for r in top3]}")


if __name__ == "__main__":
    main()
