"""A synthetic tokenizer of a real family's vocabulary size, for model shapes (:mod:`engine.shapes`).

A shape has no trained tokenizer, and its random weights make any text meaningless, but prompts
still need realistic lengths and ids spread over the whole vocabulary. This tokenizer splits text
the way byte-level BPE pre-tokenisers do (a run of letters with its leading space, up to three
digits, a run of punctuation, whitespace; the GPT-2 / Llama 3 pattern without Unicode classes), so
a prompt gets about as many tokens as a 128k-150k vocabulary gives English and code, and maps each
piece to a fixed id by a hash (BLAKE2b: the same in every process and run). Decoding gives back a
piece this tokenizer has seen, else ``<id>``.

It offers what the engine and profiler call on a Hugging Face tokenizer: ``__call__(text,
return_tensors="pt").input_ids``, ``decode``, ``get_vocab``, ``eos_token_id``, ``pad_token_id``,
``__len__``.
"""
from __future__ import annotations

import hashlib
import re
from types import SimpleNamespace
from typing import Any

_PIECES = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?\d{1,3}| ?[^\sA-Za-z\d]+|\s+(?!\S)|\s+")


class ShapeTokenizer:
    """Hash-based tokenizer over ``vocab_size`` ids; ``eos_token_id`` is never produced by encoding.

    Args:
        vocab_size: ids 0..vocab_size-1 (the family's tokenizer size, not the padded embedding).
        eos_token_id: the family's end-of-sequence id.
        family: the family's name, part of every id's hash (two families tokenise differently).
    """

    def __init__(self, vocab_size: int, eos_token_id: int, family: str) -> None:
        if not 0 <= eos_token_id < vocab_size:
            raise ValueError(f"eos_token_id {eos_token_id} is outside the vocabulary 0..{vocab_size - 1}")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.pad_token_id = eos_token_id
        self.family = family
        self.name_or_path = f"shape-tokenizer:{family}"
        self._seen: dict[int, str] = {}

    def __len__(self) -> int:
        return self.vocab_size

    def token_id(self, piece: str) -> int:
        """The id of one piece: a hash onto every id but ``eos_token_id``."""
        digest = hashlib.blake2b(f"{self.family}\0{piece}".encode(), digest_size=8).digest()
        tid = int.from_bytes(digest, "little") % (self.vocab_size - 1)
        return tid + 1 if tid >= self.eos_token_id else tid

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in _PIECES.findall(text):
            tid = self.token_id(piece)
            self._seen.setdefault(tid, piece)
            ids.append(tid)
        return ids

    def __call__(self, text: str, return_tensors: str | None = None, **_: Any) -> SimpleNamespace:
        ids = self.encode(text)
        if return_tensors == "pt":
            import torch

            return SimpleNamespace(input_ids=torch.tensor([ids], dtype=torch.long))
        return SimpleNamespace(input_ids=ids)

    def decode(self, ids, skip_special_tokens: bool = False, **_: Any) -> str:
        out = []
        for tid in (ids.tolist() if hasattr(ids, "tolist") else ids):
            if tid == self.eos_token_id:
                if not skip_special_tokens:
                    out.append("<eos>")
                continue
            out.append(self._seen.get(int(tid), f"<{int(tid)}>"))
        return "".join(out)

    def get_vocab(self) -> dict[str, int]:
        """Every id under a name of its own (two shape tokenizers of one family compare equal)."""
        return {f"<{self.family}:{i}>": i for i in range(self.vocab_size)}
