"""EAGLE-3 heads in the engine: the servers' layout, the target's features from the verify forward, exact
greedy decoding with chains and trees, and drafts that are the head's own chain (issue 39).

Greedy exactness holds for any drafter (the verifier keeps the target's tokens), so the plumbing has its
own tests: the drafts proposed inside the loop must equal a reference chain recomputed from scratch
(target without cache over the whole context, head without cache), the unrolled training forward must
equal that chain, and the tree drafter's single chain must equal the chain drafter's. A feature read one
position off, a cache not rolled back to the committed entries, or a node fed the wrong parent's output
fails them.
"""
from __future__ import annotations

import json

import pytest
import torch

from specdec_tune.core.errors import ModelLoadError
from specdec_tune.core.trees import parse_tree
from specdec_tune.engine import (DecodeConfig, EagleDrafter, EagleTreeDrafter, FeatureForward, FeatureStore,
                                 autoregressive, hf_hidden_states, load_head, make_cache, save_head, speculative,
                                 tree_speculative, unroll)
from specdec_tune.engine.eagle_draft import feature_store
from specdec_tune.engine.names import check_model_folder
from tests.support.eagle_stub import lean, random_head, tiny_target

PROMPT = torch.tensor([5, 17, 3, 44, 9, 12, 33, 7, 21, 2])


@pytest.fixture(scope="module")
def pair():
    target = tiny_target()
    return target, random_head(target)


def test_layout_is_what_the_servers_load(pair, tmp_path):
    target, head = pair
    save_head(head, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == head.draft_vocab < config["vocab_size"] == target.config.vocab_size
    assert config["tie_word_embeddings"] is False and config["target_hidden_size"] == 32
    assert "eagle_aux_hidden_state_layer_ids" not in config["eagle_config"]  # both servers' defaults
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight",
            "norm.weight", "d2t", "t2d", "embed_tokens.weight"} <= names
    assert not any(n.startswith(("model.", "layers.")) for n in names)
    loaded = load_head(tmp_path)
    ids = PROMPT[None]
    feats = torch.randn(1, ids.shape[1], 96)
    torch.testing.assert_close(loaded(input_ids=ids, features=feats, use_cache=False).logits,
                               head(input_ids=ids, features=feats, use_cache=False).logits, atol=2e-2, rtol=0)
    assert check_model_folder(tmp_path) == str(tmp_path)  # no tokenizer needed: the servers use the target's


def test_a_head_loads_with_the_forward_its_profile_recorded(pair, tmp_path):
    """A profile stores a head's forward as "eagle3" and measure/tune load the run's drafts with it."""
    from specdec_tune.core.errors import InputError
    from specdec_tune.engine import load_model

    save_head(pair[1], tmp_path)
    loaded = load_model(str(tmp_path), "cpu", "float32", "eagle3")
    assert loaded.forward == "eagle3" and load_model(str(tmp_path), "cpu", "float32", "auto").forward == "eagle3"
    with pytest.raises(InputError, match="not an EAGLE-3 head"):
        load_model("mini-draft-1l", "cpu", "float32", "eagle3")


def test_a_misshapen_head_is_refused(pair, tmp_path):
    from safetensors.torch import load_file, save_file

    save_head(pair[1], tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["fc.weight"] = weights["fc.weight"][:, :64].contiguous()
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="fc.weight has shape"):
        load_head(tmp_path)


