"""``bench --compare vllm``: the wiring with a stand-in for vLLM (no vLLM needed), and the real
command end to end when the vLLM environment is configured (``vllm`` marker)."""
from __future__ import annotations

import json

import pytest
import torch

from specdec_tune.cli import main
from specdec_tune.engine import DecodeConfig, autoregressive, load_model
from specdec_tune.profiler.bench import OURS, VLLM_METHODS, run_bench
from specdec_tune.profiler.backends._vllm import SpecCounters, resolve_vllm_python


class FakePair:
    """Answers like VllmPair: the target's greedy tokens, a fixed time, counters per speculative call."""

    def __init__(self, target, seconds: dict[str, float]):
        self.target, self.seconds, self.calls = target, seconds, []
        self.reset_counts()

    def reset_counts(self):
        self.counters = None

    def run(self, kind, prompt, max_tokens):
        self.calls.append(kind)
        out = autoregressive(self.target.model, torch.tensor(prompt), DecodeConfig(max_tokens, eos_token_id=self.target.eos_token_id))
        if kind == "speculative":
            c = SpecCounters(1, 2, 1, (1, 0))
            self.counters = c if self.counters is None else self.counters + c
        return out.token_ids, self.seconds[kind]

    def summary(self):
        return {"counters": self.counters.to_json()}


@pytest.fixture(scope="module")
def tiny(tiny_model_dirs):
    t = load_model(tiny_model_dirs["target"], "cpu", "float32", "auto")
    d = load_model(tiny_model_dirs["draft"], "cpu", "float32", "auto")
    ids = [t.tokenizer(s, return_tensors="pt").input_ids[0] for s in ("def add(a, b):", "class Point:\n", "for i in")]
    return t, d, ids


def test_bench_interleaves_vllm_and_reports_ratios_with_cis(tiny):
    t, d, ids = tiny
    pair = FakePair(t, {"plain": 0.5, "speculative": 0.25})
    res = run_bench(t, d, ids, num_speculative_tokens=2, max_new_tokens=6, repeats=2, methods=OURS + VLLM_METHODS, vllm=pair)
    # one warm-up call each, then prompt by prompt both engines in turn
    assert pair.calls == ["plain", "speculative"] * (1 + len(ids) * 2)
    assert res.identical  # the stand-in decodes greedily with the same target
    assert res.methods["vllm_speculative"].tokens_per_s == pytest.approx(2 * res.methods["vllm_plain"].tokens_per_s)
    js = res.to_json()
    assert js["ratios"]["vllm_speculative/vllm_plain"] == pytest.approx(2.0)
    lo, hi = js["ratio_ci95"]["ours_baseline/vllm_plain"]
    assert lo <= js["ratios"]["ours_baseline/vllm_plain"] <= hi
    # counters cover the measured calls only: the warm-up's were reset
    assert js["vllm"]["counters"]["drafts"] == len(ids) * 2


def test_bench_vllm_methods_need_engines(tiny):
    t, d, ids = tiny
    with pytest.raises(ValueError, match="vllm"):
        run_bench(t, d, ids, num_speculative_tokens=2, max_new_tokens=4, methods=VLLM_METHODS)


@pytest.mark.vllm
@pytest.mark.slow
def test_bench_compare_vllm_end_to_end(capsys):
    python = resolve_vllm_python(None)
    if python is None:
        pytest.skip("no vLLM environment configured: run scripts/setup_vllm_env.sh and set SPECDEC_VLLM_PYTHON")
    code = main(["bench", "--target", "mini-target", "--draft", "mini-draft-1l", "-N", "3", "--workload", "tables",
                 "--max-prompts", "2", "--max-new-tokens", "24", "--compare", "vllm", "--vllm-enforce-eager",
                 "--vllm-python", str(python), "--json"])
    res = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(res["tokens_per_s"]) == {"ours_baseline", "ours_speculative", "vllm_plain", "vllm_speculative"}
    assert res["outputs_identical"] is True
    assert res["vllm"]["speculative_config"]["method"] == "draft_model"
    assert res["vllm"]["speculative_config"]["num_speculative_tokens"] == 3
    assert res["vllm"]["counters"]["drafts"] > 0 and all(s > 0 for s in res["vllm"]["start_seconds"].values())
    assert "ours_speculative/vllm_speculative" in res["ratio_ci95"]
