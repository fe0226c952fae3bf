"""Token trees in the engine: the tree forward (lean and HF), KV compaction, greedy identity with
target-only decoding on every tree kind (with branches other than the first accepted), and staged
drafting's greedy identity. The shapes themselves: tests/core/test_trees.py."""
from __future__ import annotations

import pytest
import torch

from specdec_tune.engine import DecodeConfig, ModelDrafter, NgramDrafter, autoregressive, speculative, wrap_forward
from specdec_tune.engine import lean_kernels
from specdec_tune.engine.kvcache import forward_with_cache, make_cache
from specdec_tune.engine.staged import StagedDrafter
from specdec_tune.engine.tree import compact, tree_forward, verify_rows
from specdec_tune.engine.tree_decode import tree_speculative
from specdec_tune.engine.tree_draft import TreeDrafter
from specdec_tune.core.trees import parse_tree, topk_shape
from tests.support.tiny import tiny_llama

VOCAB = 64


# --------------------------------------------------------------------------- the tree forward


def _models(forward: str):
    target = tiny_llama(vocab=VOCAB, layers=3, hidden=64, seed=1, sharpness=3.0, dtype=torch.float32)
    return target, wrap_forward(target, forward)


FORWARDS = ["hf", "lean-eager", "lean-kernels"]


def _wrapped(forward: str):
    model, wrapped = _models("hf" if forward == "hf" else "lean")
    if forward == "lean-eager":
        wrapped.use_kernels = False
    elif forward == "lean-kernels" and lean_kernels.kernels() is None:
        pytest.skip(f"the fused kernels are unavailable: {lean_kernels.unavailable()}")
    return model, wrapped


@pytest.mark.parametrize("forward", FORWARDS)
def test_tree_forward_equals_each_path_run_as_a_chain(forward):
    """Every node's logits from one tree forward equal the logits of a causal forward over its own
    path; compacting the cache to one path leaves exactly the path's keys and values."""
    model, wrapped = _wrapped(forward)
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, VOCAB, (9,), generator=gen)
    shape = topk_shape((3, 2), 3)
    nodes = torch.randint(0, VOCAB, (shape.size,), generator=gen)
    cache = make_cache(wrapped, 64)
    with torch.no_grad():
        forward_with_cache(wrapped, context[None, :-1], cache, logits_to_keep=1)
        start = cache.get_seq_length()
        positions, mask, _ = verify_rows(shape, start)
        logits = tree_forward(wrapped, torch.cat([context[-1:], nodes]), cache, positions, mask)
        for v in (5, 13, 1):
            seq = torch.cat([context, nodes[list(shape.path(v))]])
            ref = model(input_ids=seq[None]).logits[0, -1]
            torch.testing.assert_close(logits[v + 1], ref, rtol=1e-4, atol=1e-4)
        path = list(shape.path(13))
        keys_before = cache.layers[1]._k[:, :, [start + 1 + v for v in path]].clone()
        compact(cache, start + 1, path)
        assert cache.get_seq_length() == start + 1 + len(path)
        torch.testing.assert_close(cache.layers[1]._k[:, :, start + 1:start + 1 + len(path)], keys_before)
        # the compacted cache continues exactly like a fresh causal prefix of the path
        nxt = torch.tensor([7])
        out = forward_with_cache(wrapped, nxt[None], cache, logits_to_keep=1).logits[0, -1]
        ref = model(input_ids=torch.cat([context, nodes[path], nxt])[None]).logits[0, -1]
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- greedy identity


@pytest.fixture(scope="module")
def noisy_pair():
    """A target and a draft that is the target with a noisy LM head: its best token is often wrong
    and its second best often right, so trees accept branches other than the first."""
    target = tiny_llama(vocab=VOCAB, layers=3, hidden=64, seed=1, sharpness=3.0, dtype=torch.float32)
    draft = tiny_llama(vocab=VOCAB, layers=3, hidden=64, seed=1, sharpness=3.0, dtype=torch.float32)
    with torch.no_grad():
        g = torch.Generator().manual_seed(5)
        draft.lm_head.weight.add_(torch.randn(draft.lm_head.weight.shape, generator=g) * 0.6)
    return target, draft


