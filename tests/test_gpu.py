"""GPU path (skipped without CUDA): engine equality on cuda, CUDA-event timing, the bf16 consistency rule,
profile with NVML telemetry, measure with a CI, tune --objective energy, a real-size shape with synthetic
acceptance."""
from __future__ import annotations

import pytest
import torch

from specdec_tune.engine import DecodeConfig, ModelDrafter, autoregressive, speculative
from specdec_tune.profiler.timers import Stopwatch, time_callable
from tests.support.tiny import tiny_llama

pytestmark = pytest.mark.gpu


def test_greedy_equality_on_cuda():
    target = tiny_llama(64, layers=2, seed=0, dtype=torch.float32).cuda()
    draft = tiny_llama(64, layers=1, seed=1, dtype=torch.float32).cuda()
    prompt = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.inference_mode():
        base = autoregressive(target, prompt, DecodeConfig(max_new_tokens=40)).token_ids
        for n in (1, 4, 8):
            out = speculative(target, ModelDrafter(draft, 128), prompt, DecodeConfig(max_new_tokens=40, num_speculative_tokens=n))
            assert out.token_ids == base


def test_cuda_event_stopwatch_measures_gpu_work():
    x = torch.randn(2048, 2048, device="cuda")
    watch = Stopwatch("cuda")
    assert watch.cuda
    samples = time_callable(lambda: x @ x, warmup=2, repeats=5, device="cuda")
    assert all(s > 0 for s in samples.samples)
    # Ten matmuls take longer than one: the events bracket real work, not just the launch.
    ten = time_callable(lambda: [x @ x for _ in range(10)], warmup=1, repeats=5, device="cuda")
    assert ten.median > 3 * samples.median


def test_lean_forward_on_cuda_matches_hf_and_decodes_the_same():
    from specdec_tune.engine import make_cache, wrap_forward

    target = tiny_llama(64, layers=3, seed=2, dtype=torch.float32).cuda()
    lean = wrap_forward(target, "lean")
    seq = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.inference_mode():
        full = target(input_ids=seq).logits
        cache = make_cache(lean, 32)
        head = lean(input_ids=seq[:, :20], past_key_values=cache, use_cache=True).logits
        tail = lean(input_ids=seq[:, 20:], past_key_values=cache, use_cache=True).logits
        torch.testing.assert_close(torch.cat([head, tail], dim=1), full, rtol=1e-4, atol=1e-4)
        prompt = seq[0, :12]
        base = autoregressive(target, prompt, DecodeConfig(max_new_tokens=40)).token_ids
        draft = wrap_forward(tiny_llama(64, layers=1, seed=3, dtype=torch.float32).cuda())
        out = speculative(lean, ModelDrafter(draft, 128), prompt, DecodeConfig(max_new_tokens=40, num_speculative_tokens=4))
    assert out.token_ids == base


def test_bf16_rule_on_cuda_with_the_bundled_models():
    """The consistency rule in bf16 on the GPU: speculative vs target-only, no `differ` (identical or
    near-ties only; specdec_tune.core.consistency)."""
    from specdec_tune.engine import load_model
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.logit_margins import check_outputs
    from specdec_tune.profiler.runs import DraftSpec, decode_once, encode_prompt

    target, draft = load_model("mini-target", "cuda", "bf16"), load_model("mini-draft-1l", "cuda", "bf16")
    cfg = DecodeConfig(max_new_tokens=32, num_speculative_tokens=4, eos_token_id=target.eos_token_id)
    statuses = []
    for p in load_workload("functions")[:8]:
        ids = encode_prompt(target, p.prompt, p.id)
        ref = decode_once(target, DraftSpec("none"), ids, cfg).token_ids
        out = decode_once(target, DraftSpec("model", draft), ids, cfg).token_ids
        statuses.append(check_outputs(target, ids, ref, out).status)
    assert "differ" not in statuses, statuses


