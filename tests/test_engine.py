"""Engine correctness: greedy equality with the baseline, EOS/limit handling, KV rollback."""
from __future__ import annotations

import itertools

import pytest
import torch

from specdec_tune.engine import (
    DecodeConfig,
    ModelDrafter,
    NgramDrafter,
    autoregressive,
    make_cache,
    speculative,
)
from tests.tiny import tiny_llama

VOCAB = 48
PROMPTS = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (1, 7, 23)]
# A prompt with repeats so that n-gram lookup finds matches.
PROMPTS.append(torch.tensor([3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 9, 3, 4]))


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(VOCAB, layers=2, seed=0), tiny_llama(VOCAB, layers=1, seed=1)


def _drafter(draft, theta, max_len=256):
    return ModelDrafter(draft, max_len, threshold=theta)


@pytest.mark.parametrize("n,theta,schedule", list(itertools.product([1, 2, 4, 8], [0.0, 0.5], ["constant", "heuristic"])))
def test_greedy_matches_baseline(pair, n, theta, schedule):
    target, draft = pair
    for prompt in PROMPTS:
        base = autoregressive(target, prompt, DecodeConfig(max_new_tokens=30)).token_ids
        cfg = DecodeConfig(max_new_tokens=30, num_speculative_tokens=n, threshold=theta, schedule=schedule)
        out = speculative(target, _drafter(draft, theta), prompt, cfg)
        assert out.token_ids == base
        assert sum(c.emitted for c in out.cycles) == len(base)
        assert all(c.drafted <= n for c in out.cycles)
        if theta > 0:
            assert all(min(c.confidences, default=1.0) >= theta for c in out.cycles)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_ngram_greedy_matches_baseline(pair, n):
    target, _ = pair
    drafted = 0
    for prompt in PROMPTS:
        base = autoregressive(target, prompt, DecodeConfig(max_new_tokens=40)).token_ids
        out = speculative(target, NgramDrafter(), prompt, DecodeConfig(max_new_tokens=40, num_speculative_tokens=n))
        assert out.token_ids == base
        drafted += sum(c.drafted for c in out.cycles)
    assert drafted > 0  # the lookup really proposed something


def test_identical_draft_accepts_everything(pair):
    target, _ = pair
    out = speculative(target, _drafter(target, 0.0), PROMPTS[2], DecodeConfig(max_new_tokens=40, num_speculative_tokens=4))
    full = [c for c in out.cycles if c.drafted == 4]
    assert full and all(c.accepted == 4 and c.emitted == 5 for c in full)


def test_eos_inside_accepted_draft(pair):
    target, _ = pair
    prompt = PROMPTS[2]
    free = autoregressive(target, prompt, DecodeConfig(max_new_tokens=40)).token_ids
    eos = free[6]
    stop = free.index(eos)
    cfg = DecodeConfig(max_new_tokens=40, num_speculative_tokens=8, eos_token_id=eos)
    base = autoregressive(target, prompt, cfg)
    out = speculative(target, _drafter(target, 0.0), prompt, cfg)  # identical draft: EOS lands mid-draft
    assert base.token_ids == free[: stop + 1] and base.finished_by_eos
    assert out.token_ids == base.token_ids and out.finished_by_eos
    last = out.cycles[-1]
    assert last.emitted < last.accepted + 1  # the cycle was cut inside its accepted draft


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 8, 9, 13])
def test_max_new_tokens_boundary(pair, limit):
    target, draft = pair
    for prompt in PROMPTS[1:3]:
        base = autoregressive(target, prompt, DecodeConfig(max_new_tokens=limit)).token_ids
        assert len(base) == limit
        for drafter in (_drafter(target, 0.0), _drafter(draft, 0.0), NgramDrafter()):
            out = speculative(target, drafter, prompt, DecodeConfig(max_new_tokens=limit, num_speculative_tokens=4))
            assert out.token_ids == base


def test_kv_rollback_matches_fresh_forward(pair):
    target, draft = pair
    prompt = PROMPTS[2]
    cache = make_cache(target, 512)
    drafter = _drafter(draft, 0.0)
    out = speculative(target, drafter, prompt, DecodeConfig(max_new_tokens=60, num_speculative_tokens=4), cache=cache)
    rejected = sum(c.drafted - c.accepted for c in out.cycles)
    assert len(out.cycles) > 5 and rejected > 0  # rollback really happened
    text = torch.cat([prompt, torch.tensor(out.token_ids)])
    # Target cache holds everything but the last emitted token; the draft's a prefix of the text.
    for model, c in ((target, cache), (draft, drafter.cache)):
        n = c.get_seq_length()
        assert n >= len(text) - 3
        fresh = make_cache(model, 512)
        model(input_ids=text[None, :n], past_key_values=fresh, use_cache=True)
        for got, want in zip(c.layers, fresh.layers):
            torch.testing.assert_close(got.keys, want.keys)
            torch.testing.assert_close(got.values, want.values)


def test_cycle_stats_consistent(pair):
    target, draft = pair
    out = speculative(target, _drafter(draft, 0.0), PROMPTS[2], DecodeConfig(max_new_tokens=50, num_speculative_tokens=6))
    for c in out.cycles:
        assert len(c.confidences) == len(c.outcomes) == c.drafted
        assert list(c.outcomes) == [True] * c.accepted + [False] * (c.drafted - c.accepted)
        assert c.draft_forwards == c.drafted and c.target_positions == c.drafted + 1


def test_bad_decode_config():
    for kwargs in ({"max_new_tokens": 0}, {"max_new_tokens": 4, "num_speculative_tokens": 0},
                   {"max_new_tokens": 4, "num_speculative_tokens": 65}, {"max_new_tokens": 4, "threshold": 1.0},
                   {"max_new_tokens": 4, "temperature": -1.0}, {"max_new_tokens": 4, "schedule": "wild"}):
        with pytest.raises(ValueError):
            DecodeConfig(**kwargs)
