"""Memory-bandwidth utilisation from first principles: the bytes of a model built here, counted by hand from
its shape, and the published gpt-fast anchor (issue 37, item 5)."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_tune.core import bandwidth as bw

V, H, I, L, HEADS, KV = 1000, 64, 176, 3, 8, 2  # vocab, hidden, MLP, layers, heads, key/value heads
HEAD_DIM = H // HEADS


def _model(tied: bool, dtype=torch.bfloat16) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                         num_attention_heads=HEADS, num_key_value_heads=KV, tie_word_embeddings=tied)
    return LlamaForCausalLM(config).to(dtype)


def _by_hand(tied: bool) -> tuple[int, int]:
    """(parameters a step reads, every parameter) of the model above, from its shape."""
    per_layer = H * H + 2 * H * KV * HEAD_DIM + H * H + 3 * H * I + 2 * H  # q, k and v, o, gate/up/down, 2 norms
    body = L * per_layer + H  # final norm
    table = V * H
    if tied:
        return body + table, body + table
    return body + H + table, body + 2 * table  # one embedding row and the head; the whole table as well


@pytest.mark.parametrize("tied", [False, True])
def test_weight_bytes_are_the_shapes_parameters_in_the_dtype(tied):
    read, every = _by_hand(tied)
    model = _model(tied)
    assert bw.weight_bytes(model) == 2 * read
    assert bw.weight_bytes(model, whole_embedding=True) == 2 * every
    assert bw.weight_bytes(_model(tied, torch.float32)) == 4 * read
    with torch.device("meta"):  # what the real-size step counts: the shape, nothing allocated
        assert bw.weight_bytes(_model(tied)) == 2 * read


def test_kv_bytes_per_position_counts_grouped_query_heads():
    config = _model(False).config
    assert bw.kv_bytes_of(config, 2) == 2 * L * KV * HEAD_DIM * 2 == bw.kv_bytes_per_position(L, KV, HEAD_DIM, 2)
    # Llama-3.1-8B: 32 layers, 8 key/value heads of 128 in bf16: 128 KiB per position
    assert bw.kv_bytes_per_position(32, 8, 128, 2) == 131072


def test_mbu_of_known_numbers_and_the_gpt_fast_anchor():
    # a step reading 1 GB at 1,000 tokens/s moves 1 TB/s: half of a 2 TB/s card
    assert bw.mbu(1e9, 1000.0, 2e12) == pytest.approx(0.5)
    assert bw.bytes_per_token(10_000, 100, 50.5) == pytest.approx(15_050)
    assert bw.mean_context([100, 200], 11) == pytest.approx(155.0)  # 150 + (11 - 1) / 2
    anchor = bw.GPT_FAST_A100
    a100 = bw.find_card("NVIDIA A100-SXM4-80GB")
    assert a100 is not None and a100.name == anchor["card"]
    got = bw.mbu(anchor["bytes_per_s"] / anchor["tokens_per_s"], anchor["tokens_per_s"], a100.bytes_per_s)
    assert got == pytest.approx(0.685, abs=0.005)  # gpt-fast's ~69 %
    with pytest.raises(ValueError):
        bw.mbu(1.0, 1.0, 0.0)


@pytest.mark.parametrize("name, card", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 (SXM or NVL)"), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"), ("NVIDIA GeForce RTX 4090", None)])
def test_cards_from_device_names(name, card):
    found = bw.find_card(name)
    assert (found.name if found else None) == card
