"""What the model predicts for operators: per-request TTFT and TPOT (the distribution, from the replayed
acceptance) and memory (weights, packed copies, both KV caches; the batch a budget holds)."""
from __future__ import annotations

from dataclasses import replace

import types

import pytest
import torch

from specdec_tune.db import open_database
from specdec_tune.tuner.model import (
    Candidate,
    MemoryModel,
    ModelMemory,
    PromptSpec,
    SpecConfig,
    load_run_profile,
    predict_config,
    predict_latency,
    profiled_specs,
)
from specdec_tune.tuner.model import _latency_prediction


@pytest.fixture(scope="module")
def profile(tiny_model_dirs, tmp_path_factory):
    import json

    from specdec_tune.profiler.session import ProfileSession
    from tests.profiler.test_session import TINY

    root = tmp_path_factory.mktemp("opmodel")
    path = root / "w.jsonl"
    texts = ["def add(a, b):", "class Point:", "for i in range(10):", "x = [i * i for i", "import os\nimport sys"]
    path.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": t}) for i, t in enumerate(texts)) + "\n")
    db = open_database(f"sqlite:///{root / 'r.db'}")
    settings = type(TINY)(**{**TINY.__dict__, "max_prompts": 3, "max_new_tokens": 12})
    draft = tiny_model_dirs["draft"]
    run_id = ProfileSession(db, tiny_model_dirs["target"], [draft, "ngram"], str(path), settings).run().run_id
    return db, run_id, draft


CONFIGS = [SpecConfig(1), SpecConfig(3), SpecConfig(4, 0.3), SpecConfig(3, schedule="heuristic"), SpecConfig(0),
           SpecConfig(4, 0.3, threshold_kind="cumulative"), SpecConfig(4, 0.3, threshold_kind="adaptive", threshold_step=0.1)]


def _decomposed_seconds(rp, config) -> float:
    """Σ over requests of TTFT + TPOT·(n - 1): a request's whole time, rebuilt from its latency."""
    specs = profiled_specs(rp)
    lat = predict_latency(rp, config, specs)
    return sum(t + p * (rp.prompts[s.profiled_index].new_tokens - 1) for t, p, s in zip(lat.ttft_s, lat.tpot_s, specs))


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_latency_adds_up_to_the_predicted_seconds(profile, config):
    """TTFT + TPOT·(n - 1) of every request sums to the end-to-end prediction's seconds (another code
    path, :mod:`tuner.model._predict`): the latency split loses and invents no time."""
    db, run_id, _ = profile
    rp = load_run_profile(db, run_id, baseline_only=config.spec.num_speculative_tokens == 0)
    assert _decomposed_seconds(rp, config) == pytest.approx(predict_config(rp, config).seconds, rel=1e-9) \
        if config.spec.num_speculative_tokens else True
    if config.spec.num_speculative_tokens == 0:
        from specdec_tune.tuner.model import predict_baseline

        assert _decomposed_seconds(rp, config) == pytest.approx(predict_baseline(rp).seconds, rel=1e-9)


@pytest.mark.parametrize("plant", ["first cycle in the decode window", "overhead counted twice"])
def test_the_decomposition_check_has_power(profile, monkeypatch, plant):
    db, run_id, _ = profile
    rp = load_run_profile(db, run_id)
    config = SpecConfig(3)
    if plant == "first cycle in the decode window":
        original = _latency_prediction.simulate_config
        monkeypatch.setattr(_latency_prediction, "simulate_config",
                            lambda *a, **k: (lambda c: [c[0]] + c)(original(*a, **k)))
    else:
        original = _latency_prediction.timed_cycles

        def twice(rp_, cycles, b, prompt, *rest):  # the latency side only: each cycle's overhead counted twice
            times, slopes = original(rp_, cycles, b, prompt, *rest)
            # a loaded machine can measure the overhead at 0 (clipped): the plant then adds 0.1 ms, or it has no power
            return [t + max(rp_.cycle_overhead_s, 1e-4) for t in times], slopes

        monkeypatch.setattr(_latency_prediction, "timed_cycles", twice)
    assert _decomposed_seconds(rp, config) != pytest.approx(predict_config(rp, config).seconds, rel=1e-6)


