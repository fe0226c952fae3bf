"""vLLM as a real consumer: the exported ``--speculative-config`` files run in vLLM, greedy outputs
equal our engine's, and vLLM's per-position accepted counts equal ours on the same prompts.

Needs the vLLM environment (``bash scripts/setup_vllm_env.sh``, then ``SPECDEC_VLLM_PYTHON``); skipped
with that reason otherwise. One worker process serves both configurations. vLLM runs eager
(``enforce_eager``: no compilation, a start of ~15-30 s instead of ~1 min; outputs and counts do not
depend on it).

What "equal counts" means (profiler/backends/_vllm_parity.py has the reasons, read in vLLM 0.32.0's source):
vLLM's first output token comes from the prefill undrafted and it drafts K tokens whatever is left
of max_tokens, and its n-gram proposer continues the earliest occurrence of the matched suffix. Our
engine is run with those three rules (``engine_like_vllm``, ``VllmNgramDrafter``); its counters must
then equal vLLM's exactly. Counters are deltas around the measured call, so the warm-up request is
excluded (and a leak would break the equality).
"""
from __future__ import annotations

import json

import pytest
import torch

from specdec_tune.profiler.backends._vllm import SpecCounters, counters_from_steps

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_TOKENS = 40
HELD_OUT = 3  # the workload's last prompts: never in a profile of its first prompts


@pytest.fixture(scope="module")
def worker(vllm_python):
    from specdec_tune.profiler.backends._vllm import VllmWorker

    with VllmWorker(vllm_python) as w:
        yield w


@pytest.fixture(scope="module")
def models():
    from specdec_tune.engine import load_model

    return load_model("mini-target", "cpu", "float32", "auto"), load_model("mini-draft-1l", "cpu", "float32", "auto")


@pytest.fixture(scope="module")
def prompts(models):
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.runs import encode_prompt

    target = models[0]
    items = load_workload("docstrings")
    warm = encode_prompt(target, items[0].prompt, items[0].id).tolist()
    return warm, [encode_prompt(target, p.prompt, p.id).tolist() for p in items[-HELD_OUT:]]


def exported_vllm_config(tmp_path, drafter: str, n: int, per_batch_size: dict[int, int], **cand) -> dict:
    """The vLLM file the tuner's exporter writes for a result (read back as a user's server would)."""
    from specdec_tune.tuner.model import Candidate, TuningResult
    from specdec_tune.tuner.servers import write_exports

    result = TuningResult(candidate=Candidate(drafter, n, **cand), server="vllm", target="mini-target",
                          workload="docstrings", per_batch_size=per_batch_size)
    written = write_exports(result, ["vllm"], tmp_path)
    path = next(p for p in written["vllm"] if p.name == "speculative_config.json")
    return json.loads(path.read_text())


def k_at(config: dict, batch: int) -> int:
    """vLLM's K at a batch size: the schedule's range holding it, clamped to num_speculative_tokens."""
    for lo, hi, k in config.get("num_speculative_tokens_per_batch_size") or []:
        if lo <= batch <= hi:
            return min(k, config["num_speculative_tokens"])
    return config["num_speculative_tokens"]


def _ours(models, prompts, kind: str, k: int, ngram: tuple[int, int] = (1, 3)):
    from specdec_tune.engine import DecodeConfig, autoregressive
    from specdec_tune.profiler.backends._vllm_parity import engine_like_vllm, fresh_drafter

    target, draft = models
    total, outs, baseline = SpecCounters(), [], []
    for ids in prompts:
        p = torch.tensor(ids)
        drafter = fresh_drafter(kind, draft.model, len(ids) + MAX_TOKENS + k + 2, ngram_min=ngram[0], ngram_max=ngram[1])
        run = engine_like_vllm(target.model, drafter, p, MAX_TOKENS, k, target.eos_token_id)
        total = total + run.counters(k)
        outs.append(run.token_ids)
        with torch.inference_mode():
            baseline.append(autoregressive(target.model, p, DecodeConfig(MAX_TOKENS, eos_token_id=target.eos_token_id)).token_ids)
    return total, outs, baseline


CASES = {
    # Schedules whose K at batch size 1 is below num_speculative_tokens: vLLM ignoring the schedule
    # would draft more per step and fail the count equality.
    "draft_model": dict(drafter="mini-draft-1l", n=3, per_batch_size={1: 3, 2: 5, 8: 2}, kind="model"),
    "ngram": dict(drafter="ngram", n=2, per_batch_size={1: 2, 2: 4, 4: 0}, kind="vllm-ngram",
                  cand={"ngram_max": 3, "ngram_min": 1}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_exported_config_runs_in_vllm_with_our_outputs_and_counts(name, worker, models, prompts, tmp_path):
    from specdec_tune.engine import zoo

    case = CASES[name]
    config = exported_vllm_config(tmp_path, case["drafter"], case["n"], case["per_batch_size"], **case.get("cand", {}))
    assert config.get("num_speculative_tokens_per_batch_size"), config  # the schedule is in the file
    k1 = k_at(config, 1)
    assert k1 == case["n"] < config["num_speculative_tokens"]

    seconds = worker.start(str(zoo.resolve_model("mini-target")), config, enforce_eager=True)
    assert seconds > 0
    warm, held = prompts
    worker.generate([warm], MAX_TOKENS)  # warm-up, excluded from the deltas below
    res = worker.generate(held, MAX_TOKENS, concurrency=1)

    ngram = (config.get("prompt_lookup_min", 1), config.get("prompt_lookup_max", 3))
    ours, outs, baseline = _ours(models, held, case["kind"], k1, ngram)
    vllm_outs = [o.token_ids for o in res.outputs]
    assert vllm_outs == outs == baseline  # greedy: vLLM speculative == ours == plain decoding

    got = res.counters
    assert got is not None and got.drafts > 0
    # vLLM's vector has num_speculative_tokens positions; at B = 1 the schedule's K bounds the draft.
    assert len(got.accepted_per_pos) == config["num_speculative_tokens"]
    assert all(x == 0 for x in got.accepted_per_pos[k1:])
    assert got.draft_tokens <= k1 * got.drafts
    assert got == SpecCounters(ours.drafts, ours.draft_tokens, ours.accepted, ours.padded(len(got.accepted_per_pos)))
    # The deltas hold exactly the measured requests: their own per-step records add up to them.
    steps = [counters_from_steps(o.steps_accepted, o.steps_drafted, len(got.accepted_per_pos)) for o in res.outputs]
    assert sum(steps[1:], steps[0]) == got

    if name == "draft_model":
        # Two requests at once: the schedule's K for B = 2 (5) is used, not B = 1's (3).
        both = worker.generate(held[:2], MAX_TOKENS, concurrency=2)
        assert both.counters.draft_tokens > k1 * both.counters.drafts
        assert max(max(o.steps_drafted) for o in both.outputs) == k_at(config, 2) == 5
        assert [o.token_ids for o in both.outputs] == outs[:2]
