"""Verification of a token tree, as pure functions (no timing, no I/O).

Greedy: the accepted path is the longest root-to-node path whose every token equals the target's
argmax at its parent; the next token is the target's argmax after the path's last node. The emitted
text is therefore the target's own greedy continuation, whatever the tree.

Sampling: recursive rejection sampling over siblings, the multi-draft rule of SpecInfer (Miao et al.
2023, "SpecInfer", Algorithm 2 "multi-step speculative sampling") and of SpecTr's token-level
selection with i.i.d. drafts (Sun et al. 2023, "SpecTr", Section 4), which Yin et al. 2024 (seed 003,
batch speculative decoding) analyse. At a node with target distribution p, the residual starts at
r = p; each child c in turn, drawn from its own proposal q_c independently of the verdicts before
it, is accepted with probability min(1, r(x_c) / q_c(x_c)); on rejection r becomes
norm(max(r - q_c, 0)). When every child is rejected (or there is none) the next token is sampled
from r. By induction over the siblings from the last one back, each step turns a sample of the next
residual into a sample of the current one (the single-draft argument of Leviathan et al. 2023,
Appendix A.1), so the emitted token is distributed as p, and along an accepted path the same holds
at every depth: the output is exactly the target's. A deterministic proposal (greedy top-k
children, n-gram) is the point mass q_c = one_hot(x_c): accepted with probability r(x_c), and on
rejection x_c is removed from r.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

from specdec_tune.engine.tree import TokenTree
from specdec_tune.core.trees import TreeShape


@dataclass(frozen=True)
class TreeVerdict:
    """Outcome of verifying one tree.

    Attributes:
        path: accepted nodes, root's child first (``()``: none accepted).
        next_token: the target's token after the path (bonus or recovered).
    """

    path: tuple[int, ...]
    next_token: int


TreeVerifyFn = Callable[[TokenTree, torch.Tensor, "torch.Generator | None"], TreeVerdict]


def tree_greedy_accept(tokens: torch.Tensor, shape: TreeShape, target_logits: torch.Tensor,
                       ancestors: torch.Tensor) -> torch.Tensor:
    """Greedy tree verification without leaving the device: ``[2]`` int64 (fed row of the last
    accepted node, 0 = the root; the target's token after it).

    Args:
        tokens: ``[n]`` node ids.
        shape: the tree's parents.
        target_logits: ``[n + 1, vocab]`` target logits at the fed rows (root first).
        ancestors: ``[n + 1, n + 1]`` the tree mask (``engine.tree.tree_attention``).
    """
    n = tokens.shape[0]
    target_ids = target_logits.argmax(dim=-1)  # [n + 1]
    if n == 0:
        return torch.stack([torch.zeros((), dtype=torch.long, device=tokens.device), target_ids[0]])
    parent_rows, rank = _shape_tensors(shape, str(tokens.device))  # [n], [n]
    match = tokens == target_ids[parent_rows]  # [n]
    ok = ~(ancestors[1:, 1:] & ~match[None, :]).any(dim=1)  # [n]: the node and all its ancestors match
    # The deepest accepted node (the first in breadth-first order among equals); -1 when none.
    score = torch.where(ok, rank, -1)
    best = score.argmax()
    row = torch.where(score[best] >= 0, best + 1, torch.zeros_like(best))
    return torch.stack([row, target_ids[row]])


@lru_cache(maxsize=256)
def _shape_tensors(shape: TreeShape, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per shape, once: each node's parent row ``[n]`` and its order key ``[n]`` (deeper first, then
    breadth-first order)."""
    n = shape.size
    parent_rows = torch.tensor(shape.parents, device=device) + 1
    depth = torch.tensor(shape.depths, device=device)
    return parent_rows, depth * (n + 1) + (n - torch.arange(n, device=device))


def verify_tree_greedy(tree: TokenTree, target_logits: torch.Tensor, ancestors: torch.Tensor) -> TreeVerdict:
    """:func:`tree_greedy_accept` read back to the host (one synchronisation)."""
    row, nxt = tree_greedy_accept(tree.tokens, tree.shape, target_logits, ancestors).tolist()
    return TreeVerdict(tree.shape.path(row - 1), nxt)


def verify_tree_sampling(tree: TokenTree, target_probs: torch.Tensor, generator: torch.Generator | None = None) -> TreeVerdict:
    """Recursive rejection sampling over siblings, depth by depth (module docstring).

    Args:
        tree: the drafted tree; ``tree.probs[i]`` is node i's proposal q (``None``: point masses).
        target_probs: ``[n + 1, vocab]`` target distributions p at the fed rows (temperature applied).
        generator: random source.
    """
    tokens = tree.tokens.tolist()
    shape = tree.shape
    path: list[int] = []
    row = 0  # fed row of the current node (0: the root)
    residual = target_probs[0]
    while True:
        accepted = None
        for child in shape.children[row]:
            x = tokens[child]
            q = None if tree.probs is None else tree.probs[child]
            qx = 1.0 if q is None else float(q[x])
            u = float(torch.rand((), generator=generator, device=target_probs.device))
            if u * qx < float(residual[x]):  # accept with probability min(1, r(x) / q(x))
                accepted = child
                break
            residual = _reject(residual, q, x)
        if accepted is None:
            nxt = int(torch.multinomial(residual, 1, generator=generator))
            return TreeVerdict(tuple(path), nxt)
        path.append(accepted)
        row = accepted + 1
        residual = target_probs[row]


def _reject(residual: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
    """norm(max(r - q, 0)); for a point mass at x: r with x removed, renormalised."""
    if q is None:
        out = residual.clone()
        out[x] = 0
    else:
        out = (residual - q).clamp_min(0)
    total = out.sum()
    # A zero residual means the rejection had probability 0 (r == q); keep r rather than divide by 0.
    return out / total if total > 0 else residual
