"""Measuring what the consistency rule (``specdec_tune.core.consistency``) needs from a model: the
reference's logit margin where two greedy outputs part, and how much logits move between forwards
that round differently (the measurement behind the bf16 tolerance, ``benchmarks/bf16_tolerance.py``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec_tune.core.consistency import EXACT, Consistency, first_difference, judge, ulp
from specdec_tune.engine import LoadedModel, forward_with_cache, make_cache


def _dtype_name(model: LoadedModel) -> str:
    return str(model.dtype).replace("torch.", "")


def _logits(model: torch.nn.Module, ids: torch.Tensor, cache, keep: int) -> torch.Tensor:
    """``[keep, vocab]`` float32 logits of the last ``keep`` positions of ``ids`` ``[k]``."""
    return forward_with_cache(model, ids[None], cache, logits_to_keep=keep).logits[0].float()


def reference_margin(target: LoadedModel, prompt_ids: torch.Tensor, reference: Sequence[int], position: int,
                     other_token: int) -> tuple[float, float]:
    """(``l[ref] - l[other]``, top logit) of the target's next-token logits after the prompt and
    ``reference[:position]``, from one teacher-forced forward in the model's own dtype."""
    ids = torch.cat([prompt_ids, torch.tensor(list(reference[:position]), dtype=torch.long, device=prompt_ids.device)])
    with torch.inference_mode():
        cache = make_cache(target.model, ids.shape[0] + 1)
        row = _logits(target.model, ids, cache, 1)[-1]  # [vocab]
    return float(row[reference[position]] - row[other_token]), float(row.max())


def check_outputs(target: LoadedModel, prompt_ids: torch.Tensor, reference: Sequence[int],
                  other: Sequence[int]) -> Consistency:
    """The consistency rule for one prompt: identical, or parted at a near-tie, or differing. The
    margin is measured only when the outputs part inside both (and the dtype is not float32)."""
    dtype = _dtype_name(target)
    pos = first_difference(reference, other)
    if pos is None or dtype in EXACT or pos >= min(len(reference), len(other)):
        return judge(reference, other, dtype)
    margin, top = reference_margin(target, prompt_ids, reference, pos, other[pos])
    return judge(reference, other, dtype, margin, top)


@dataclass(frozen=True)
class SpreadRow:
    """How far one position's logits moved between a k-token forward and one-token forwards.

    Attributes:
        k: tokens per forward of the other path (``0``: one forward over the whole sequence).
        position: index of the generated token the logits predict.
        max_abs: the largest |logit difference| over the vocabulary.
        margin_shift: how far the reference's top-two margin moved, |Δl[top1] - Δl[top2]|.
        margin: the top-two margin of the one-token path.
        top_logit: the top logit of the one-token path (sets the ulp).
        ulps: ``margin_shift`` in ulps of ``top_logit`` in the model's dtype.
    """

    k: int
    position: int
    max_abs: float
    margin_shift: float
    margin: float
    top_logit: float
    ulps: float


def rounding_spread(model: LoadedModel, prompt_ids: torch.Tensor, steps: int, ks: Sequence[int]) -> list[SpreadRow]:
    """Greedy-decode ``steps`` tokens with one-token forwards (the target-only path), then feed the same
    tokens again in forwards of k tokens (the verify path of a cycle that accepts everything) and in
    one forward over the whole sequence (``k = 0``), and compare each position's logits."""
    net, dtype = model.model, _dtype_name(model)
    one, seq = _one_token_logits(net, prompt_ids, steps)
    rows = []
    for k in ks:
        other = _chunked_logits(net, prompt_ids, seq, k)
        for j, (a, b) in enumerate(zip(one, other)):
            top2 = a.topk(2).indices
            d = b - a
            shift = float((d[top2[0]] - d[top2[1]]).abs())
            top = float(a[top2[0]])
            rows.append(SpreadRow(k, j, float(d.abs().max()), shift, float(a[top2[0]] - a[top2[1]]), top,
                                  shift / ulp(top, dtype)))
    return rows


def _one_token_logits(net: torch.nn.Module, prompt_ids: torch.Tensor, steps: int) -> tuple[list, list[int]]:
    """Logits of ``steps`` greedy one-token steps after the prompt, and the fed tokens
    (the last prompt token first)."""
    with torch.inference_mode():
        cache = make_cache(net, prompt_ids.shape[0] + steps + 1)
        if prompt_ids.shape[0] > 1:
            _logits(net, prompt_ids[:-1], cache, 1)
        seq, out = [int(prompt_ids[-1])], []
        for _ in range(steps):
            row = _logits(net, torch.tensor([seq[-1]], device=prompt_ids.device), cache, 1)[-1]
            out.append(row)
            seq.append(int(row.argmax()))
    return out, seq[:-1]


def _chunked_logits(net: torch.nn.Module, prompt_ids: torch.Tensor, seq: list[int], k: int) -> list:
    """The same positions' logits from forwards of ``k`` tokens (0: the prompt and ``seq`` at once)."""
    with torch.inference_mode():
        cache = make_cache(net, prompt_ids.shape[0] + len(seq) + 1)
        fed = torch.tensor(seq, device=prompt_ids.device)
        if k == 0:
            return list(_logits(net, torch.cat([prompt_ids[:-1], fed]), cache, len(seq)))
        if prompt_ids.shape[0] > 1:
            _logits(net, prompt_ids[:-1], cache, 1)
        out: list = []
        for start in range(0, len(seq), k):
            chunk = fed[start:start + k]
            out.extend(_logits(net, chunk, cache, chunk.shape[0]))
        return out
