"""Bigram "language models" with fixed logit tables, for fast exactness tests of the engine.

``next-token logits = table[last token]``: the engine's full loop (drafter, KV-cache bookkeeping,
verification, schedule) runs unchanged, but a forward costs microseconds, so distribution tests can
draw tens of thousands of samples in a second.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import LlamaConfig


class Bigram(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the last token: ``table[token]``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table.double()  # [V, V]
        self.config = LlamaConfig(vocab_size=table.shape[0], num_hidden_layers=1, bos_token_id=None, eos_token_id=None,
                                  pad_token_id=None)

    def forward(self, input_ids: torch.Tensor, past_key_values=None, use_cache: bool = True, logits_to_keep: int = 0,
                attention_mask=None, position_ids=None):  # a tree forward's mask and positions change nothing here
        ids = input_ids[0]
        if past_key_values is not None:  # keep the cache's length in step with the tokens fed
            for layer in past_key_values.layers:
                layer.length += ids.shape[0]
        keep = ids[-logits_to_keep:] if logits_to_keep else ids
        return SimpleNamespace(logits=self.table[keep][None])


def constant(probs) -> Bigram:
    """A model whose next-token distribution is ``probs`` after every token."""
    logp = torch.tensor(probs, dtype=torch.float64).log()
    return Bigram(logp.repeat(len(probs), 1))