def test_tpot_spread_comes_from_the_prompts(profile):
    db, run_id, draft = profile
    rp = load_run_profile(db, run_id, draft)
    lat = predict_latency(rp, SpecConfig(4), profiled_specs(rp))
    assert lat.source == "simulation" and len(lat.tpot_s) == 3 and lat.tpot(0.9) >= lat.tpot(0.5) > 0
    base = load_run_profile(db, run_id, baseline_only=True)
    plain = predict_latency(base, SpecConfig(0), profiled_specs(rp))
    assert plain.source == "baseline"
    # plain decoding: one step time, moved by each request's context as the profile's verify timings at
    # several context lengths say (a longer prompt is slower where a longer context measured slower)
    assert base.context_slope_s and 1 in base.context_slope_s
    sign = 1 if base.context_slope_s[1] > 0 else -1
    by_length = [t for _, t in sorted(zip((p.prompt_tokens + p.new_tokens / 2 for p in rp.prompts), plain.tpot_s))]
    assert by_length == sorted(by_length, reverse=sign < 0)
    flat = predict_latency(replace(base, context_slope_s={}), SpecConfig(0), profiled_specs(rp))
    assert len(set(flat.tpot_s)) == 1  # without the context timings: one step time
    ngram = predict_latency(load_run_profile(db, run_id, "ngram"), SpecConfig(3), profiled_specs(rp))
    assert ngram.source == "replay" and all(t > 0 for t in ngram.tpot_s)


def test_a_held_out_prompt_is_one_more_request_of_the_profiled_population(profile):
    db, run_id, draft = profile
    rp = load_run_profile(db, run_id, draft)
    config = SpecConfig(3)
    flat = replace(rp, context_slope_s={})  # the population alone, no context term
    profiled = predict_latency(flat, config, profiled_specs(rp))
    held = predict_latency(flat, config, [PromptSpec(rp.prompts[0].prompt_tokens, None, None)])
    assert sorted(held.tpot_s) == pytest.approx(sorted(profiled.tpot_s))  # the population's TPOTs
    slower = all(v > 0 for v in rp.context_slope_s.values())
    short, long_ = (predict_latency(rp, config, [PromptSpec(n, None, None)]) for n in (8, 400))
    if slower:  # the population moved to each prompt's length: a longer prompt, slower tokens
        assert long_.tpot(0.5) > short.tpot(0.5)
    assert held.tpot(0.5) == pytest.approx(profiled.tpot(0.5)) and len(held.ttft_s) == 1
    longer = predict_latency(rp, config, [PromptSpec(10 * rp.prompts[0].prompt_tokens, None, None)])
    assert longer.ttft_s[0] >= held.ttft_s[0]  # the prefill line in the prompt length
    assert held.scaled(2.0).tpot(0.5) == pytest.approx(held.tpot(0.5) / 2)


# --------------------------------------------------------------------------- memory


def test_model_memory_counts_the_tensors_the_engine_allocates(tiny_model_dirs):
    """Weights, KV bytes per position and the lean forward's packed copy, counted from the config, equal
    the bytes of the tensors the engine really holds after a speculative decode (GQA: 2 KV heads of 4)."""
    from specdec_tune.engine import DecodeConfig, load_model, speculative
    from specdec_tune.engine.drafters import build_drafter
    from specdec_tune.tuner.search._memory import model_memory

    loaded = load_model(tiny_model_dirs["target"], "cpu", "float32", "lean")
    draft = load_model(tiny_model_dirs["draft"], "cpu", "float32", "lean")
    record = types.SimpleNamespace(name="t", extra={"source": loaded.source}, dtype="float32",
                                   num_parameters=loaded.num_parameters)
    facts = model_memory(record, device="cpu", forward="lean")
    assert facts.weight_bytes == sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    ids = torch.tensor([5, 6, 7, 8, 9])
    config = DecodeConfig(max_new_tokens=6, num_speculative_tokens=3)
    from specdec_tune.engine.kvcache import make_cache

    cache = make_cache(loaded.model, 5 + 6 + 3 + 2)
    with torch.inference_mode():
        speculative(loaded.model, build_drafter(draft.model, max_len=16), ids, config, cache=cache)
    kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer._k, layer._v))
    assert facts.kv_bytes_per_token == kv / cache.max_len
    cfg = loaded.model.config
    assert facts.kv_bytes_per_token != 2 * cfg.num_hidden_layers * cfg.num_attention_heads * 8 * 4  # not all heads
    packed = loaded.model._packed
    assert packed is not None  # a verify of 4 positions packed the weights
    nbytes = torch.ops.mkldnn._nbytes
    held = sum(nbytes(w) for layer in packed[1] for w in (layer[0], layer[2], layer[4], layer[6])) + nbytes(packed[2])
    assert facts.packed_bytes == held
    assert model_memory(record, device="cpu", forward="hf").packed_bytes == 0  # HF's forward keeps no copy