def test_profile_stores_nvml_telemetry_and_measure_has_a_ci(tmp_path):
    pytest.importorskip("pynvml")
    from specdec_tune.db import load_telemetry, open_database
    from specdec_tune.profiler import ProfileSettings, run_profile
    from specdec_tune.tuner.model import SpecConfig
    from specdec_tune.tuner.search import measure_predicted

    db = open_database(f"sqlite:///{tmp_path / 'gpu.db'}")
    settings = ProfileSettings(device="cuda", max_prompts=2, max_new_tokens=16, repeats=3, k_max=5, n_max=4,
                               context_lens=(64,), overhead_prompts=1, overhead_ns=(1,))
    result = run_profile(db, "mini-target", ["mini-draft-1l"], "functions", settings)
    from specdec_tune.db import get_run

    assert get_run(db, result.run_id).settings.cuda_graphs_used == "on"  # profiled through the graphs
    rows = load_telemetry(db, result.run_id)
    assert result.telemetry["monitor"] == "nvml" and result.telemetry["energy_j"] > 0
    assert len(rows) >= 2 and all(r.power_w and r.power_w > 0 for r in rows)
    got = measure_predicted(db, result.run_id, [(None, SpecConfig(2)), ("none", SpecConfig(0))], split="holdout",
                            max_prompts=2, repeats=2)
    assert got[0].measurement.ci95 is not None and got[0].prediction.tokens_per_s > 0


def test_cuda_graphs_decode_what_eager_decodes_in_fp32():
    """The contract of engine.cuda_graphs: replayed graphs give the eager forward's greedy outputs (fp32),
    for plain and speculative decoding, and the graphs were captured and replayed (none failed)."""
    from specdec_tune.engine import load_model
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.runs import DraftSpec, decode_once, encode_prompt

    graphed = [load_model(m, "cuda", "fp32", "lean", "on") for m in ("mini-target", "mini-draft-1l")]
    eager = [load_model(m, "cuda", "fp32", "lean", "off") for m in ("mini-target", "mini-draft-1l")]
    for p in load_workload("functions")[:6]:
        ids = encode_prompt(graphed[0], p.prompt, p.id)
        for n in (0, 1, 4, 8):
            cfg = DecodeConfig(max_new_tokens=48, num_speculative_tokens=max(n, 1))
            outs = [decode_once(t, DraftSpec("none") if n == 0 else DraftSpec("model", d), ids, cfg).token_ids
                    for t, d in (graphed, eager)]
            assert outs[0] == outs[1], (p.id, n)
    for m in graphed:
        runner = m.model.cuda_graph_runner
        assert runner.failed is None and runner.captured >= 2 and m.cuda_graphs == "on"


def test_shape_with_synthetic_acceptance_on_cuda():
    """A real-size shape (Llama-3.2-1B, bf16, seeded random weights) decodes on the GPU and accepts at the
    given rate."""
    from specdec_tune.engine import acceptance_per_position, build_drafter, load_model

    target = load_model("shape:llama-3.2-1b", "cuda", "bf16")
    draft = load_model("shape:llama-3-draft-2l", "cuda", "bf16")
    ids = torch.tensor(target.tokenizer.encode("def add(a, b):\n    return a + b"), device="cuda")
    cfg = DecodeConfig(max_new_tokens=200, num_speculative_tokens=3, synthetic_acceptance=(0.7,))
    with torch.inference_mode():
        result = speculative(target.model, build_drafter(draft.model, max_len=300), ids, cfg)
    alpha, _ = acceptance_per_position(result.cycles)
    assert alpha == pytest.approx([0.7, 0.7, 0.7], abs=0.05)


def test_tune_energy_end_to_end_on_cuda(tmp_path, capsys):
    """``tune --objective energy`` with the real NVML: the profile's power from its telemetry, every
    confirmed configuration's joules per token from the energy counter, the held-out value with its CI.
    (On a CPU the same path runs against a fake NVML: tests/tuner/search/test_objectives.py.)"""
    pytest.importorskip("pynvml")
    import json

    from specdec_tune.cli import main

    code = main(["tune", "--target", "mini-target", "--drafts", "mini-draft-1l,ngram", "--workload", "functions",
                 "--device", "cuda", "--db", f"sqlite:///{tmp_path / 'e.db'}", "--max-prompts", "4",
                 "--max-new-tokens", "32", "--n-max", "4", "--measure-prompts", "4", "--heldout-prompts", "4",
                 "--repeats", "3", "--measure-top", "2", "--trials", "8", "--objective", "energy", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    o = json.loads(out.strip().splitlines()[-1])["objective"]
    assert o["objective"] == "energy" and o["watts"] > 0
    for side in (o["winner"], o["plain"]):
        assert side["measured"] == "held-out prompts" and side["value"] > 0
        assert side["ci"] is None or side["ci"][0] <= side["value"] <= side["ci"][1]
