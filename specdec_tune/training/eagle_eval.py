"""Held-out quality of an EAGLE-3 head, measured as the drafts' is (``training.evaluate``).

On the held-out windows the target reads the text once (its logits and the fused layers' features);
the head's training-time test (``training.eagle_train.unroll``) then gives its prediction at every anchor
for every chain step. ``greedy_agreement`` is step 1's P(argmax q == argmax p) and
``sampling_acceptance`` its E[Σ min(p, q)] at temperature 1 (q over the target vocabulary, zero outside
the draft vocabulary): the numbers the drafts' card rows carry, teacher-forced alike.
``agreement_by_step`` is step j's agreement given the data's tokens before it (a greedy chain's
conditional acceptance at position j when the data is the target's own text).
"""
from __future__ import annotations

import torch

from specdec_tune.engine import EagleHead, default_aux_layers, unroll, wrap_forward
from specdec_tune.training.eagle_stage import target_batch


@torch.no_grad()
def head_quality(target, head: EagleHead, windows: torch.Tensor, steps: int = 5) -> dict:
    """Teacher-forced agreement of ``head`` with ``target`` (HF model) over ``windows`` ``[W, S]``."""
    lean = wrap_forward(target)
    layers = default_aux_layers(int(target.config.num_hidden_layers)) if head.layer_ids is None else head.layer_ids
    ids = head.target_ids()
    same = [0] * steps
    counted = [0] * steps
    overlap, positions = 0.0, 0
    for row in windows:
        batch = row[None]
        teacher, features = target_batch(lean, batch, layers)
        anchors = batch.shape[1] - 1
        for j, logits in enumerate(unroll(head, features, batch, steps)):
            n = anchors - j  # anchors whose step j has a target
            p = teacher[0, 1 + j:1 + j + n]
            q_best = ids[logits[0, :n].argmax(-1)]
            same[j] += int((q_best == p.argmax(-1)).sum())
            counted[j] += n
            if j == 0:
                q = torch.softmax(head.to_target_vocab(logits[0, :n]).float(), dim=-1)
                overlap += float(torch.minimum(torch.softmax(p, dim=-1), q).sum())
                positions += n
    by_step = [s / c if c else float("nan") for s, c in zip(same, counted)]
    return {"greedy_agreement": by_step[0], "sampling_acceptance": overlap / max(1, positions),
            "agreement_by_step": by_step, "eval_tokens": positions}
