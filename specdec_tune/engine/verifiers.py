"""How a cycle's draft is judged against the target: a verifier, chosen once per decode before the loop.

The decode loops (``engine.decode``, ``engine.tree_decode``) call one verifier per cycle and never ask
which kind it is (gpt-fast's ``generate.py`` style: strategies are picked before the loop). Chain
verifiers read a :class:`~specdec_tune.engine.types.Draft` and the target's ``[L + 1, vocab]`` logits and
return a host-side :class:`Verdict`:

- :class:`GreedyVerifier`: the longest prefix equal to the target's argmax (exact greedy decoding);
- :class:`SyntheticVerifier`: greedy, but how many tokens are accepted is drawn from given rates
  (``engine.verify.SyntheticAcceptance``; for models with random weights);
- :class:`SamplingVerifier`: speculative sampling with a rule: exact (``verify_sampling``), lossy
  (``verify_lossy`` with the configuration's acceptance and ε), or one a caller plants (tests, and the
  profiler's recording of each position's p and q).

The tree loop picks its verifier the same way (``engine.tree_decode``: greedy or sampling over a tree).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import torch

from specdec_tune.engine.decode_config import DecodeConfig
from specdec_tune.engine.drafters import probs_from_logits
from specdec_tune.engine.types import Draft, VerifyResult
from specdec_tune.engine.verify import SyntheticAcceptance, greedy_accept, synthetic_verdict, verify_lossy, verify_sampling

VerifyFn = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Generator | None], VerifyResult]


@dataclass(frozen=True)
class Verdict:
    """One cycle's verification, read back to the host."""

    accepted: int  # length of the accepted prefix (0..L)
    next_token: int  # the target's bonus or recovered token
    drafted: list[int]  # [L] the draft's token ids
    confidences: list[float]  # [L] the draft's confidence per token
    token_probs: list[float]  # [L] each drafted token's own draft probability (the confidences when greedy)
    threshold: float  # θ of this cycle
    target_probs: list[float] = field(default_factory=list)  # [L] p(x_i) of each drafted token (sampling)


class Verifier(Protocol):
    def __call__(self, draft: Draft, logits: torch.Tensor, generator: torch.Generator | None) -> Verdict:
        """The verdict on ``draft`` from the target's ``[L + 1, vocab]`` logits."""
        ...


class GreedyVerifier:
    """Exact greedy verification; the cycle's one host synchronisation reads verdict, draft tokens and
    confidences in one copy (float64 holds every token id exactly)."""

    def accept(self, draft: Draft, logits: torch.Tensor) -> torch.Tensor:
        """``[2]``: (accepted, next token) on the device."""
        return greedy_accept(draft.tokens, logits)

    def __call__(self, draft: Draft, logits: torch.Tensor, generator: torch.Generator | None) -> Verdict:
        n_draft = draft.length
        verdict = self.accept(draft, logits)
        host = torch.cat([verdict.double(), draft.tokens.double(), draft.confidence.double()]).tolist()
        confidences = host[2 + n_draft:]
        # A greedy draft token is the argmax: its own probability is its confidence.
        return Verdict(int(host[0]), int(host[1]), [int(t) for t in host[2:2 + n_draft]], confidences,
                       confidences if draft.token_probs is not None else [], draft.threshold)


class SyntheticVerifier(GreedyVerifier):
    """Greedy decoding whose accepted count is drawn from synthetic rates (the target picks the next token)."""

    def __init__(self, rates: SyntheticAcceptance) -> None:
        self.rates = rates

    def accept(self, draft: Draft, logits: torch.Tensor) -> torch.Tensor:
        return synthetic_verdict(logits, self.rates.draw(draft.length))


class SamplingVerifier:
    """Speculative sampling at ``temperature`` with ``rule`` (exact ``verify_sampling`` by default)."""

    def __init__(self, temperature: float, rule: VerifyFn = verify_sampling) -> None:
        self.temperature = temperature
        self.rule = rule

    def __call__(self, draft: Draft, logits: torch.Tensor, generator: torch.Generator | None) -> Verdict:
        target_probs = probs_from_logits(logits, self.temperature)  # [L + 1, vocab]
        result = self.rule(draft.tokens, draft.probs, target_probs, generator)
        token_probs = draft.token_probs.tolist() if draft.token_probs is not None else []
        p_drafted = target_probs[torch.arange(draft.length, device=logits.device), draft.tokens].tolist()  # [L]
        return Verdict(result.num_accepted, result.next_token, draft.tokens.tolist(), draft.confidence.tolist(),
                       token_probs, draft.threshold, p_drafted)


def choose_verifier(config: DecodeConfig, prompt_ids: torch.Tensor) -> Verifier:
    """The verifier ``config`` asks for: sampling (exact or lossy) when ``temperature > 0``, else greedy,
    synthetic where rates replace the target's verdict."""
    spec = config.spec
    if config.temperature > 0:
        if spec.acceptance == "exact":
            return SamplingVerifier(config.temperature)
        return SamplingVerifier(config.temperature, partial(verify_lossy, epsilon=spec.epsilon, method=spec.acceptance))
    if config.synthetic_acceptance is not None:
        return SyntheticVerifier(synthetic_rates(prompt_ids, config))
    return GreedyVerifier()


def synthetic_rates(prompt_ids: torch.Tensor, config: DecodeConfig) -> SyntheticAcceptance:
    """The synthetic acceptance of one decode, seeded from ``synthetic_seed`` and the prompt, so every
    prompt draws its own acceptances and a repeat of a prompt draws the same (one host read of the
    prompt per decode)."""
    assert config.synthetic_acceptance is not None
    ids = prompt_ids.tolist()
    return SyntheticAcceptance(config.synthetic_acceptance,
                               config.synthetic_seed * 1_000_003 + sum((i + 1) * t for i, t in enumerate(ids)))
