"""A tiny Llama target and a random EAGLE-3 head for it: the engine's EAGLE path at milliseconds a forward.

The head has a draft vocabulary smaller than the target's (``d2t`` maps it), so every test also runs the
mapping the servers' loaders apply.
"""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_tune.engine import EagleHead, head_config, wrap_forward


def tiny_target(vocab: int = 64, layers: int = 8, seed: int = 0) -> LlamaForCausalLM:
    """A seeded random Llama (float32, eval) whose aux layers (2, L // 2, L - 3) are distinct."""
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger weights than the default init: distributions far from uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    return model.requires_grad_(False)


def random_head(target: LlamaForCausalLM, draft_vocab: int | None = None, seed: int = 1, scale: float = 0.3) -> EagleHead:
    """A seeded random head over ``draft_vocab`` of the target's ids (every other id plus the last ones)."""
    vocab = target.config.vocab_size
    draft_vocab = draft_vocab or vocab - vocab // 4
    head = EagleHead(head_config(target.config.to_dict(), draft_vocab))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
        head.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
        head.d2t.copy_(ids - torch.arange(draft_vocab))
        head.t2d.zero_().index_fill_(0, ids, True)
    return head.eval().requires_grad_(False)


def lean(model: LlamaForCausalLM) -> torch.nn.Module:
    return wrap_forward(model, "lean")
