"""Memory-bandwidth utilisation (MBU) of decoding: bytes a decoding step must read ÷ its time ÷ the card's
bandwidth. Pure: numbers in, numbers out (a model is read through ``named_parameters`` only).

At batch size 1 a decoding step reads every weight it multiplies by once and the key/value cache of every
earlier position once; arithmetic is negligible beside it, so the step's time is bounded below by those
bytes over the memory bandwidth. MBU = bytes per token × tokens/s ÷ bandwidth says how close an engine gets.
The embedding table is the exception: a step reads one row of it, not the table (an LM head tied to it
is read whole, as the head). gpt-fast's convention counts every parameter byte and no cache
(``model_size × tokens/s``): :func:`weight_bytes` with ``whole_embedding=True``. Its anchor: Llama-2-7B in
bf16 at 104.9 tokens/s and 1,397 GB/s on an A100-80GB (SXM, 2,039 GB/s), 69 % (gpt-fast README,
Benchmarks; that A100 was power-limited to 330 W).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Card:
    """A GPU's peak memory bandwidth as its maker publishes it.

    Attributes:
        name: the card.
        match: lower-case substrings that all occur in ``torch.cuda.get_device_name()`` for it.
        bytes_per_s: peak memory bandwidth, bytes per second (decimal GB/s × 1e9, as datasheets give it).
        source: where the number is published.
    """

    name: str
    match: tuple[str, ...]
    bytes_per_s: float
    source: str


_H100 = "https://www.nvidia.com/en-us/data-center/h100/ (datasheet, Specifications table)"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (Specifications table)"
_A100 = "https://www.nvidia.com/en-us/data-center/a100/ (Specifications table)"
# Most specific first: the first card whose substrings all occur in the device name is the one.
CARDS: tuple[Card, ...] = (
    Card("H200 (SXM or NVL)", ("h200",), 4.8e12, _H200),
    Card("H100 NVL", ("h100", "nvl"), 3.9e12, _H100),
    Card("H100 PCIe", ("h100", "pcie"), 2.0e12, _H100),
    Card("H100 SXM", ("h100",), 3.35e12, _H100),  # "NVIDIA H100 80GB HBM3" is the SXM5 board
    Card("A100 80GB PCIe", ("a100", "80gb", "pcie"), 1.935e12, _A100),
    Card("A100 80GB SXM", ("a100", "80gb"), 2.039e12, _A100),
    Card("A100 40GB", ("a100",), 1.555e12, _A100),
)
GPT_FAST_A100 = {"tokens_per_s": 104.9, "bytes_per_s": 1397.31e9, "card": "A100 80GB SXM",
                 "source": "https://github.com/pytorch-labs/gpt-fast README, Benchmarks (Llama-2-7B, Base)"}


def find_card(device_name: str) -> Card | None:
    """The card of ``device_name`` (``torch.cuda.get_device_name()``), None when it is not in :data:`CARDS`."""
    name = device_name.lower()
    return next((c for c in CARDS if all(m in name for m in c.match)), None)


def weight_bytes(model: Any, *, whole_embedding: bool = False) -> int:
    """Bytes of ``model``'s weights one decoding step reads: every parameter once (tied ones once), the
    input embedding as one row unless it is also the LM head or ``whole_embedding`` (gpt-fast's count).
    Only shapes and dtypes are read: a model on the ``meta`` device (nothing allocated) counts the same."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied parameter is listed once
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if whole_embedding or (head is not None and head.weight is embed):
        return total
    return total - embed.numel() * embed.element_size() + embed.shape[1] * embed.element_size()


def kv_bytes_per_position(layers: int, kv_heads: int, head_dim: int, element_bytes: int) -> int:
    """Bytes of one cached position: a key and a value of ``kv_heads × head_dim`` in every layer."""
    return 2 * layers * kv_heads * head_dim * element_bytes


def kv_bytes_of(config: Any, element_bytes: int) -> int:
    """:func:`kv_bytes_per_position` of a transformers config (grouped-query heads and head_dim as it says)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    return kv_bytes_per_position(int(text.num_hidden_layers), kv, head_dim, element_bytes)


def bytes_per_token(weights: int, kv_per_position: int, mean_context: float) -> float:
    """Bytes a B = 1 decoding step reads: the weights, and the cache of ``mean_context`` earlier positions."""
    return weights + kv_per_position * mean_context


def mbu(bytes_read: float, tokens_per_s: float, bandwidth: float) -> float:
    """Memory-bandwidth utilisation: achieved bytes/s (``bytes_read`` per token × tokens/s) ÷ ``bandwidth``."""
    if bandwidth <= 0 or tokens_per_s < 0 or bytes_read < 0:
        raise ValueError(f"need bandwidth > 0, tokens/s >= 0, bytes >= 0; "
                         f"got {bandwidth}, {tokens_per_s}, {bytes_read}")
    return bytes_read * tokens_per_s / bandwidth


def mean_context(prompt_lengths: Iterable[int], new_tokens: int) -> float:
    """The mean number of cached positions a decoding step attends to over prompts decoding ``new_tokens``
    each: a prompt of P tokens reads P, P + 1, ..., P + n - 1 positions, mean P + (n - 1) / 2."""
    lengths = list(prompt_lengths)
    if not lengths or new_tokens < 1:
        raise ValueError("need at least one prompt and one new token")
    return sum(lengths) / len(lengths) + (new_tokens - 1) / 2