def test_memory_with_cuda_graph_slots_counts_what_the_runner_allocates(tiny_model_dirs):
    """With CUDA graphs the predicted KV cache is the slot the runner allocates (rounded up) and the
    second weight copy is its concatenated q/k/v and gate/up weights: counted from the config, equal to
    the runner's tensors (its static-cache path, run eagerly on the CPU)."""
    from specdec_tune.engine import DecodeConfig, autoregressive, load_model
    from specdec_tune.engine.cuda_graphs import GraphRunner
    from specdec_tune.tuner.search._memory import model_memory

    loaded = load_model(tiny_model_dirs["target"], "cpu", "float32", "lean")
    lean = loaded.model
    lean.cuda_graph_runner = runner = GraphRunner(lean, capture=False)
    record = types.SimpleNamespace(name="t", extra={"source": loaded.source}, dtype="float32",
                                   num_parameters=loaded.num_parameters)
    facts = model_memory(record, device="cuda", forward="lean", graphs=True)
    with torch.inference_mode():
        autoregressive(lean, torch.tensor([5, 6, 7, 8, 9]), DecodeConfig(max_new_tokens=6))
    (slot,) = runner.slots
    assert facts.kv_bytes_per_token * slot.length == slot.nbytes
    fused = sum(t.numel() * t.element_size() for layer in runner._fused[1] for t in layer if t is not None)
    assert facts.packed_bytes == fused and facts.packs(1)
    predicted = MemoryModel(facts, {}, context=5 + 6, graph_slots=True).breakdown(Candidate("none", 0))
    assert predicted.target_kv == slot.nbytes and predicted.packed == fused
    assert MemoryModel(facts, {}, context=5 + 6).breakdown(Candidate("none", 0)).target_kv < slot.nbytes


