"""vLLM serves the bundled target with the bundled EAGLE-3 head from our exported config (issue 39, part 5):
greedy outputs equal ours and plain decoding's, and vLLM's per-step accepted counts equal ours.

Needs the vLLM environment (``SPECDEC_VLLM_PYTHON``; skipped with that reason otherwise). Our engine runs
with vLLM's schedule (``profiler/backends/_vllm_parity.py``: the prefill token undrafted, K drafted
whatever is left of max_tokens); vLLM's EAGLE proposer drafts the head's greedy chain from the target's
hidden states (``v1/spec_decode/llm_base_proposer.py``, ``draft_sample_method`` "greedy" by default), so
with the same head, the same three target layers (``llama.py``'s default (2, L // 2, L - 3)) and the same
d2t mapping the drafts are the same tokens and the counts must be equal, step by step. A feature read
off by one position, another layer triple, a wrong d2t or vLLM ignoring the batch-size schedule changes
the drafts and fails the equality; a plain equality of outputs alone could not (greedy verification
makes any drafter's output the target's).
"""
from __future__ import annotations

import pytest

from specdec_tune.profiler.backends._vllm import SpecCounters, counters_from_steps
from tests.tuner.servers.test_vllm_consumer import MAX_TOKENS, _ours, exported_vllm_config, k_at

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HEAD = "mini-eagle3"
HELD_OUT = 3


@pytest.fixture(scope="module")
def worker(vllm_python):
    from specdec_tune.profiler.backends._vllm import VllmWorker

    with VllmWorker(vllm_python) as w:
        yield w


@pytest.fixture(scope="module")
def models():
    from specdec_tune.engine import load_model

    head = load_model(HEAD, "cpu", "float32", "auto")
    assert head.forward == "eagle3", "the bundled head is not loaded as an EAGLE-3 head"
    return load_model("mini-target", "cpu", "float32", "auto"), head


@pytest.fixture(scope="module")
def prompts(models):
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.runs import encode_prompt

    items = load_workload("functions")
    warm = encode_prompt(models[0], items[0].prompt, items[0].id).tolist()
    return warm, [encode_prompt(models[0], p.prompt, p.id).tolist() for p in items[-HELD_OUT:]]


def test_exported_eagle3_config_runs_in_vllm_with_our_outputs_and_counts(worker, models, prompts, tmp_path):
    from specdec_tune.engine import zoo

    # K at B = 1 below num_speculative_tokens: vLLM ignoring the schedule for EAGLE would draft more.
    config = exported_vllm_config(tmp_path, HEAD, 3, {1: 3, 2: 5})
    assert config["method"] == "eagle3" and config["model"] == zoo.resolve_model(HEAD)
    k1 = k_at(config, 1)
    assert k1 == 3 < config["num_speculative_tokens"] == 5

    worker.start(str(zoo.resolve_model("mini-target")), config, enforce_eager=True)
    warm, held = prompts
    worker.generate([warm], MAX_TOKENS)  # warm-up, excluded from the counters' deltas
    res = worker.generate(held, MAX_TOKENS, concurrency=1)

    ours, outs, baseline = _ours(models, held, "model", k1)
    assert [o.token_ids for o in res.outputs] == outs == baseline  # vLLM with our head == ours == plain
    got = res.counters
    assert got is not None and got.drafts > 0
    assert got.accepted_per_pos[k1 - 1] > 0, "no draft accepted at the last position: the test has no power there"
    assert all(x == 0 for x in got.accepted_per_pos[k1:])
    assert got == SpecCounters(ours.drafts, ours.draft_tokens, ours.accepted, ours.padded(len(got.accepted_per_pos)))
    steps = [counters_from_steps(o.steps_accepted, o.steps_drafted, len(got.accepted_per_pos)) for o in res.outputs]
    assert sum(steps[1:], steps[0]) == got

    both = worker.generate(held[:2], MAX_TOKENS, concurrency=2)  # B = 2: the schedule's K is 5
    assert max(max(o.steps_drafted) for o in both.outputs) == k_at(config, 2) == 5
    assert [o.token_ids for o in both.outputs] == outs[:2]

