"""The bigram stub (``tests.support.stub_models``) with the batched engine's ``forward_ragged``: a batch's whole loop
(ragged drafts, per-row verdicts, rows leaving) at microseconds a forward, for distribution tests."""
from __future__ import annotations

import torch

from tests.support.stub_models import Bigram


class RaggedBigram(Bigram):
    """``next-token logits = table[last token]`` for every row of a batch (``engine.ragged`` protocol)."""

    def forward_ragged(self, ids: torch.Tensor, cache, starts: torch.Tensor, pick: torch.Tensor | None) -> torch.Tensor:
        logits = self.table[ids]  # [B, W, V]: each position's next-token logits depend on its own token only
        if pick is None:
            return logits
        return logits[torch.arange(ids.shape[0]), pick]


def ragged(model: Bigram) -> RaggedBigram:
    out = RaggedBigram(model.table)
    return out