TREES = ["chains:3", "topk:2-2", "topk:3-1-2", "sequoia:10", "eagle:3:8"]


@pytest.mark.parametrize("tree,forward", [pytest.param(t, f, marks=() if (t, f) == ("sequoia:10", "lean") else pytest.mark.slow)
                                          for t in TREES for f in ("hf", "lean")])  # the fast tier keeps one
def test_tree_greedy_matches_target_only_decoding(noisy_pair, forward, tree):
    """Every tree kind emits the target's own greedy tokens (several prompts, EOS-free), and accepts
    nodes of sibling rank >= 1 in some cycles: the extra branches are really verified and used."""
    target, draft = (wrap_forward(m, forward) for m in noisy_pair)
    spec = parse_tree(tree)
    config = DecodeConfig(max_new_tokens=48, num_speculative_tokens=4)
    other_branch = longer = 0
    with torch.no_grad():
        for seed in range(4):
            prompt = torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(seed))
            ref = autoregressive(target, prompt, config).token_ids
            drafter = TreeDrafter(draft, 256, spec, rank_accept=(0.5, 0.25, 0.12, 0.06))
            result = tree_speculative(target, drafter, prompt, config)
            assert result.token_ids == ref, f"{tree} seed {seed}"
            other_branch += sum(any(r > 0 for r in c.path_ranks) for c in result.cycles)
            longer += sum(c.accepted >= 2 for c in result.cycles)
            assert all(c.target_positions == c.drafted + 1 for c in result.cycles)
    assert other_branch > 0, f"{tree}: no cycle accepted a branch other than the first"
    assert longer > 0


def test_tree_decode_honours_limits_and_refuses_theta(noisy_pair):
    target, draft = noisy_pair
    prompt = torch.tensor([3, 9, 1])
    for limit in (1, 2, 5):
        cfg = DecodeConfig(max_new_tokens=limit, num_speculative_tokens=4)
        out = tree_speculative(target, TreeDrafter(draft, 64, parse_tree("chains:2")), prompt, cfg)
        assert out.token_ids == autoregressive(target, prompt, cfg).token_ids
    with pytest.raises(ValueError, match="θ"):
        tree_speculative(target, TreeDrafter(draft, 64, parse_tree("chains:2")), prompt,
                         DecodeConfig(max_new_tokens=4, threshold=0.3))


# --------------------------------------------------------------------------- staged


@pytest.mark.parametrize("forward,inner", [("lean", "ngram"), *(pytest.param(f, i, marks=pytest.mark.slow) for f, i in
                                                                 [("hf", "ngram"), ("hf", "model"), ("lean", "model")])])
def test_staged_greedy_matches_target_and_speculates_the_draft(noisy_pair, inner, forward):
    """A draft speculated by n-gram lookup or by a smaller model proposes exactly what the draft
    alone proposes (same accepted counts every cycle), so the output is the target's; the inner stage
    really speculates: fewer draft-model forwards than drafted tokens."""
    target, draft = (wrap_forward(m, forward) for m in noisy_pair)
    small = wrap_forward(tiny_llama(vocab=VOCAB, layers=1, hidden=64, seed=1, sharpness=3.0, dtype=torch.float32), forward)
    config = DecodeConfig(max_new_tokens=48, num_speculative_tokens=6)
    forwards = drafted = 0
    with torch.no_grad():
        for seed in range(3):
            # repetitive prompts so that n-gram lookup finds matches in the draft's own stream
            base = torch.randint(0, VOCAB, (5,), generator=torch.Generator().manual_seed(seed))
            prompt = base.repeat(3)
            ref = autoregressive(target, prompt, config)
            chain = speculative(target, ModelDrafter(draft, 256), prompt, config)
            inner_drafter = NgramDrafter() if inner == "ngram" else ModelDrafter(small, 256)
            staged = StagedDrafter(draft, inner_drafter, 3, 256)
            result = speculative(target, staged, prompt, config)
            assert result.token_ids == ref.token_ids
            assert [c.accepted for c in result.cycles] == [c.accepted for c in chain.cycles]
            forwards += sum(c.draft_forwards for c in result.cycles)
            drafted += sum(c.drafted for c in result.cycles)
    assert forwards < drafted, f"staged drafting ran {forwards} draft forwards for {drafted} drafted tokens"
