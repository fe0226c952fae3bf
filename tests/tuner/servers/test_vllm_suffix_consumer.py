"""vLLM's ``method: "suffix"`` as a real consumer of our suffix export: the exported file runs in vLLM (CPU,
arctic-inference built by ``scripts/setup_arctic_inference.sh``), its greedy outputs equal ours, and vLLM's
accepted counts equal our suffix drafter's on the same requests in the same order, so the global tree over
earlier responses is the same in both.

Our side runs as vLLM schedules (``profiler/backends/_vllm_parity.py``: the prefill token undrafted, drafts
never cut by max_tokens, ``VllmSuffixDrafter``: the request's prompt alone starts its tree and the last
step's tokens are the last it learns). The configuration keeps 2 cached responses of 6 requests, so FIFO
eviction happens, and sets a spec factor and a min token probability other than vLLM's defaults. Power: the
same requests drafted from a cold history (each request its own tree only) give other counts.
"""
from __future__ import annotations

import json

import pytest
import torch

from tests.support.arctic import vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_TOKENS = 40
FIELDS = (16, 2, 2.0, 0.05)  # depth, cached requests, spec factor, min token prob
N = 5


@pytest.fixture(scope="module")
def target():
    from specdec_tune.engine import load_model

    return load_model("mini-target", "cpu", "float32", "auto")


def _ours(target, prompts, cached: int):
    from specdec_tune.core.suffix_cache import SuffixCache
    from specdec_tune.profiler.backends._vllm import SpecCounters
    from specdec_tune.profiler.backends._vllm_parity import VllmSuffixDrafter, engine_like_vllm
    from specdec_tune.tuner.search._space import suffix_candidate

    spec = suffix_candidate(N, (FIELDS[0], cached, *FIELDS[2:]))
    cache = SuffixCache(FIELDS[0], cached)
    total, outs = SpecCounters(), []
    for ids in prompts:
        run = engine_like_vllm(target.model, VllmSuffixDrafter(cache, spec, len(ids), MAX_TOKENS), torch.tensor(ids),
                               MAX_TOKENS, N, target.eos_token_id)
        total, outs = total + run.counters(N), outs + [run.token_ids]
    return total, outs


def test_exported_suffix_config_runs_in_vllm_with_our_counts(vllm_python, target, tmp_path):
    import subprocess

    from specdec_tune.engine import zoo
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.backends._vllm import VllmWorker
    from specdec_tune.profiler.runs import encode_prompt
    from specdec_tune.tuner.model import TuningResult
    from specdec_tune.tuner.search._space import suffix_candidate
    from specdec_tune.tuner.servers import write_exports

    probe = subprocess.run([str(vllm_python), "-c", "import arctic_inference.suffix_decoding"], capture_output=True,
                           env=vllm_env())
    if probe.returncode != 0:
        pytest.skip("arctic-inference is not importable in the vLLM venv (vLLM refuses method 'suffix' without it): "
                    "bash scripts/setup_arctic_inference.sh")
    result = TuningResult(candidate=suffix_candidate(N, FIELDS), server="vllm", target="mini-target", workload="edits")
    written = write_exports(result, ["vllm"], tmp_path)
    config = json.loads(next(p for p in written["vllm"] if p.name == "speculative_config.json").read_text())
    assert config["method"] == "suffix" and config["suffix_decoding_max_cached_requests"] == 2

    items = load_workload("edits")[:6]  # two three-turn sessions: later turns repeat earlier answers
    prompts = [encode_prompt(target, p.prompt, p.id).tolist() for p in items]
    with VllmWorker(vllm_python) as worker:
        worker.start(str(zoo.resolve_model("mini-target")), config, enforce_eager=True)
        res = worker.generate(prompts, MAX_TOKENS, concurrency=1)

    ours, outs = _ours(target, prompts, FIELDS[1])
    assert [o.token_ids for o in res.outputs] == outs  # greedy: the same tokens
    got = res.counters
    assert got is not None and got.accepted > 20  # suffix drafts were accepted
    assert got == ours
    cold, _ = _ours(target, prompts, 0)
    assert cold != got  # the global tree decided some drafts: a cold history is told apart
