"""CUDA graphs of the batched forward (engine.batch_graphs): batches padded to captured sizes decode exactly
what the eager batched forward decodes. On a CPU the runner runs the same padded static function eagerly
(``capture=False``); on a GPU it captures and replays (``@pytest.mark.gpu``)."""
from __future__ import annotations

import copy

import pytest
import torch

from specdec_tune.core.limits import BATCH_CAPTURE_SIZES, padded_batch_size
from specdec_tune.engine import DecodeConfig, autoregressive
from specdec_tune.engine.batch_decode import batch_autoregressive, batch_speculative
from specdec_tune.engine.batch_drafters import build_batch_drafter
from specdec_tune.engine.batch_graphs import BatchGraphRunner, runner_for
from specdec_tune.engine.lean import wrap_forward
from tests.support.tiny import tiny_llama

VOCAB = 48
PROMPTS = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (1, 7, 23, 4, 9)]


def test_padded_batch_size_is_the_next_captured_size():
    assert [padded_batch_size(b) for b in (1, 2, 3, 4, 5, 8, 9, 17, 256)] == [1, 2, 4, 4, 8, 8, 16, 24, 256]
    assert padded_batch_size(257) is None
    assert BATCH_CAPTURE_SIZES[:5] == (1, 2, 4, 8, 16)


def _pair(dtype=torch.float64, device="cpu"):
    target = tiny_llama(VOCAB, layers=2, seed=0, sharpness=3.0, dtype=dtype).to(device)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype).to(device) * 0.05 * p.std())
    return target, draft


def test_padded_static_forward_decodes_what_each_sequence_decodes_alone():
    """5 rows run on the 8-row static function, then 4, 2, 1 as they finish: every row's output is its own,
    and the graphs are keyed by padded size and width, in one slot reused by the next batch."""
    target, draft = _pair()
    lean_t, lean_d = wrap_forward(target, "lean"), wrap_forward(draft, "lean")
    lean_t.batch_graph_runner = BatchGraphRunner(lean_t, capture=False)
    lean_d.batch_graph_runner = BatchGraphRunner(lean_d, capture=False)
    config = DecodeConfig(max_new_tokens=30, num_speculative_tokens=4, eos_token_id=7)
    with torch.inference_mode():
        ref = [autoregressive(target, p, config).token_ids for p in PROMPTS]
        plain = batch_autoregressive(lean_t, PROMPTS, config)
        drafter = build_batch_drafter(lean_d, len(PROMPTS), config.spec, max_len=23 + config.room)
        spec = batch_speculative(lean_t, drafter, PROMPTS, config)
    assert [r.token_ids for r in plain] == ref and [r.token_ids for r in spec] == ref
    assert len({len(r) for r in ref}) > 1  # one row finished early (EOS): the batch shrank
    runner = runner_for(lean_t)
    keys = {k for slot in runner.slots for k in slot.graphs}
    assert {size for size, _, _ in keys} >= {8, 4} and {w for _, w, _ in keys} >= {1, 5}
    assert len(runner.slots) == 1  # the speculative batch reused the plain batch's slot


@pytest.mark.gpu
def test_captured_graphs_replay_what_the_eager_batch_decodes():
    """On CUDA: the batch's forwards are captured per (padded size, width) and replayed, and each row's output
    equals the eager batched decode's (both float32, the same kernels outside the graphs)."""
    target, draft = _pair(torch.float32, "cuda")
    config = DecodeConfig(max_new_tokens=24, num_speculative_tokens=3, eos_token_id=7)
    prompts = [p.cuda() for p in PROMPTS]
    outs = {}
    for graphs in ("off", "on"):
        lean_t, lean_d = wrap_forward(target, "lean", graphs), wrap_forward(draft, "lean", graphs)
        with torch.inference_mode():
            drafter = build_batch_drafter(lean_d, len(prompts), config.spec, max_len=23 + config.room,
                                          device="cuda")
            outs[graphs] = [r.token_ids for r in batch_speculative(lean_t, drafter, prompts, config)]
        if graphs == "on":
            runner = runner_for(lean_t)
            assert runner.failed is None and runner.captured >= 2
    assert outs["on"] == outs["off"]
