"""Engine correctness: greedy equality with the baseline, EOS/limit handling, KV rollback."""
from __future__ import annotations

import copy
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
from specdec_tune.engine.kvcache import forward_with_cache
from tests.support.tiny import tiny_llama

VOCAB = 48
PROMPTS = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (1, 7, 23)]
# A prompt with repeats so that n-gram lookup finds matches.
PROMPTS.append(torch.tensor([3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 9, 3, 4]))


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(VOCAB, layers=2, seed=0), tiny_llama(VOCAB, layers=1, seed=1)


def perturbed(model: torch.nn.Module, scale: float, seed: int = 5) -> torch.nn.Module:
    """``model`` with every weight perturbed by ``scale`` x its own std: a draft with mixed acceptance."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale * p.std())
    return out


@pytest.fixture(scope="module")
def mixed_pair():
    """A peaked target (LM head x3: top probabilities spread over 0.2..1) and its own perturbed copy as
    draft: about 60-75 % of drafted tokens accepted, so every verification path occurs."""
    target = tiny_llama(VOCAB, layers=2, seed=0, sharpness=3.0)
    return target, perturbed(target, 0.05)


class Recorder:
    """Wraps a drafter; records (tokens asked, tokens proposed, stopped by θ) per cycle."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[int, int, bool]] = []

    @property
    def forwards(self) -> int:
        return self.inner.forwards

    def propose(self, context, max_tokens):
        d = self.inner.propose(context, max_tokens)
        self.calls.append((max_tokens, d.length, d.stopped_by_threshold))
        return d

    def observe(self, num_accepted):
        self.inner.observe(num_accepted)


def _drafter(draft, theta, max_len=256, rule="before"):
    return ModelDrafter(draft, max_len, threshold=theta, threshold_rule=rule)


@pytest.mark.parametrize("theta,schedule", [
    pytest.param(t, s, marks=() if (t, s) in {(0.0, "constant"), (0.5, "heuristic")} else pytest.mark.slow)
    for t, s in itertools.product([0.0, 0.3, 0.5], ["constant", "heuristic"])])  # the fast tier keeps two
def test_greedy_matches_baseline(mixed_pair, theta, schedule):
    """Outputs equal the baseline for N in {1, 2, 4, 8}, and every path of the cycle really ran."""
    target, draft = mixed_pair
    seen = {"L=0": 0, "A<L": 0, "0<A<L": 0, "A=L>0": 0, "grow": 0, "shrink": 0}
    cut_at: set[int] = set()
    drafted = accepted = 0
    for n in (1, 2, 4, 8):
        for prompt in PROMPTS:
            base = autoregressive(target, prompt, DecodeConfig(max_new_tokens=30)).token_ids
            cfg = DecodeConfig(max_new_tokens=30, num_speculative_tokens=n, threshold=theta, schedule=schedule)
            rec = Recorder(_drafter(draft, theta))
            out = speculative(target, rec, prompt, cfg)
            assert out.token_ids == base
            assert sum(c.emitted for c in out.cycles) == len(base)
            assert all(c.drafted <= n for c in out.cycles)
            if theta > 0:
                assert all(min(c.confidences, default=1.0) >= theta for c in out.cycles)
            for c, (asked, got, stopped) in zip(out.cycles, rec.calls):
                drafted += c.drafted
                accepted += c.accepted
                seen["L=0"] += c.drafted == 0
                seen["A<L"] += c.accepted < c.drafted
                seen["0<A<L"] += 0 < c.accepted < c.drafted
                seen["A=L>0"] += 0 < c.drafted == c.accepted
                assert stopped == (got < asked)  # a model draft is short only when θ cut it
                if stopped:
                    cut_at.add(got)
            asked = [a for a, _, _ in rec.calls[:-1]]  # the last cycle's budget is cut by the limit
            seen["grow"] += sum(b > a for a, b in zip(asked, asked[1:]))
            seen["shrink"] += sum(b < a for a, b in zip(asked, asked[1:]))
    if theta == 0:  # (a threshold keeps the confident, mostly accepted, tokens)
        assert 0.4 <= accepted / drafted <= 0.85, f"acceptance {accepted / drafted:.2f}: not a mixed pair"
    assert seen["A<L"] > 0 and seen["A=L>0"] > 0, seen
    if theta < 0.5:  # (above, a confident greedy token is rarely rejected after an accepted one)
        assert seen["0<A<L"] > 0, seen
    if theta > 0:
        assert seen["L=0"] > 0 and len(cut_at) >= 3, (seen, cut_at)  # θ cuts at the first and later positions
    else:
        assert not cut_at and seen["L=0"] == 0
    if schedule == "heuristic":
        assert seen["grow"] > 0 and seen["shrink"] > 0, seen


