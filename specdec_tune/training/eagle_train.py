"""Training an EAGLE-3 head (``engine.eagle``): its draft vocabulary, a warm start from the target, and the
training-time test.

Training-time test (EAGLE-3, arXiv 2503.01840, Section 3.2, "Training-time test"): at decode time the
head's second step reads its *own* output where the first read the target's fused features, so it is
trained that way. One batch is unrolled ``steps`` times over every anchor position t at once: step 0
reads ``fc([l_t, m_t, h_t])`` with the token x_{t+1}; step j reads step j - 1's pre-norm output at the same
anchor with x_{t+1+j}, sits at position t + j, and predicts x_{t+2+j}. Attention follows the decode-time
cache exactly: a query of step j at anchor t sees step 0's keys at anchors ≤ t (the committed entries,
built from target features) and the keys of steps 1..j at anchor t only (the chain's own entries); the
"diagonal" layout of EAGLE's ``traineagle3/cnets.py`` and SpecForge's ``core/eagle3.py``
(``OnlineEagle3Model.forward``, ``length`` = 7 there). The tokens fed are the data's, which on the target's own
greedy text (the recipe's data) are the tokens a greedy chain is verified against, as the paper trains on
responses the target regenerated.

Loss: per step, the soft cross-entropy between the target's distribution restricted to the draft
vocabulary (renormalised) and the head's, over anchors whose target argmax lies in the draft vocabulary
(SpecForge ``_compute_target_p_padded``), weighted 0.8^j (its ``ploss_weight``); no feature loss (EAGLE-3
drops EAGLE's). The unrolled forward is the engine's (``engine.eagle_unroll.unroll``, which the profiler's
roll-outs use too), checked against the decode-time chain (``tests/engine/test_eagle.py``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from specdec_tune.engine import EagleHead, unroll


def draft_vocabulary(streams: list[torch.Tensor], size: int, vocab: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """The ``size`` most frequent target ids in ``streams`` (ties: lower id), plus ``always`` (EOS), sorted:
    EAGLE-3's draft vocabulary (the paper keeps the training data's frequent tokens)."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for s in streams:
        counts += torch.bincount(s.flatten().long(), minlength=vocab)[:vocab]
    counts[list(always)] = counts.max() + 1
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))[:size]
    return torch.tensor(sorted(order), dtype=torch.long)


def coverage(streams: list[torch.Tensor], ids: torch.Tensor, vocab: int) -> float:
    """Share of the tokens in ``streams`` that the draft vocabulary ``ids`` holds."""
    inside = torch.zeros(vocab, dtype=torch.bool)
    inside[ids] = True
    total = sum(s.numel() for s in streams)
    return sum(int(inside[s.flatten().long()].sum()) for s in streams) / max(1, total)


@torch.no_grad()
def init_from_target(head: EagleHead, target, draft_ids: torch.Tensor, layers: tuple[int, ...]) -> int:
    """Warm start: the target's embedding (frozen: the head shares it), final norm and LM-head rows of the
    draft vocabulary; ``fc`` passes the highest fused layer through; the decoder layer is the target's layer
    that reads that residual, on the feature half of its input (the token half starts small). The head
    then begins as the target with its top layers skipped. Returns the copied target layer."""
    base, hidden = target.model, head.hidden_size
    high = max(layers)
    index = min(high, len(base.layers) - 1)
    source = base.layers[index]
    head.embed_tokens.weight.copy_(base.embed_tokens.weight)
    head.embed_tokens.weight.requires_grad_(False)
    head.lm_head.weight.copy_(target.lm_head.weight[draft_ids])
    head.norm.weight.copy_(base.norm.weight)
    head.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
    head.t2d.zero_().index_fill_(0, draft_ids, True)
    head.fc.weight.zero_()
    slot = sorted(layers).index(high) * head.target_hidden
    head.fc.weight[:, slot:slot + head.target_hidden].copy_(torch.eye(hidden, head.target_hidden))
    mid, attn = head.midlayer, source.self_attn
    for mine, theirs in ((mid.self_attn.q_proj, attn.q_proj), (mid.self_attn.k_proj, attn.k_proj),
                         (mid.self_attn.v_proj, attn.v_proj)):
        mine.weight[:, :hidden].normal_(0.0, 0.02)
        mine.weight[:, hidden:].copy_(theirs.weight)
    mid.self_attn.o_proj.weight.copy_(attn.o_proj.weight)
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(mid.mlp, name).weight.copy_(getattr(source.mlp, name).weight)
    mid.input_layernorm.weight.fill_(1.0)
    mid.hidden_norm.weight.copy_(source.input_layernorm.weight)
    mid.post_attention_layernorm.weight.copy_(source.post_attention_layernorm.weight)
    return index


def ttt_loss(head: EagleHead, features: torch.Tensor, tokens: torch.Tensor, teacher: torch.Tensor,
             steps: int, decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """The weighted loss of one batch and each step's greedy agreement (draft argmax == target argmax, over
    the anchors it is scored on). ``teacher``: the target's logits ``[B, S, V]`` on ``tokens``."""
    draft_ids = head.target_ids()
    anchors = tokens.shape[1] - 1
    total = features.new_zeros(())
    agree: list[float] = []
    for j, logits in enumerate(unroll(head, features, tokens, steps)):
        t = F.pad(teacher[:, 1 + j:1 + j + anchors], (0, 0, 0, max(0, anchors - (tokens.shape[1] - 1 - j))))
        valid = torch.zeros(anchors, dtype=torch.bool, device=t.device)
        valid[:anchors - j] = True
        best = t.argmax(-1)  # [B, A]
        mask = valid[None] & head.t2d[best]
        p = torch.softmax(t[..., draft_ids].float(), dim=-1)
        ce = -(p * F.log_softmax(logits.float(), dim=-1)).sum(-1)
        count = mask.sum().clamp_min(1)
        total = total + decay ** j * (ce * mask).sum() / count
        agree.append(float(((draft_ids[logits.argmax(-1)] == best) & valid[None]).sum()) / max(1, int(valid.sum()) * t.shape[0]))
    return total, agree


def lr_schedule(step: int, max_steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak (by steps only: the stage's budget is steps)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return peak * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress)))
