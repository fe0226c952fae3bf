"""Held-out quality of the zoo models: loss of the target, agreement of each draft with it.

Agreement is measured teacher-forced: both models read the same held-out text and at every position
we compare the target's distribution p with the draft's q (docs/architecture.md, The throughput model):

- greedy agreement = P(argmax p == argmax q), the acceptance rate of greedy speculative decoding;
- sampling acceptance = 1 - E[TV(p, q)] = E[sum_x min(p(x), q(x))] (Leviathan et al. 2023).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


def eval_windows(stream: torch.Tensor, seq: int, max_windows: int) -> torch.Tensor:
    """Non-overlapping windows of ``seq + 1`` tokens from the start of a stream, ``[W, seq + 1]``."""
    count = min(max_windows, (stream.numel() - 1) // seq)
    if count < 1:
        raise ValueError(f"held-out stream of {stream.numel()} tokens is shorter than seq={seq}")
    # Windows overlap by one token so every position is predicted exactly once.
    return torch.stack([stream[i * seq : i * seq + seq + 1] for i in range(count)]).long()


@dataclass(frozen=True)
class LossReport:
    """Held-out cross-entropy of one model."""

    tokens: int
    bytes: int
    nats_per_token: float
    nats_per_byte: float

    @property
    def bits_per_byte(self) -> float:
        return self.nats_per_byte / math.log(2)


@torch.no_grad()
def held_out_loss(model: PreTrainedModel, windows: torch.Tensor, token_bytes: torch.Tensor) -> LossReport:
    """Cross-entropy over the windows; ``token_bytes[id]`` is the UTF-8 length of token ``id``."""
    total, count, nbytes = 0.0, 0, 0
    for row in windows:
        inputs, labels = row[None, :-1], row[1:]
        logits = model(input_ids=inputs).logits[0].float()  # [T, V]
        total += float(F.cross_entropy(logits, labels, reduction="sum"))
        count += labels.numel()
        nbytes += int(token_bytes[labels].sum())
    return LossReport(tokens=count, bytes=nbytes, nats_per_token=total / count, nats_per_byte=total / nbytes)


@dataclass(frozen=True)
class AgreementReport:
    """Teacher-forced agreement of one draft with the target."""

    positions: int
    greedy_agreement: float
    sampling_acceptance: float  # 1 - E[TV(p, q)]


@torch.no_grad()
def agreement(target: PreTrainedModel, draft: PreTrainedModel, windows: torch.Tensor) -> AgreementReport:
    """Greedy agreement and 1 - E[TV(p, q)] of ``draft`` against ``target`` over the windows."""
    same, overlap, count = 0, 0.0, 0
    for row in windows:
        inputs = row[None, :-1]
        p = torch.softmax(target(input_ids=inputs).logits[0].float(), dim=-1)  # [T, V]
        q = torch.softmax(draft(input_ids=inputs).logits[0].float(), dim=-1)  # [T, V]
        same += int((p.argmax(-1) == q.argmax(-1)).sum())
        overlap += float(torch.minimum(p, q).sum())
        count += inputs.shape[1]
    return AgreementReport(positions=count, greedy_agreement=same / count, sampling_acceptance=overlap / count)


def token_byte_lengths(tokenizer) -> torch.Tensor:
    """UTF-8 byte length of every token id (0 for special tokens), ``[vocab]``."""
    vocab = len(tokenizer)
    lengths = torch.zeros(vocab, dtype=torch.long)
    special = set(tokenizer.all_special_ids)
    for i in range(vocab):
        if i not in special:
            # Byte-level tokens may hold part of a multi-byte character; count raw bytes via the
            # byte-level alphabet rather than decode() (which would emit replacement characters).
            lengths[i] = len(tokenizer.convert_ids_to_tokens(i))
    return lengths
