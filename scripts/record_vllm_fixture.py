"""Record real vLLM answers for the tests that run without vLLM (tests/data/vllm_recorded.json).

Runs the bundled target in vLLM (through profiler.backends._vllm, as the tool does) with a draft-model
and an n-gram configuration on the last prompts of the ``functions`` workload, keeps the worker's raw
``generate`` answers (outputs, per-request step records, counter deltas), and asks vLLM's own n-gram
matcher for its proposals on random token sequences. Usage:

    SPECDEC_VLLM_PYTHON=.venv-vllm/bin/python python scripts/record_vllm_fixture.py
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from specdec_tune.engine import load_model, zoo
from specdec_tune.engine.workloads import load_workload
from specdec_tune.profiler.runs import encode_prompt
from specdec_tune.profiler.backends._vllm import VllmWorker, require_vllm_python

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm_recorded.json"
MAX_TOKENS = 48
HELD_OUT = 3  # the workload's last prompts


def ngram_cases(python: Path, n: int = 300) -> list[dict]:
    rng = random.Random(0)
    cases = []
    for _ in range(n):
        mn = rng.randint(1, 3)
        cases.append({"ids": [rng.randint(0, 3) for _ in range(rng.randint(1, 40))], "min_n": mn,
                      "max_n": rng.randint(mn, 5), "k": rng.randint(1, 6)})
    code = (
        "import json, sys, numpy as np\n"
        "from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as f\n"
        "cases = json.load(sys.stdin)\n"
        "print(json.dumps([f(np.array(c['ids'], dtype=np.int32), c['min_n'], c['max_n'], 1024, c['k']).tolist() for c in cases]))\n"
    )
    out = subprocess.run([str(python), "-c", code], input=json.dumps(cases), capture_output=True, text=True, check=True)
    for c, p in zip(cases, json.loads(out.stdout.strip().splitlines()[-1])):
        c["vllm"] = p
    return cases


def main() -> None:
    python = require_vllm_python()
    target = load_model("mini-target", "cpu", "float32", "auto")
    prompts = load_workload("functions")
    warm = encode_prompt(target, prompts[0].prompt, prompts[0].id).tolist()
    held = [encode_prompt(target, p.prompt, p.id).tolist() for p in prompts[-HELD_OUT:]]
    configs = {
        "draft_model": {"method": "draft_model", "model": "mini-draft-1l", "num_speculative_tokens": 3},
        "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
    }
    record: dict = {"max_tokens": MAX_TOKENS, "prompt_ids": [p.id for p in prompts[-HELD_OUT:]], "prompts": held, "runs": {}}
    with VllmWorker(python) as worker:
        record["versions"] = worker.versions
        for name, cfg in configs.items():
            live = dict(cfg)
            if "model" in live:
                live["model"] = str(zoo.resolve_model(live["model"]))
            worker.start(str(zoo.resolve_model("mini-target")), live, enforce_eager=True)
            worker.generate([warm], MAX_TOKENS)  # warm-up: outside the recorded deltas
            resp = worker._call({"op": "generate", "prompts": held, "max_tokens": MAX_TOKENS, "concurrency": 1})
            record["runs"][name] = {"speculative_config": cfg, "response": {k: resp[k] for k in ("outputs", "groups")}}
            print(name, "start", round(worker.start_seconds, 1), "s", file=sys.stderr)
    record["ngram_cases"] = ngram_cases(python)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