@pytest.mark.parametrize("theta", [0.3, pytest.param(0.6, marks=pytest.mark.slow)])
def test_hf_threshold_rule_greedy_identical(mixed_pair, theta):
    """HF's rule (propose the token below θ, then stop) changes lengths, never greedy outputs."""
    target, draft = mixed_pair
    longer = 0
    for n in (2, 8):
        for prompt in PROMPTS:
            cfg = DecodeConfig(max_new_tokens=30, num_speculative_tokens=n, threshold=theta, threshold_rule="hf")
            before = speculative(target, _drafter(draft, theta), prompt, cfg)
            hf = speculative(target, _drafter(draft, theta, rule="hf"), prompt, cfg)
            assert hf.token_ids == before.token_ids
            for c in hf.cycles:  # only the last proposed token may lie below θ
                assert c.drafted > 0 and all(x >= theta for x in c.confidences[:-1])
            longer += sum(c.drafted for c in hf.cycles) > sum(c.drafted for c in before.cycles)
    assert longer > 0


@pytest.mark.slow
@pytest.mark.parametrize("kind,theta,step", [("cumulative", 0.3, 0.05), ("cumulative", 0.6, 0.05),
                                             ("adaptive", 0.3, 0.1), ("adaptive", 0.0, 0.2)])
def test_threshold_kinds_greedy_identical(mixed_pair, kind, theta, step):
    """Cumulative and adaptive θ change draft lengths, never greedy outputs; each kind does what it says:
    every drafted prefix's probability stays at or above θ (cumulative), θ stays in its bounds and moves
    up after a rejection and down after a fully accepted draft (adaptive)."""
    target, draft = mixed_pair
    drafted = {"per-token": 0, kind: 0}
    moves = {"up": 0, "down": 0}
    for n in (1, 2, 4, 8):
        for prompt in PROMPTS:
            base = autoregressive(target, prompt, DecodeConfig(max_new_tokens=30)).token_ids
            for k in drafted:
                cfg = DecodeConfig(max_new_tokens=30, num_speculative_tokens=n, threshold=theta, threshold_kind=k,
                                   threshold_step=step)
                drafter = ModelDrafter(draft, 256, threshold=theta, threshold_kind=k, threshold_step=step)
                out = speculative(target, drafter, prompt, cfg)
                assert out.token_ids == base, (k, n)
                drafted[k] += sum(c.drafted for c in out.cycles)
                if k == "cumulative":
                    for c in out.cycles:
                        assert all(p >= theta for p in itertools.accumulate(c.token_probs, lambda a, b: a * b)), c
                if k == "adaptive":
                    for a, b in zip(out.cycles, out.cycles[1:]):
                        assert 0.0 <= b.threshold <= 0.9 + 1e-9
                        rejected = a.accepted < a.drafted
                        assert (b.threshold >= a.threshold) if rejected else (b.threshold <= a.threshold), (a, b)
                        moves["up"] += b.threshold > a.threshold
                        moves["down"] += b.threshold < a.threshold
    if kind == "cumulative":
        assert drafted["cumulative"] < drafted["per-token"], drafted  # the product cuts where the top probability does not
    else:
        assert moves["up"] > 0 and moves["down"] > 0, moves


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
    prompt = PROMPTS[2]
    base = autoregressive(target, prompt, DecodeConfig(max_new_tokens=40)).token_ids
    out = speculative(target, _drafter(target, 0.0), prompt, DecodeConfig(max_new_tokens=40, num_speculative_tokens=4))
    assert out.token_ids == base
    assert len(out.cycles) == 8  # 40 tokens, 5 per cycle
    assert all(c.drafted == c.accepted == 4 and c.emitted == 5 for c in out.cycles)


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


def test_decoding_through_hf_forward_raises_no_deprecation_warning(pair):
    """The engine passes its KV cache by the keyword the installed transformers takes (``cache`` from 5.24,
    where ``past_key_values`` warns and goes away in 5.40): a speculative decode through HF's own forward
    emits no FutureWarning/DeprecationWarning."""
    import warnings

    target, draft = pair
    prompt = torch.arange(1, 9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        speculative(target, _drafter(draft, 0.0), prompt, DecodeConfig(max_new_tokens=12, num_speculative_tokens=3),
                    cache=make_cache(target, 64))
        autoregressive(target, prompt, DecodeConfig(max_new_tokens=4))


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
        forward_with_cache(model, text[None, :n], fresh)
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
                   {"max_new_tokens": 4, "temperature": -1.0}, {"max_new_tokens": 4, "schedule": "wild"},
                   {"max_new_tokens": 4, "threshold_rule": "after"}):
        with pytest.raises(ValueError):
            DecodeConfig(**kwargs)
