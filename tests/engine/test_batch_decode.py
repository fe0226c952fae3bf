"""Batched decoding (engine.batch_decode): each sequence's greedy output is its own target-only output, whatever
its batch, its prompt length, its acceptance and its neighbours'; the ragged cache keeps rows apart; finished
sequences leave the batch; what the batched engine cannot run is refused with the reason."""
from __future__ import annotations

import copy
import itertools

import pytest
import torch

from specdec_tune.engine import DecodeConfig, autoregressive
from specdec_tune.engine.batch_decode import batch_autoregressive, batch_speculative
from specdec_tune.engine.batch_drafters import BatchModelDrafter, build_batch_drafter
from specdec_tune.engine.lean import wrap_forward
from specdec_tune.engine.ragged import RaggedCache, forward_ragged, make_ragged_cache
from tests.support.tiny import tiny_llama

VOCAB = 48
LENGTHS = (1, 7, 23, 4, 12)
PROMPTS = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in LENGTHS]
PROMPTS.append(torch.tensor([3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 9, 3, 4]))  # repeats: n-gram lookup finds matches


@pytest.fixture(scope="module")
def mixed():
    """A peaked target and its perturbed copy as draft (mixed acceptance, as tests/test_engine.py's), both lean."""
    target = tiny_llama(VOCAB, layers=2, seed=0, sharpness=3.0)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05 * p.std())
    return target, wrap_forward(target, "lean"), wrap_forward(draft, "lean")


def _reference(target, config, prompts=PROMPTS):
    with torch.inference_mode():
        return [autoregressive(target, p, config).token_ids for p in prompts]


def _decode(lean_t, lean_d, config, prompts=PROMPTS, cycles=None, **kwargs):
    drafter = build_batch_drafter(lean_d, len(prompts), config.spec, max_len=max(map(len, prompts)) + config.room,
                                  temperature=config.temperature)
    with torch.inference_mode():
        return batch_speculative(lean_t, drafter, prompts, config, on_cycle=cycles.append if cycles is not None else None,
                                 **kwargs)


def test_plain_batch_equals_each_sequence_alone(mixed):
    target, lean_t, _ = mixed
    config = DecodeConfig(max_new_tokens=24, eos_token_id=11)
    ref = _reference(target, config)
    seen = []
    with torch.inference_mode():
        out = batch_autoregressive(lean_t, PROMPTS, config, on_cycle=seen.append)
    assert [r.token_ids for r in out] == ref
    assert [r.prompt_tokens for r in out] == [len(p) for p in PROMPTS]
    assert [len(c.rows) for c in seen] == sorted((len(c.rows) for c in seen), reverse=True)  # the batch only shrinks


SETTINGS = [dict(threshold=0.0), dict(threshold=0.3), dict(threshold=0.3, threshold_rule="hf"),
            dict(threshold=0.2, threshold_kind="cumulative"), dict(threshold=0.3, threshold_kind="adaptive",
                                                                   threshold_step=0.1),
            dict(threshold=0.0, schedule="heuristic")]


@pytest.mark.parametrize("settings", [pytest.param(s, marks=() if i < 2 else pytest.mark.slow)
                                      for i, s in enumerate(SETTINGS)])
def test_speculative_batch_equals_each_sequence_alone(mixed, settings):
    """Every row's output is its own target-only output for N in {1, 2, 4}, with every θ rule and kind and
    the heuristic schedule; rows accepted different numbers of tokens in the same cycle (ragged)."""
    target, lean_t, lean_d = mixed
    ragged = shrank = 0
    for n in (1, 2, 4):
        config = DecodeConfig(max_new_tokens=24, num_speculative_tokens=n, eos_token_id=11, **settings)
        cycles = []
        out = _decode(lean_t, lean_d, config, cycles=cycles)
        assert [r.token_ids for r in out] == _reference(target, config)
        for r, res in enumerate(out):
            assert sum(c.emitted for c in res.cycles) == len(res.token_ids)
            assert all(c.drafted <= n for c in res.cycles)
            if settings["threshold"] > 0 and settings.get("threshold_kind", "per-token") == "per-token" and \
                    settings.get("threshold_rule", "before") == "before":
                assert all(min(c.confidences, default=1.0) >= settings["threshold"] for c in res.cycles)
        ragged += sum(len({s.accepted for s in c.stats}) > 1 for c in cycles)
        shrank += len({len(c.rows) for c in cycles}) > 1
        assert all(c.width == max(s.drafted for s in c.stats) + 1 for c in cycles)
    assert ragged > 0 and shrank > 0


def test_ngram_batch_equals_each_sequence_alone(mixed):
    target, lean_t, _ = mixed
    config = DecodeConfig(max_new_tokens=20, num_speculative_tokens=3)
    drafter = build_batch_drafter(None, len(PROMPTS), config.spec, max_len=40 + config.room)
    with torch.inference_mode():
        out = batch_speculative(lean_t, drafter, PROMPTS, config)
    assert [r.token_ids for r in out] == _reference(target, config)
    assert sum(c.accepted for r in out for c in r.cycles) > 0


