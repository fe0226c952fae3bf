"""Tiny random Llama models and tokenizers for tests (built from configs; no downloads)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

EOS = "<|endoftext|>"

CORPUS = (
    "def add(a, b):\n    return a + b\n\n"
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "for i in range(10):\n    print(i, i * i)\n"
) * 4  # what the tiny tokenizers of the test models are trained on


def tiny_llama(vocab: int = 32, layers: int = 2, hidden: int = 32, seed: int = 0, sharpness: float = 1.0,
               dtype: torch.dtype = torch.float64) -> LlamaForCausalLM:
    """A random Llama; ``sharpness`` scales the LM head so next-token distributions are peaked."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model.to(dtype).eval().requires_grad_(False)


def tiny_tokenizer(corpus: str, vocab: int):
    """A byte-level BPE tokenizer with an EOS token, as an HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([corpus], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)


def save_tiny_model(folder: Path, tokenizer, layers: int, seed: int, hidden: int = 32) -> Path:
    """Save a tiny fp32 Llama plus tokenizer in HF format (what a user's local model folder looks like)."""
    model = tiny_llama(vocab=len(tokenizer), layers=layers, hidden=hidden, seed=seed, dtype=torch.float32)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
