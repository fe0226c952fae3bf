"""Data contracts of the engine (one per boundary).

Words (docs/architecture.md, Words): p = target probabilities, q = draft probabilities, N = the most tokens
drafted in one cycle, a *cycle* drafts L <= N tokens and verifies them in one target forward over
L + 1 positions, then appends one target token (bonus if all L were accepted, recovered otherwise),
so a cycle yields tokens-per-cycle tau = accepted + 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch


@dataclass(frozen=True)
class Draft:
    """What a drafter proposes for one cycle.

    Attributes:
        tokens: proposed token ids, ``[L]`` (int64, on the decode device). L may be 0.
        probs: draft distribution q at each proposed position, ``[L, vocab]``, or ``None`` for drafters
            without a distribution (n-gram lookup; treated as a point mass in sampling mode).
        confidence: the number compared with θ at each proposed position, ``[L]``: the draft's top
            probability there (rule ``before``; in greedy mode that is the proposed token's
            probability), or the proposed token's probability (rule ``hf``); 1.0 for n-gram.
        stopped_by_threshold: θ ended drafting before the budget: rule ``before``, the next
            position's top probability (cumulative kind: times the drafted prefix's probability)
            was below θ (its distribution was computed, no token drawn); rule ``hf``, the last
            proposed token's probability was below θ.
        token_probs: each proposed token's own draft probability q(x_i), ``[L]`` (the cumulative
            kind's prefix product; equal to ``confidence`` when greedy); ``None`` for n-gram.
        threshold: the θ this proposal ran with (the adaptive kind moves it between cycles).
    """

    tokens: torch.Tensor  # [L]
    probs: torch.Tensor | None  # [L, vocab]
    confidence: torch.Tensor  # [L]
    stopped_by_threshold: bool = False
    token_probs: torch.Tensor | None = None  # [L]
    threshold: float = 0.0

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one draft.

    Attributes:
        num_accepted: length of the accepted prefix of the draft (0..L).
        next_token: the token the target appends after the accepted prefix (bonus or recovered).
    """

    num_accepted: int
    next_token: int


@dataclass(frozen=True)
class CycleStats:
    """Counts for one speculative cycle (counting happens here; aggregation lives in profiler/db).

    Attributes:
        drafted: tokens proposed (L).
        accepted: tokens of the draft accepted (0..L).
        emitted: tokens appended to the output by this cycle (accepted + 1, fewer when EOS or the
            max_new_tokens limit cut the cycle short).
        confidences: draft confidence of each proposed token (``Draft.confidence``), ``[L]``.
        outcomes: for each proposed token, True if accepted, ``[L]`` (accepted tokens form a prefix).
        draft_forwards: draft model forwards run in this cycle (0 for n-gram).
        target_positions: positions the target's verify forward processed (L + 1 normally).
        token_probs: each proposed token's own draft probability (``Draft.token_probs``), ``[L]``;
            empty for n-gram.
        threshold: θ of this cycle (``Draft.threshold``; moves with the adaptive kind).
        target_probs: the target's probability of each proposed token, ``[L]`` (sampling mode; the
            replay of lossy acceptance reads it); empty when greedy.
        path_ranks: token trees only: the sibling rank of each accepted node (0 = the draft's best
            child), ``[accepted]``; ``()`` for a chain.
    """

    drafted: int
    accepted: int
    emitted: int
    confidences: tuple[float, ...]
    outcomes: tuple[bool, ...]
    draft_forwards: int = 0
    target_positions: int = 0
    token_probs: tuple[float, ...] = ()
    threshold: float = 0.0
    target_probs: tuple[float, ...] = ()
    path_ranks: tuple[int, ...] = ()


@dataclass
class GenerationResult:
    """Output of one decode call (baseline or speculative) for one prompt."""

    prompt_tokens: int
    token_ids: list[int]  # new tokens only
    cycles: list[CycleStats] = field(default_factory=list)
    finished_by_eos: bool = False

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)


class Drafter(Protocol):
    """A proposer of draft tokens (draft model or n-gram lookup)."""

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        """Propose up to ``max_tokens`` tokens continuing ``context`` (``[T]`` all tokens so far)."""
        ...

    def observe(self, num_accepted: int) -> None:
        """Feedback after verification: how many of the last proposal were accepted."""
        ...


def acceptance_per_position(cycles: Sequence[CycleStats], max_positions: int | None = None) -> tuple[list[float], list[float]]:
    """Per-position acceptance from cycle records.

    Returns:
        (alpha, beta): alpha_i = P(token i accepted | tokens 1..i-1 accepted and token i drafted)
        (conditional), beta_i = accepted_at_i / cycles (vLLM's unconditional per-position rate).
    """
    if max_positions is None:
        max_positions = max((c.drafted for c in cycles), default=0)
    reached, accepted = acceptance_counts(cycles, max_positions)
    n = len(cycles)
    alpha = [a / r if r else float("nan") for a, r in zip(accepted, reached)]
    beta = [a / n if n else float("nan") for a in accepted]
    return alpha, beta


def acceptance_counts(cycles: Sequence[CycleStats], positions: int) -> tuple[list[int], list[int]]:
    """Per draft position i < ``positions``: (cycles that reached it, of those the cycles that accepted it).

    A cycle reaches position i when its tokens 1..i-1 were accepted and it drafted token i.
    """
    reached = [0] * positions
    accepted = [0] * positions
    for c in cycles:
        for i, ok in enumerate(c.outcomes[:positions]):
            reached[i] += 1
            if not ok:
                break
            accepted[i] += 1
    return reached, accepted
