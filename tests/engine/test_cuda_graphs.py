"""The CUDA-graph runner's static-cache forward (engine.cuda_graphs), checked on the CPU: run eagerly
(``capture=False``) it is the function a graph replays, so it must decode exactly what the eager lean
forward decodes, share slots between consecutive sequences, and refuse what it cannot run."""
from __future__ import annotations

import pytest
import torch

from specdec_tune.engine import DecodeConfig, ModelDrafter, autoregressive, make_cache, speculative, wrap_forward
from specdec_tune.engine.cuda_graphs import GraphCache, GraphRunner, slot_length
from tests.support.tiny import tiny_llama


def _static(model: torch.nn.Module) -> torch.nn.Module:
    lean = wrap_forward(model, "lean")
    lean.cuda_graph_runner = GraphRunner(lean, capture=False)
    return lean


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(64, layers=3, seed=2, sharpness=3.0, dtype=torch.float32)  # GQA: 4 heads, 2 KV heads
    draft = tiny_llama(64, layers=1, seed=3, sharpness=3.0, dtype=torch.float32)
    return target, draft


@pytest.mark.slow
def test_static_forward_decodes_what_the_eager_lean_forward_decodes(pair):
    target, draft = pair
    eager_t, eager_d = wrap_forward(target, "lean"), wrap_forward(draft, "lean")
    static_t, static_d = _static(target), _static(draft)
    with torch.inference_mode():
        for seed in range(3):
            prompt = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(seed))
            base = autoregressive(eager_t, prompt, DecodeConfig(max_new_tokens=40)).token_ids
            assert autoregressive(static_t, prompt, DecodeConfig(max_new_tokens=40)).token_ids == base
            for n in (1, 4, 8):
                cfg = DecodeConfig(max_new_tokens=40, num_speculative_tokens=n)
                ours = speculative(static_t, ModelDrafter(static_d, 128), prompt, cfg)
                ref = speculative(eager_t, ModelDrafter(eager_d, 128), prompt, cfg)
                assert ours.token_ids == ref.token_ids == base
                assert [c.accepted for c in ours.cycles] == [c.accepted for c in ref.cycles]
    runner = static_t.cuda_graph_runner
    assert len(runner.slots) == 1  # consecutive sequences reuse one slot (and its graphs)
    assert {k for k, _ in runner.slots[0].graphs} >= {1, 2, 5, 9}  # plain steps and verify forwards


def test_static_forward_logits_match_hf_and_a_wrong_mask_is_caught(pair, monkeypatch):
    target, _ = pair
    lean = _static(target)
    seq = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = target(input_ids=seq).logits

        def run() -> torch.Tensor:
            cache = make_cache(lean, 32)
            assert isinstance(cache, GraphCache)
            head = lean(input_ids=seq[:, :20], past_key_values=cache, use_cache=True).logits  # eager prefill
            mid = lean(input_ids=seq[:, 20:21], past_key_values=cache, use_cache=True).logits  # k = 1
            tail = lean(input_ids=seq[:, 21:], past_key_values=cache, use_cache=True).logits  # k = 3
            assert cache.get_seq_length() == 24
            return torch.cat([head, mid, tail], dim=1)

        torch.testing.assert_close(run(), full, rtol=1e-4, atol=1e-4)
        # Power: a mask that lets each row see one position further (a stale or future key) is caught.
        import specdec_tune.engine.cuda_graphs as cg

        monkeypatch.setattr(cg, "attention_mask", lambda pos, slots, dtype: torch.zeros(
            pos.shape[0], slots.shape[0], dtype=dtype).masked_fill_(slots[None, :] > pos[:, None] + 1, float("-inf")))
        lean.cuda_graph_runner.slots[0].graphs.clear()
        assert not torch.allclose(run(), full, rtol=1e-4, atol=1e-4)


def test_slots_are_taken_per_live_cache_and_given_back(pair):
    target, _ = pair
    lean = _static(target)
    runner = lean.cuda_graph_runner
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        a, b = make_cache(lean, 40), make_cache(lean, 40)
        for cache in (a, b):
            lean(input_ids=ids, past_key_values=cache, use_cache=True)
        assert len(runner.slots) == 2 and a.slot is not b.slot  # two live caches never share buffers
        del a
        c = make_cache(lean, 100)
        lean(input_ids=ids, past_key_values=c, use_cache=True)
        assert len(runner.slots) == 2  # the freed slot is reused
        del b, c
        from specdec_tune.engine.cuda_graphs import MAX_IDLE_SLOTS

        lengths = [300 * 2 ** i for i in range(MAX_IDLE_SLOTS)]
        for length in lengths:  # new shapes: idle slots are kept up to MAX_IDLE_SLOTS
            cache = make_cache(lean, length)
            lean(input_ids=ids, past_key_values=cache, use_cache=True)
            del cache

        assert len(runner.slots) == MAX_IDLE_SLOTS and all(not s.busy for s in runner.slots)
        assert runner.slots[-1].length == slot_length(lengths[-1])  # the oldest went first
        assert min(s.length for s in runner.slots) > slot_length(100)
    assert slot_length(40) == 256 and slot_length(300) == 512 and slot_length(512) == 512


def test_cuda_graphs_option_is_refused_where_it_cannot_run():
    from specdec_tune.engine import load_model
    from specdec_tune.core.errors import InputError

    with pytest.raises(InputError, match="--cuda-graphs on needs --device cuda"):
        load_model("mini-draft-1l", "cpu", "float32", "auto", "on")
    with pytest.raises(InputError, match="--cuda-graphs must be one of"):
        load_model("mini-draft-1l", "cpu", "float32", "auto", "always")
    loaded = load_model("mini-draft-1l", "cpu", "float32", "auto", "auto")
    assert loaded.cuda_graphs is None and loaded.model.cuda_graph_runner is None  # auto: off on a CPU


def test_measure_warns_when_the_graph_state_differs_from_the_profile(capsys):
    import types

    from specdec_tune.profiler.measure import _warn_if_graphs_changed

    _warn_if_graphs_changed(types.SimpleNamespace(cuda_graphs="on"), "on")
    _warn_if_graphs_changed(types.SimpleNamespace(cuda_graphs=None), None)  # a CPU: nothing to compare
    assert capsys.readouterr().err == ""
    _warn_if_graphs_changed(types.SimpleNamespace(cuda_graphs="on"), "failed (RuntimeError: x)")
    assert "CUDA graphs 'on', the profile with 'failed" in capsys.readouterr().err
