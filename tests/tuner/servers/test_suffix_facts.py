"""Suffix decoding across servers (tuner/servers/_suffix_facts.py, _table.py, _exports.py, _schemas.py): only vLLM
runs it, every other server refuses it naming its nearest equivalent, vLLM's file is ``method: "suffix"`` with its
four fields and a constant N, and vLLM's own ``SpeculativeConfig`` accepts exactly what our schema accepts
(marker ``vllm``: it needs arctic-inference in the vLLM venv, ``scripts/setup_arctic_inference.sh``)."""
from __future__ import annotations

import json
import subprocess

import pytest
from pydantic import ValidationError

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import Candidate, TuningResult
from specdec_tune.tuner.search._space import server_search_space, suffix_candidate
from specdec_tune.tuner.servers import SERVERS, build_exports, expressible
from specdec_tune.tuner.servers import _schemas as sch
from tests.support.arctic import vllm_env

SUFFIX = suffix_candidate(6, (16, 4, 2.0, 0.05))
NEAREST = {"sglang": "NGRAM", "trtllm": "SADecodingConfig", "llamacpp": "ngram-map-k", "hf": "prompt lookup"}


def test_only_vllm_runs_suffix_decoding_and_the_others_name_their_nearest():
    assert expressible(SERVERS["vllm"], SUFFIX) is None
    for name, nearest in NEAREST.items():
        reason = expressible(SERVERS[name], SUFFIX)
        assert reason is not None and nearest in reason, (name, reason)
    # what vLLM's proposer cannot: arctic's trees, a schedule of N, a θ
    for other in (Candidate("suffix", 6, tree="suffix"), Candidate("suffix", 6, schedule="heuristic")):
        assert expressible(SERVERS["vllm"], other) is not None


def test_the_search_spaces_hold_suffix_only_where_it_runs():
    vllm = server_search_space("vllm", [], 4, True, suffix=True)
    points = [c for c in vllm.candidates() if c.is_suffix]
    # every one of the four vLLM fields varies across the searched points, N too
    for field in ("suffix_max_tree_depth", "suffix_max_cached_requests", "suffix_max_spec_factor",
                  "suffix_min_token_prob", "num_speculative_tokens"):
        assert len({getattr(c, field) for c in points}) > 1, field
    for name in NEAREST:
        assert not [c for c in server_search_space(name, [], 4, True, suffix=True).candidates() if c.is_suffix]


def test_vllm_file_is_method_suffix_with_a_constant_n():
    result = TuningResult(candidate=SUFFIX, server="vllm", target="mini-target", workload="edits",
                          per_batch_size={1: 6, 4: 3, 16: 1})
    files, skipped, _ = build_exports(result, ["all"])
    cfg = json.loads(dict(files["vllm"])["vllm/speculative_config.json"])
    assert cfg == {"method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_tree_depth": 16,
                   "suffix_decoding_max_cached_requests": 4, "suffix_decoding_max_spec_factor": 2.0,
                   "suffix_decoding_min_token_prob": 0.05}
    assert "arctic-inference" in dict(files["vllm"])["vllm/launch.sh"]
    assert set(skipped) == set(NEAREST) and all("cannot export suffix" in v for v in skipped.values())
    with pytest.raises(InputError, match="SADecodingConfig"):
        build_exports(result, ["trtllm"])


@pytest.mark.parametrize("fields", [
    dict(method="suffix", num_speculative_tokens=4, suffix_decoding_max_tree_depth=8),  # three fields missing
    dict(method="ngram", num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=1,
         suffix_decoding_max_tree_depth=8),
    dict(method="suffix", num_speculative_tokens=4, suffix_decoding_max_tree_depth=8,
         suffix_decoding_max_cached_requests=0, suffix_decoding_max_spec_factor=1.0, suffix_decoding_min_token_prob=0.1,
         num_speculative_tokens_per_batch_size=[(1, 4, 4)]),
])
def test_schema_refuses_what_vllm_would_not_run(fields):
    with pytest.raises(ValidationError):
        sch.VllmSpeculativeConfig(**fields)


BOUNDARY = [  # (depth, cached, factor, min prob): the first four inside vLLM's bounds, the rest outside
    (1, 0, 0.0, 0.0), (24, 10000, 1.0, 0.1), (64, 1, 8.5, 1.0), (16, 4, 2.0, 0.05),
    (0, 4, 1.0, 0.1), (8, -1, 1.0, 0.1), (8, 4, -0.5, 0.1), (8, 4, 1.0, 1.5), (8, 4, 1.0, -0.1),
]
VLLM_CHECK = """
import json, sys
from vllm.config import SpeculativeConfig
out = []
for cfg in json.loads(sys.stdin.read()):
    try:
        SpeculativeConfig(**cfg)
        out.append(True)
    except Exception as exc:  # pydantic's ValidationError around vLLM's ValueError
        out.append(type(exc).__name__)
print(json.dumps(out))
"""


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_accepts_exactly_what_our_schema_accepts(vllm_python):
    has = subprocess.run([str(vllm_python), "-c", "import arctic_inference.suffix_decoding"], capture_output=True,
                         env=vllm_env())
    if has.returncode != 0:
        pytest.skip("arctic-inference is not importable in the vLLM venv (vLLM refuses method 'suffix' without it): "
                    "bash scripts/setup_arctic_inference.sh")
    configs, ours = [], []
    for depth, cached, factor, floor in BOUNDARY:
        cfg = {"method": "suffix", "num_speculative_tokens": 5, "suffix_decoding_max_tree_depth": depth,
               "suffix_decoding_max_cached_requests": cached, "suffix_decoding_max_spec_factor": factor,
               "suffix_decoding_min_token_prob": floor}
        try:
            sch.VllmSpeculativeConfig(**cfg)
            ours.append(True)
        except ValidationError:
            ours.append(False)
        configs.append(cfg)
    out = subprocess.run([str(vllm_python), "-c", VLLM_CHECK], input=json.dumps(configs), capture_output=True,
                         text=True, timeout=300, check=True, env=vllm_env())
    theirs = [x is True for x in json.loads(out.stdout.strip().splitlines()[-1])]
    assert ours == [True] * 4 + [False] * 5  # the cases mean what the table says
    assert theirs == ours
