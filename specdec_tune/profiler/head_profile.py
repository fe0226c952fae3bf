"""What the profile records of an EAGLE-3 head besides what every draft gets (docs/model.md, EAGLE-3 heads).

A draft model's guess at an output position depends on the text alone, so one recorded N_max roll-out
serves every cycle that starts inside it (``tuner.model``'s exact greedy simulation reads suffixes of
roll-outs). A head's guess depends on where its chain started too: the first step reads the target's
features, later steps its own outputs. So for a head the profile records the roll-out that *starts* at
every output position: one target forward over each greedy output (the decode's feature forward) and the
head's chain from every position at once (``engine.unroll``, the training-time-test layout, checked
against the chain by the tests). Per output position j and chain step s it keeps the rank of the target's
token in the head's distribution (0: a greedy chain accepts it; ``RANKS``: not among the head's best
``RANKS``) and the head's ``TOP`` highest probabilities: kind ``rollouts`` in ``tree_traces``. The tuner
builds the chain's position traces (step s's top probability is its confidence) and the trees' depth-wise
ranks from them.

The step inputs are the text's tokens, which along an accepted prefix are the chain's own; after a
rejection a chain feeds its own (rejected) token, so the confidences recorded past a rejection are the
text's, not the chain's (they only move where θ would have cut a cycle that already failed).

The teacher-forced comparisons of every draft (agreement, 1 − TV, the lossy front, the trees' ranks)
read a head through :func:`teacher_view`: its first step at every position, from the target's features.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec_tune.engine import FeatureForward, LoadedModel, TeacherForcedHead, make_cache, unroll

RANKS = 8
TOP = 8


def is_head(model: LoadedModel | None) -> bool:
    """Whether a loaded draft is an EAGLE-3 head (its forward is the head's own)."""
    return model is not None and model.forward == "eagle3"


def teacher_view(target: LoadedModel, draft: LoadedModel) -> torch.nn.Module:
    """The module teacher-forced comparisons read: the draft model itself, or a head's first steps."""
    return TeacherForcedHead(draft.model, target.model) if is_head(draft) else draft.model


@torch.inference_mode()
def rollout_rows(target: torch.nn.Module, head: torch.nn.Module, sequences: Sequence[torch.Tensor],
                 prompt_lens: Sequence[int], steps: int) -> list[dict]:
    """Per prompt (``sequences``: prompt + greedy output): ``{"ranks": [step][j], "top": [step][j][TOP]}`` for
    output positions j (step s's lists stop where the output does)."""
    from specdec_tune.engine import FeatureStore

    out = []
    for seq, plen in zip(sequences, prompt_lens):
        n = seq.shape[0]
        store = FeatureStore(n, head.aux_count * head.target_hidden, head.layer_ids, head.aux_count)
        FeatureForward(target, store)(seq, make_cache(target, n), 1)
        logits = unroll(head, store.read(0, n)[None], seq[None], steps)  # per step [1, n - 1, V_d]
        ranks, tops = [], []
        for s, rows in enumerate(logits):
            ranks_s, tops_s = _step(head, rows[0], seq, plen, s)
            ranks.append(ranks_s)
            tops.append(tops_s)
        out.append({"steps": steps, "ranks": ranks, "top": tops})
    return out


def _step(head, rows: torch.Tensor, seq: torch.Tensor, plen: int, s: int) -> tuple[list[int], list[list[float]]]:
    """Step ``s``'s ranks and top probabilities at every output position j it reaches (anchor plen - 2 + j
    predicts seq[plen + j + s]); a position without an anchor (a one-token prompt's first) ranks last."""
    n = seq.shape[0]
    js = range(max(0, n - plen - s))
    ranks, tops = [], []
    anchors = torch.tensor([plen - 2 + j for j in js], dtype=torch.long)
    ok = anchors >= 0
    if len(js):
        full = head.to_target_vocab(rows[anchors.clamp_min(0)].float())  # [M - s, V]
        picked = seq[plen + s:plen + s + len(js)]
        rank = (full > full.gather(1, picked[:, None])).sum(dim=1).clamp_max(RANKS)
        top = torch.softmax(full, dim=-1).topk(TOP, dim=-1).values
        ranks = torch.where(ok, rank, torch.full_like(rank, RANKS)).tolist()
        tops = [[round(x, 6) for x in r] if good else [0.0] * TOP for r, good in zip(top.tolist(), ok.tolist())]
    return ranks, tops
