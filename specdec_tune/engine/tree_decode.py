"""The token-tree decode loop (batch size 1): draft a tree, verify it in one target forward, keep the
accepted path (docs/architecture.md, Engine contracts).

Invariant, as in ``engine.decode.speculative``: the target cache holds every token except the last
emitted one. A cycle feeds ``[last, n_0 .. n_{n-1}]`` (the tree breadth first) under the tree mask
(``engine.tree``), reads n + 1 next-token distributions, verifies (``engine.tree_verify``), emits the
accepted path and the target's next token, and compacts the cache to the root plus the path: the
rejected branches' keys and values are dropped, the path's are moved down to consecutive positions.
As in the chain loop, the verifier is chosen before the loop (greedy or sampling, below); greedy
cycles synchronise with the host once (verdict and node ids in one copy).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from specdec_tune.engine.decode import DecodeConfig, _check_prompt, _emit, _prefill, finish
from specdec_tune.engine.drafters import probs_from_logits
from specdec_tune.engine.features import choose_target_forward
from specdec_tune.engine.kvcache import PreallocatedCache
from specdec_tune.engine.tree import TokenTree, compact, verify_rows
from specdec_tune.engine.suffix_drafter import SuffixDrafter
from specdec_tune.engine.tree_draft import TreeDrafter
from specdec_tune.engine.tree_verify import TreeVerdict, TreeVerifyFn, tree_greedy_accept, verify_tree_sampling
from specdec_tune.engine.types import CycleStats, GenerationResult


def tree_speculative(
    model: torch.nn.Module,
    drafter: TreeDrafter | SuffixDrafter,
    prompt_ids: torch.Tensor,
    config: DecodeConfig,
    generator: torch.Generator | None = None,
    on_cycle: Callable[[CycleStats], None] | None = None,
    cache: PreallocatedCache | None = None,
    *,
    verifier: TreeVerifier | None = None,
) -> GenerationResult:
    """Speculative decoding with token trees of depth N (``config.spec.num_speculative_tokens``).

    Args:
        model: the target causal LM.
        drafter: a fresh tree drafter for this sequence (a draft model's, or suffix decoding's).
        prompt_ids: ``[T]`` prompt ids on the model's device.
        config: N (the tree depth), temperature and limits; θ and schedules do not apply to trees.
        generator: random source for sampling mode.
        on_cycle: called after every cycle with its statistics (the profiler's timing hook).
        cache: a target cache to reuse (reset here); one is allocated when absent or too small.
        verifier: replaces the configuration's (:func:`choose_tree_verifier`; tests plant wrong rules with it).

    Raises:
        ValueError: a threshold or a non-constant schedule (trees have neither), or a bad prompt.
    """
    depth_max = config.spec.num_speculative_tokens
    if config.spec.threshold > 0 or config.spec.schedule != "constant":
        raise ValueError("token trees run θ = 0 and the constant schedule")
    _check_prompt(prompt_ids)
    verifier = verifier or choose_tree_verifier(config)
    forward = choose_target_forward(model, drafter)  # plain, or one that keeps a feature head's hidden states
    # The decode loop's prefill, with room for the largest tree instead of N tokens.
    cache, tokens = _prefill(forward, prompt_ids, config.room + max(0, drafter.spec.nodes(depth_max) - depth_max), cache)
    length = prompt_ids.shape[0]
    out, cycles, eos_hit = [], [], False  # the tokens emitted, each cycle's CycleStats
    # Invariant: the target cache holds tokens[:length - 1]; the last emitted token is fed next.
    while not eos_hit and len(out) < config.max_new_tokens:
        depth = min(depth_max, config.max_new_tokens - len(out))  # never draft past the limit
        tree = drafter.propose_tree(tokens[:length], depth)
        start = length - 1
        positions, mask, ancestors = verify_rows(tree.shape, start, tokens.device)
        feed = torch.cat([tokens[start:length], tree.tokens])  # [n + 1]
        logits = forward.tree(feed, cache, positions, mask)  # [n + 1, vocab]
        verdict, path_ids = verifier(tree, logits, ancestors, generator)
        acc = len(verdict.path)
        emitted, eos_hit = _emit(out, path_ids + [verdict.next_token], config.max_new_tokens, config.eos_token_id)
        if emitted:
            tokens[length:length + emitted] = torch.tensor((path_ids + [verdict.next_token])[:emitted], device=tokens.device)
        compact(cache, length, verdict.path)  # the root plus the accepted path, moved down to consecutive positions
        forward.compact(length, verdict.path)  # and the hidden states a feature head reads, alike
        drafter.observe_path(verdict.path)
        length += emitted
        stats = CycleStats(drafted=tree.size, accepted=acc, emitted=emitted, confidences=(), outcomes=(),
                           draft_forwards=drafter.forwards, target_positions=tree.size + 1,
                           path_ranks=tuple(tree.shape.ranks[v] for v in verdict.path))
        cycles.append(stats)
        if on_cycle is not None:
            on_cycle(stats)
    finish(drafter, tokens[:length])
    return GenerationResult(prompt_tokens=prompt_ids.shape[0], token_ids=out, cycles=cycles, finished_by_eos=eos_hit)


class TreeVerifier(Protocol):
    def __call__(self, tree: TokenTree, logits: torch.Tensor, ancestors: torch.Tensor,
                 generator: torch.Generator | None) -> tuple[TreeVerdict, list[int]]:
        """The verdict on ``tree`` from the target's ``[n + 1, vocab]`` logits, and the accepted path's ids."""
        ...


class TreeGreedyVerifier:
    """Greedy tree verification; one host synchronisation (verdict and node ids in one copy)."""

    def __call__(self, tree: TokenTree, logits: torch.Tensor, ancestors: torch.Tensor,
                 generator: torch.Generator | None) -> tuple[TreeVerdict, list[int]]:
        host = torch.cat([tree_greedy_accept(tree.tokens, tree.shape, logits, ancestors), tree.tokens]).tolist()
        path = tree.shape.path(host[0] - 1)
        return TreeVerdict(path, host[1]), [host[2 + v] for v in path]


class TreeSamplingVerifier:
    """Tree speculative sampling at ``temperature`` with ``rule`` (``verify_tree_sampling`` by default)."""

    def __init__(self, temperature: float, rule: TreeVerifyFn = verify_tree_sampling) -> None:
        self.temperature = temperature
        self.rule = rule

    def __call__(self, tree: TokenTree, logits: torch.Tensor, ancestors: torch.Tensor,
                 generator: torch.Generator | None) -> tuple[TreeVerdict, list[int]]:
        verdict = self.rule(tree, probs_from_logits(logits, self.temperature), generator)
        ids = tree.tokens[list(verdict.path)].tolist() if verdict.path else []
        return verdict, ids


def choose_tree_verifier(config: DecodeConfig) -> TreeVerifier:
    """Sampling when ``temperature > 0``, else greedy."""
    return TreeSamplingVerifier(config.temperature) if config.temperature > 0 else TreeGreedyVerifier()