def test_max_batch_size_and_the_draft_cost_in_batch():
    target = ModelMemory("t", weight_bytes=1000.0, kv_bytes_per_token=1.0)
    draft = ModelMemory("d", weight_bytes=200.0, kv_bytes_per_token=0.25)
    mm = MemoryModel(target, {"d": draft}, context=98)  # plain: 99 positions; N = 2: 102
    plain, spec, ngram = Candidate("none", 0), Candidate("d", 2), Candidate("ngram", 2)
    assert mm.bytes(plain, 4) == 1000 + 4 * 99
    assert mm.bytes(spec, 4) == 1200 + 4 * 102 * 1.25
    budget = 3000.0
    assert mm.max_batch_size(plain, budget) == (3000 - 1000) // 99 == 20
    assert mm.max_batch_size(spec, budget) == int((3000 - 1200) // (102 * 1.25)) == 14
    assert mm.max_batch_size(ngram, budget) == (3000 - 1000) // 102 == 19
    assert mm.draft_cost_in_batch(spec, budget) == 6 and mm.max_batch_size(spec, 1000.0) == 0
    breakdown = mm.breakdown(spec, 2).to_dict()
    assert breakdown["draft_kv"] == 2 * 102 * 0.25 and breakdown["total"] == mm.bytes(spec, 2)


@pytest.mark.slow
def test_peak_memory_of_the_bundled_models_within_ten_percent():
    """Measured in a fresh process (profiler/memory.py) on this machine: plain decoding and the 2-layer
    draft, 64 new tokens; the prediction within 10 %."""
    from specdec_tune.engine import load_model
    from specdec_tune.profiler.memory import measure_peak_memory
    from specdec_tune.tuner.search._memory import model_memory

    def rec(name: str):
        m = load_model(name, "cpu")
        return types.SimpleNamespace(name=name, extra={"source": m.source}, dtype="float32",
                                     num_parameters=m.num_parameters)

    mm_target = model_memory(rec("mini-target"), device="cpu", forward="lean")
    draft = model_memory(rec("mini-draft-2l"), device="cpu", forward="lean")
    for name, n in (("none", 0), ("mini-draft-2l", 4)):
        m = measure_peak_memory("mini-target", name, n, "def fibonacci(n):\n    return", max_new_tokens=64)
        predicted = MemoryModel(mm_target, {"mini-draft-2l": draft}, m.prompt_tokens + 64).bytes(Candidate(name, n))
        assert m.baseline_bytes > 100 * 2**20  # the interpreter, torch and transformers: subtracted
        assert abs(predicted - m.bytes) / m.bytes < 0.10, (name, predicted, m)


def test_plain_decoding_packs_only_when_its_prefill_is_between_2_and_128_tokens():
    """Measured: plain decoding of a 300-token prompt never runs a 2..128-token forward, so the lean
    forward keeps no packed copy (38 MiB peak, not 65); a speculating target always verifies >= 2 tokens."""
    target = ModelMemory("t", 1000.0, 1.0, packed_bytes=1000.0)
    draft = ModelMemory("d", 100.0, 0.5, packed_bytes=100.0)
    mm = MemoryModel(target, {"d": draft}, context=364)
    plain = Candidate("none", 0)
    assert mm.breakdown(plain, prompt_tokens=300).packed == 0
    assert mm.breakdown(plain, prompt_tokens=100).packed == 1000 == mm.breakdown(plain).packed
    assert mm.breakdown(Candidate("d", 3), prompt_tokens=300).packed == 1100


@pytest.mark.gpu
def test_peak_memory_on_a_gpu_is_max_memory_allocated_within_ten_percent():
    """On CUDA the probe reports ``torch.cuda.max_memory_allocated`` over the decode (no baseline to
    subtract); the bundled models in bf16 (no packed copy on a GPU) within 10 % of the prediction."""
    from specdec_tune.engine import load_model
    from specdec_tune.profiler.memory import measure_peak_memory
    from specdec_tune.tuner.search._memory import model_memory

    def rec(name: str):
        m = load_model(name, "cuda")
        return types.SimpleNamespace(name=name, extra={"source": m.source}, dtype=str(m.dtype).replace("torch.", ""),
                                     num_parameters=m.num_parameters)

    target = model_memory(rec("mini-target"), device="cuda", forward="auto")
    draft = model_memory(rec("mini-draft-2l"), device="cuda", forward="auto")
    assert target.packed_bytes == 0
    for name, n in (("none", 0), ("mini-draft-2l", 4)):
        m = measure_peak_memory("mini-target", name, n, "def fibonacci(n):\n    return", max_new_tokens=256,
                                device="cuda")
        assert m.baseline_bytes == 0 and "max_memory_allocated" in m.method
        predicted = MemoryModel(target, {"mini-draft-2l": draft}, m.prompt_tokens + 256).breakdown(
            Candidate(name, n), 1, m.prompt_tokens + 256, m.prompt_tokens).total
        assert abs(predicted - m.bytes) / m.bytes < 0.10, (name, predicted, m)


def test_the_profile_times_each_draft_position_and_the_model_charges_it(profile):
    """The profile's acceptance pass keeps the in-loop time of each draft forward of a cycle by its
    position, and the model's cycle pays the positions it ran (a longer cycle is not F × one mean)."""
    from specdec_tune.tuner.model._predict import cycle_s
    from specdec_tune.tuner.model._greedy_sim import SimulatedCycle

    db, run_id, draft = profile
    rp = load_run_profile(db, run_id, draft)
    warm = rp.model.draft_warmup_s
    assert len(warm) >= 1
    flat = replace(rp, model=replace(rp.model, draft_warmup_s=()))
    for forwards in (1, 2, 3):
        c = SimulatedCycle(forwards, 0, forwards)
        assert cycle_s(rp, c, 1) - cycle_s(flat, c, 1) == pytest.approx(sum(warm[: forwards - 1]), abs=1e-12)
