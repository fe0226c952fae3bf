"""Our suffix decoding against arctic-inference's, the implementation vLLM's ``method: "suffix"`` runs
(``vllm/v1/spec_decode/suffix_decoding.py``). Marker ``vllm``: it needs arctic-inference in the vLLM venv
(``scripts/setup_arctic_inference.sh`` builds arctic-inference 0.1.1's suffix module from its sdist on a CPU machine).

Chains (what vLLM drafts) must agree exactly, token ids, probabilities and scores, over random streams full of
ties, evictions and removals. Trees (arctic's ``use_tree_spec``, which vLLM does not expose) follow the same
rule but arctic's compressed nodes put equal-probability nodes through its heap in another order, so they are
only required to agree mostly.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.arctic import vllm_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
@pytest.mark.slow
def test_chains_match_arctic_inference(vllm_python):
    has = subprocess.run([str(vllm_python), "-c", "import arctic_inference.suffix_decoding"], capture_output=True,
                         env=vllm_env())
    if has.returncode != 0:
        pytest.skip("arctic-inference is not importable in the vLLM venv: bash scripts/setup_arctic_inference.sh")
    out = subprocess.run([str(vllm_python), str(ROOT / "tests" / "support" / "arctic_parity.py"),
                          str(ROOT), "7", "150"],
                         capture_output=True, text=True, timeout=600, check=True, env=vllm_env())
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    print(counts)
    assert counts["path_total"] > 2000 and counts["cache_total"] > 500
    assert counts["path_same"] == counts["path_total"]
    assert counts["cache_same"] == counts["cache_total"]
    assert counts["cached_same"] > 0
    assert counts["tree_same"] >= 0.9 * counts["tree_total"]
