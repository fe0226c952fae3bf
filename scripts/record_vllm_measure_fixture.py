"""Record real vLLM measurements for tests/data/vllm_recorded_measure.json (tests/tuner/servers/test_time_model.py).

Profiles nothing itself: give it a results database holding a profile run of the bundled target
on ``functions`` (any ``specdec-tune profile``/``tune`` run), e.g. the main job's ``specdec.db``.
Measures plain decoding and the 1-layer draft at N = 2, 4, 6 on vLLM at batch sizes 1 and 4 (four
tuning prompts, two repeats) and writes the ServerMeasurement objects as JSON.

    SPECDEC_VLLM_PYTHON=.venv-vllm/bin/python python scripts/record_vllm_measure_fixture.py \\
        --db sqlite:///specdec.db --run 1 --out tests/data/vllm_recorded_measure.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", type=int, required=True)
    ap.add_argument("--draft", default="mini-draft-1l")
    ap.add_argument("--ns", default="2,4,6")
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="tests/data/vllm_recorded_measure.json")
    args = ap.parse_args()

    from specdec_tune.db import get_run, open_database
    from specdec_tune.profiler.backends._vllm_measure import measure_on_server
    from specdec_tune.tuner.model import Candidate
    from specdec_tune.tuner.servers import vllm_config

    db = open_database(args.db)
    target = get_run(db, args.run).target.name
    configs = [vllm_config(target, Candidate("none", 0))] + [
        vllm_config(target, Candidate(args.draft, int(n))) for n in args.ns.split(",")]
    ms = measure_on_server(db, args.run, configs, batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
                           split="tune", max_prompts=args.prompts, repeats=args.repeats, store=False)
    Path(args.out).write_text(json.dumps({"note": __doc__.splitlines()[0], "measurements": [m.to_json() for m in ms]},
                                         indent=1) + "\n")
    for m in ms:
        print(f"{m.config.label:<22} B={m.batch_size}: {m.tokens_per_s:.1f} tokens/s, acceptance length "
              f"{m.mean_acceptance_length:.2f}, start {m.start_seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
