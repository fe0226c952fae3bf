"""GPU path (skipped without CUDA): engine equality on cuda, CUDA-event timing."""
from __future__ import annotations

import pytest
import torch

from specdec_tune.engine import DecodeConfig, ModelDrafter, autoregressive, speculative
from specdec_tune.profiler.timers import Stopwatch, time_callable
from tests.tiny import tiny_llama

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