def test_a_batch_size_schedule_caps_n_as_the_batch_shrinks(mixed):
    """``n_for_batch`` (a per-batch-size schedule) sets each cycle's N by the live batch size; N = 0 is a plain
    step; the output stays each sequence's own."""
    target, lean_t, lean_d = mixed
    config = DecodeConfig(max_new_tokens=24, num_speculative_tokens=4, eos_token_id=11)
    schedule = {1: 4, 3: 2, len(PROMPTS): 0}  # a plain step while every row is live
    band = lambda b: schedule[max(k for k in schedule if k <= b)]  # noqa: E731
    cycles = []
    out = _decode(lean_t, lean_d, config, cycles=cycles, n_for_batch=band)
    assert [r.token_ids for r in out] == _reference(target, config)
    for c in cycles:
        assert max(s.drafted for s in c.stats) <= band(len(c.rows))
    assert {len(c.rows) for c in cycles if c.width == 1} >= {len(PROMPTS)}
    assert any(c.width > 1 for c in cycles)


def test_lean_kernels_with_one_start_per_row_match_the_eager_batch_in_float32():
    """The fused CPU kernels with a start per row (rotary + cache write, attention) compute what the eager
    masked forward computes, and decode the same tokens."""
    model = tiny_llama(VOCAB, layers=2, seed=3, sharpness=3.0, dtype=torch.float32)
    lean = wrap_forward(model, "lean")
    prompts = [p for p in PROMPTS[:4]]
    with torch.inference_mode():
        logits = {}
        for kernels in (True, False):
            lean.use_kernels = kernels
            cache = make_ragged_cache(lean, len(prompts), 64)
            ids = torch.zeros(len(prompts), 23, dtype=torch.long)
            for r, p in enumerate(prompts):
                ids[r, :len(p)] = p
            forward_ragged(lean, ids, cache, [len(p) for p in prompts], last=True)
            logits[kernels] = forward_ragged(lean, ids[:, :3], cache, [3, 1, 2, 3], last=False)
        torch.testing.assert_close(logits[True], logits[False], rtol=1e-4, atol=1e-4)
        lean.use_kernels = True
        config = DecodeConfig(max_new_tokens=16)
        assert [r.token_ids for r in batch_autoregressive(lean, prompts, config)] == _reference(model, config, prompts)


def test_ragged_cache_compaction_moves_rows_in_place():
    cache = RaggedCache(num_layers=1, rows=3, max_len=4)
    cache.allocate(1, 1, 1, torch.float32, torch.device("cpu"))
    buf = cache.keys[0]
    for r in range(3):
        buf[r] = r + 1
    cache.set_lengths([2, 3, 1])
    cache.keep_rows([0, 2])
    assert cache.keys[0] is buf and cache.lengths == [2, 1]
    assert buf[0].unique().tolist() == [1.0] and buf[1].unique().tolist() == [3.0]
    with pytest.raises(ValueError):
        cache.set_lengths([5, 0])
    with pytest.raises(ValueError):
        cache.keep_rows([1, 0])


def test_what_the_batched_engine_cannot_run_is_refused_with_the_reason(mixed):
    target, lean_t, lean_d = mixed
    hf = tiny_llama(VOCAB, layers=1, seed=2)
    with pytest.raises(ValueError, match="lean forward"):
        batch_autoregressive(hf, PROMPTS[:2], DecodeConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match="lean forward"):
        BatchModelDrafter(hf, 2, 32)
    for shape in (dict(tree="chains:2"), dict(staged="ngram")):
        config = DecodeConfig(max_new_tokens=4, num_speculative_tokens=2, **shape)
        with pytest.raises(ValueError, match="batch size 1"):
            _decode(lean_t, lean_d, config, prompts=PROMPTS[:2])
    with pytest.raises(ValueError, match="non-empty"):
        batch_autoregressive(lean_t, [torch.tensor([], dtype=torch.long)], DecodeConfig(max_new_tokens=4))


@pytest.mark.slow
def test_bundled_pair_batches_decode_what_each_prompt_decodes_alone():
    """The bundled pair in float32 (fused kernels, packed weights): B = 1, 3 and 8 batches of prompts of
    different lengths decode each prompt's own greedy output, plain and speculative."""
    from specdec_tune.engine import load_model, load_workload

    target, draft = load_model("mini-target", "cpu"), load_model("mini-draft-1l", "cpu")
    prompts = [target.tokenizer(p.prompt, return_tensors="pt").input_ids[0] for p in load_workload("functions")[:8]]
    config = DecodeConfig(max_new_tokens=32, num_speculative_tokens=4, eos_token_id=target.eos_token_id)
    ref = _reference(target.model, config, prompts)
    for b in (1, 3, 8):
        for start in range(0, len(prompts), b):
            group = prompts[start:start + b]
            with torch.inference_mode():
                plain = batch_autoregressive(target.model, group, config)
            spec = _decode(target.model, draft.model, config, prompts=group)
            assert [r.token_ids for r in plain] == ref[start:start + b]
            assert [r.token_ids for r in spec] == ref[start:start + b]


def test_each_row_attends_only_to_its_own_tokens(mixed):
    """A row's logits do not depend on the other rows of its batch: decoding a prompt beside different
    neighbours gives it the same logits (up to float64 rounding) as decoding it alone."""
    _, lean_t, _ = mixed
    outs = []
    for neighbours in itertools.islice(itertools.permutations(PROMPTS[1:4]), 2):
        group = [PROMPTS[0], *neighbours]
        cache = make_ragged_cache(lean_t, len(group), 40)
        with torch.inference_mode():
            ids = torch.zeros(len(group), 23, dtype=torch.long)
            for r, p in enumerate(group):
                ids[r, :len(p)] = p
            outs.append(forward_ragged(lean_t, ids, cache, [len(p) for p in group], last=True)[0])
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
