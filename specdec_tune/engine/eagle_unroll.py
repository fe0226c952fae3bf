"""An EAGLE-3 head's chain from every position of a text at once (EAGLE-3's "training-time test" layout).

Step 0 reads the target's fused features at anchor t with the token x_{t+1}; step j reads step j - 1's
pre-norm output at the same anchor with x_{t+1+j}, sits at position t + j and predicts x_{t+2+j}. A query
of step j at anchor t attends to step 0's keys at anchors <= t (the committed cache entries, built from
target features) and to the keys of steps 1..j at anchor t only (the chain's own entries): exactly the
cache a greedy chain started after anchor t reads (``engine.eagle_draft``), for every t in one pass. This
is the "diagonal" attention of EAGLE's training code (``traineagle3/cnets.py``) and SpecForge
(``core/eagle3.py``). Used by the training stage (``training.eagle_train``: the loss of every step) and the
profiler (every output position's roll-out, ``profiler.head_profile``); tests check it against the chain.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_tune.engine.eagle import EagleHead


def unroll(head: EagleHead, features: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The training-time test (module docstring): draft-vocabulary logits ``[B, S - 1, V_d]`` per step j at
    anchors t = 0..S-2, from target ``features`` ``[B, S, n·H_t]`` and ``tokens`` ``[B, S]`` (step j reads
    x_{t+1+j}: 0 past the end, where its loss is masked)."""
    b, s = tokens.shape
    anchors = s - 1
    g = head.fc(features[:, :anchors])
    cos, sin = head.rope(anchors + steps, g)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    out = []
    for j in range(steps):
        ids = F.pad(tokens[:, 1 + j:1 + j + anchors], (0, max(0, anchors - (s - 1 - j))))
        q, k, v = head.project(head.mix(ids, g), cos[j:j + anchors], sin[j:j + anchors])
        keys.append(k)
        values.append(v)
        g = head.finish(g, _diagonal_attention(q, keys, values, head.head_dim ** -0.5))
        out.append(head.draft_logits(g))
    return out


def _diagonal_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                        scale: float) -> torch.Tensor:
    """Step j's attention (``q`` ``[B, H, A, D]``): step 0's keys causally, later steps' at the same anchor."""
    heads = q.shape[1]
    if keys[0].shape[1] != heads:  # grouped-query heads
        keys = [k.repeat_interleave(heads // k.shape[1], dim=1) for k in keys]
        values = [v.repeat_interleave(heads // v.shape[1], dim=1) for v in values]
    a = q.shape[2]
    causal = torch.ones(a, a, dtype=torch.bool, device=q.device).tril()
    scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
    scores += [(q * k).sum(-1, keepdim=True) * scale for k in keys[1:]]
    weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    att = weights[..., :a] @ values[0]
    for i, v in enumerate(values[1:]):
        att = att + weights[..., a + i:a + i + 1] * v
    b, h, _, d = att.shape
    return att.transpose(1, 2).reshape(b, a, h * d)