def test_verify_features_are_the_residual_after_the_layers(pair):
    """The lean forward's features equal Hugging Face's decoder outputs (hooks) at the head's layers."""
    target, head = pair
    store_lean, store_hf = feature_store(head, 32), feature_store(head, 32)
    with torch.no_grad():
        FeatureForward(lean(target), store_lean)(PROMPT, make_cache(lean(target), 32), 1)
        FeatureForward(target, store_hf)(PROMPT, make_cache(target, 32), 1)
    assert store_lean.layers == (2, 4, 5)  # (2, L // 2, L - 3) of an 8-layer target
    torch.testing.assert_close(store_lean.read(0, 10), store_hf.read(0, 10), atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        states = target(input_ids=PROMPT[None], output_hidden_states=True).hidden_states
    want = torch.cat([states[i][0] for i in sorted(store_lean.layers)], dim=-1)
    torch.testing.assert_close(store_lean.read(0, 10), want, atol=1e-4, rtol=1e-4)


def reference_chain(target, head, context: torch.Tensor, n: int) -> tuple[list[int], list[float]]:
    """The head's greedy chain after ``context`` from scratch: the target reads the whole context without a
    cache, the head reads every committed entry and each drafted token without a cache."""
    layers = feature_store(head, 1)
    layers.bind(target)
    with torch.no_grad(), hf_hidden_states(target, layers.layers) as got:
        target(input_ids=context[None], use_cache=False)
        feats = got()[0]
    hidden = head.fc(feats[:-1])  # entries 0..T-2: (features at t, token t + 1)
    ids = context[1:]
    tokens, margins = [], []
    for _ in range(n):
        out = head(input_ids=ids[None], hidden_states=hidden[None], use_cache=False)
        top = out.logits[0, -1].topk(2).values
        tokens.append(int(out.logits[0, -1].argmax()))
        margins.append(float(top[0] - top[1]))
        hidden = torch.cat([hidden, out.hidden[0, -1:]])
        ids = torch.cat([ids, torch.tensor([tokens[-1]])])
    return tokens, margins


class RecordingDrafter(EagleDrafter):
    """Keeps every proposal with the context it was made for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[torch.Tensor, list[int]]] = []

    def propose(self, context, max_tokens):
        draft = super().propose(context, max_tokens)
        self.seen.append((context.clone(), draft.tokens.tolist()))
        return draft


@pytest.mark.parametrize("forward", ["lean", "hf"])
def test_drafts_are_the_heads_own_chain(pair, forward):
    target, head = pair
    model = lean(target) if forward == "lean" else target
    drafter = RecordingDrafter(head, 64)
    with torch.no_grad():
        speculative(model, drafter, PROMPT, DecodeConfig(24, num_speculative_tokens=3))
    assert len(drafter.seen) > 3
    for context, drafted in drafter.seen:
        want, margins = reference_chain(target, head, context, len(drafted))
        for got, exp, margin in zip(drafted, want, margins):
            if margin > 1e-3:  # a near-tie may flip between cached and uncached arithmetic
                assert got == exp, f"context of {len(context)} tokens: drafted {drafted}, the chain is {want}"


@pytest.mark.parametrize("forward", ["lean", "hf"])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_greedy_chain_is_exact(pair, forward, n):
    target, head = pair
    model = lean(target) if forward == "lean" else target
    config = DecodeConfig(40, num_speculative_tokens=n)
    with torch.no_grad():
        want = autoregressive(model, PROMPT, config).token_ids
        got = speculative(model, EagleDrafter(head, 80), PROMPT, config)
    assert got.token_ids == want
    assert sum(c.accepted for c in got.cycles) > 0  # the head is no dummy: some drafts are accepted


@pytest.mark.parametrize("tree", ["chains:2", "topk:2-2", "sequoia:8", "eagle:3:6"])
def test_greedy_trees_are_exact(pair, tree):
    target, head = pair
    model = lean(target)
    spec = parse_tree(tree)
    config = DecodeConfig(30, num_speculative_tokens=3)
    with torch.no_grad():
        want = autoregressive(model, PROMPT, config).token_ids
        drafter = EagleTreeDrafter(head, 30 + 12 + spec.nodes(3) + 8, spec, rank_accept=(0.5, 0.3, 0.2))
        got = tree_speculative(model, drafter, PROMPT, config)
    assert got.token_ids == want


def test_a_single_chain_tree_drafts_the_chain(pair):
    """Tree nodes read their parent's output: a one-chain tree proposes what the chain drafter proposes."""
    target, head = pair
    model = lean(target)
    with torch.no_grad():
        chain = RecordingDrafter(head, 64)
        speculative(model, chain, PROMPT, DecodeConfig(20, num_speculative_tokens=3))
        for context, drafted in chain.seen[:6]:
            tree = EagleTreeDrafter(head, 64, parse_tree("chains:1"))
            store = tree.features
            FeatureForward(model, store)(context[:-1], make_cache(model, 64), 1)
            proposal = tree.propose_tree(context, len(drafted))
            assert proposal.tokens.tolist() == drafted


def test_a_one_token_prompt_decodes_exactly(pair):
    target, head = pair
    model = lean(target)
    config = DecodeConfig(12, num_speculative_tokens=3)
    with torch.no_grad():
        assert speculative(model, EagleDrafter(head, 40), PROMPT[:1], config).token_ids == \
            autoregressive(model, PROMPT[:1], config).token_ids


def test_unrolled_forward_is_the_chain(pair):
    """The training-time test's step j at anchor t is the chain started after anchor t, fed the text's tokens."""
    target, head = pair
    seq = torch.cat([PROMPT, torch.tensor([8, 30, 1, 19, 40, 6])])
    store = FeatureStore(seq.shape[0], 96, None, 3)
    with torch.no_grad():
        FeatureForward(target, store)(seq, make_cache(target, seq.shape[0]), 1)
        steps = unroll(head, store.read(0, seq.shape[0])[None], seq[None], 3)
        for anchor in (3, 7, 10):
            hidden, ids = head.fc(store.read(0, anchor + 1)), seq[1:anchor + 2]
            for j in range(3):
                out = head(input_ids=ids[None], hidden_states=hidden[None], use_cache=False)
                want = out.logits[0, -1][head.target_ids()]
                torch.testing.assert_close(steps[j][0, anchor], want, atol=1e-4, rtol=1e-4)
                hidden = torch.cat([hidden, out.hidden[0, -1:]])
                ids = torch.cat([ids, seq[anchor + 2 + j:anchor + 3 + j]])
