"""The token-tree decode loop (batch size 1): draft a tree, verify it in one target forward, keep the
accepted path (docs/architecture.md, Engine contracts).

Invariant, as in ``engine.decode.speculative``: the target cache holds every token except the last
emitted one. A cycle feeds ``[last, n_0 .. n_{n-1}]`` (the tree breadth first) under the tree mask
(``engine.tree``), reads n + 1 next-token distributions, verifies (``engine.tree_verify``), emits the
accepted path and the target's next token, and compacts the cache to the root plus the path: the
rejected branches' keys and values are dropped, the path's are moved down to consecutive positions.
Greedy cycles synchronise with the host once (verdict and node ids in one copy).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from specdec_tune.engine.decode import DecodeConfig, _emit, _prefill
from specdec_tune.engine.drafters import probs_from_logits
from specdec_tune.engine.kvcache import PreallocatedCache
from specdec_tune.engine.tree import TokenTree, compact, tree_forward, verify_rows
from specdec_tune.engine.tree_draft import TreeDrafter
from specdec_tune.engine.tree_verify import TreeVerdict, TreeVerifyFn, tree_greedy_accept, verify_tree_sampling
from specdec_tune.engine.types import CycleStats, GenerationResult


def tree_speculative(
    model: torch.nn.Module,
    drafter: TreeDrafter,
    prompt_ids: torch.Tensor,
    config: DecodeConfig,
    generator: torch.Generator | None = None,
    on_cycle: Callable[[CycleStats], None] | None = None,
    verify_fn: TreeVerifyFn | None = None,
    cache: PreallocatedCache | None = None,
) -> GenerationResult:
    """Speculative decoding with token trees of depth N (``config.num_speculative_tokens``).

    Args:
        model: the target causal LM.
        drafter: a fresh tree drafter for this sequence.
        prompt_ids: ``[T]`` prompt ids on the model's device.
        config: N (the tree depth), temperature and limits; θ and schedules do not apply to trees.
        generator: random source for sampling mode.
        on_cycle: called after every cycle with its statistics (the profiler's timing hook).
        verify_fn: replaces :func:`verify_tree_sampling` (tests plant wrong rules with it).
        cache: a target cache to reuse (reset here); one is allocated when absent or too small.

    Raises:
        ValueError: a threshold or a non-constant schedule (trees have neither), or a bad prompt.
    """
    if config.threshold > 0 or config.schedule != "constant":
        raise ValueError("token trees run θ = 0 and the constant schedule")
    if prompt_ids.ndim != 1 or prompt_ids.shape[0] == 0:
        raise ValueError(f"prompt must be a non-empty 1-D tensor of token ids, got shape {tuple(prompt_ids.shape)}")
    # The decode loop's prefill, with room for the largest tree instead of N tokens.
    room = replace(config, num_speculative_tokens=max(config.num_speculative_tokens, _largest(drafter, config.num_speculative_tokens)))
    cache, tokens = _prefill(model, prompt_ids, room, cache)
    length = prompt_ids.shape[0]
    out: list[int] = []
    cycles: list[CycleStats] = []
    eos_hit = False
    # Invariant: the target cache holds tokens[:length - 1]; the last emitted token is fed next.
    while not eos_hit and len(out) < config.max_new_tokens:
        depth = min(config.num_speculative_tokens, config.max_new_tokens - len(out))  # never draft past the limit
        tree = drafter.propose_tree(tokens[:length], depth)
        start = length - 1
        positions, mask, ancestors = verify_rows(tree.shape, start, tokens.device)
        feed = torch.cat([tokens[start:length], tree.tokens])  # [n + 1]
        logits = tree_forward(model, feed, cache, positions, mask)  # [n + 1, vocab]
        verdict, path_ids = _verdict(tree, logits, ancestors, config, verify_fn or verify_tree_sampling, generator)
        acc = len(verdict.path)
        emitted, eos_hit = _emit(out, path_ids + [verdict.next_token], config.max_new_tokens, config.eos_token_id)
        if emitted:
            tokens[length:length + emitted] = torch.tensor((path_ids + [verdict.next_token])[:emitted], device=tokens.device)
        # Target cache: the root plus the accepted path, moved down to consecutive positions.
        compact(cache, length, verdict.path)
        drafter.observe_path(verdict.path)
        length += emitted
        stats = CycleStats(drafted=tree.size, accepted=acc, emitted=emitted, confidences=(), outcomes=(),
                           draft_forwards=drafter.forwards, target_positions=tree.size + 1,
                           path_ranks=tuple(tree.shape.ranks[v] for v in verdict.path))
        cycles.append(stats)
        if on_cycle is not None:
            on_cycle(stats)
    return GenerationResult(prompt_tokens=prompt_ids.shape[0], token_ids=out, cycles=cycles, finished_by_eos=eos_hit)


def _largest(drafter: TreeDrafter, depth: int) -> int:
    """The most nodes a tree of ``depth`` levels can have (the verify forward's extra positions)."""
    return drafter.spec.nodes(depth)


def _verdict(tree: TokenTree, logits: torch.Tensor, ancestors: torch.Tensor, config: DecodeConfig,
             verify_s: TreeVerifyFn, generator: torch.Generator | None) -> tuple[TreeVerdict, list[int]]:
    """The verdict and the accepted path's token ids, on the host."""
    if config.temperature > 0:
        verdict = verify_s(tree, probs_from_logits(logits, config.temperature), generator)
        ids = tree.tokens[list(verdict.path)].tolist() if verdict.path else []
        return verdict, ids
    # The cycle's one host synchronisation: verdict and node ids in one copy.
    host = torch.cat([tree_greedy_accept(tree.tokens, tree.shape, logits, ancestors), tree.tokens]).tolist()
    path = tree.shape.path(host[0] - 1)
    return TreeVerdict(path, host[1]), [host[2 + v] for v in path]
