"""Does speculation come back at full acceptance after a schedule turned it off? (TensorRT-LLM #16888)

A per-batch-size schedule (vLLM ``num_speculative_tokens_per_batch_size``, TensorRT-LLM
``draft_len_schedule``) drafts 0 tokens above some batch size. When the load falls, speculation resumes
on the same requests, and the drafter must first catch up on every token it did not see meanwhile.
TensorRT-LLM #16888: one-engine drafters kept stale state (draft KV cache, hidden-state pools) while
drafting was skipped, so after resumption "the acceptance rate silently collapsed for the remainder of
every affected request"; vLLM #49548 reports a throughput collapse at the schedule's threshold.

The check decodes a prompt under a *load trace* (the batch size the server sees, per block of cycles)
through the schedule: each cycle drafts the schedule's N at the current load, 0 where it says so (the
engine's ``n_for_cycle``). From the first cycle where speculation resumes, it compares the cycles'
acceptance with a *fresh* decode of the same continuation: the prompt plus every token emitted before
resumption, decoded with a new drafter at the resumed N. Greedy decoding makes both propose from the
same context, so a drafter that caught up accepts what the fresh one accepts (up to the rounding of a
different prefill); a stale one accepts less.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from specdec_tune.engine import DecodeConfig, LoadedModel, build_drafter, choose_budget, speculative


def schedule_n(schedule: Mapping[int, int], batch_size: int) -> int:
    """N at ``batch_size`` from a per-batch-size schedule (batch size -> N at and above it, until the next
    key; below the smallest key, the smallest's N), as the exports write it."""
    keys = sorted(schedule)
    n = schedule[keys[0]]
    for b in keys:
        if batch_size >= b:
            n = schedule[b]
    return int(n)


def load_plan(schedule: Mapping[int, int], load: Sequence[int], cycles_per_load: int) -> Callable[[int], int]:
    """Cycle index -> N under a load trace: ``load[i]`` is the batch size for cycles
    ``i * cycles_per_load`` .. ``(i + 1) * cycles_per_load - 1``; after the trace, its last load."""
    def n_for(cycle: int) -> int:
        return schedule_n(schedule, load[min(cycle // cycles_per_load, len(load) - 1)])

    return n_for


@dataclass(frozen=True)
class ResumeCheck:
    """Acceptance after speculation resumed, against a fresh drafter on the same continuation (counted).

    Attributes:
        resume_cycle: the first cycle drafting again after cycles drafting 0 (None: never turned off).
        off_cycles: cycles that drafted 0 before it.
        token_ids: the scheduled decode's output.
        drafted, accepted: draft tokens proposed and accepted by the scheduled decode from resumption on.
        fresh_drafted, fresh_accepted: the same for the fresh decode, over as many cycles.
    """

    resume_cycle: int | None
    off_cycles: int
    token_ids: list[int]
    drafted: int = 0
    accepted: int = 0
    fresh_drafted: int = 0
    fresh_accepted: int = 0

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def fresh_rate(self) -> float | None:
        return self.fresh_accepted / self.fresh_drafted if self.fresh_drafted else None

    def to_json(self) -> dict:
        return {**asdict(self), "rate": self.rate, "fresh_rate": self.fresh_rate}


def _decode(target: LoadedModel, draft: LoadedModel | None, ids: torch.Tensor, config: DecodeConfig,
            n_for_cycle: Callable[[int], int] | None = None):
    drafter = build_drafter(draft.model if draft is not None else None, max_len=ids.shape[0] + config.room)
    budget = None if n_for_cycle is None else choose_budget(config.spec, n_for_cycle)
    with torch.inference_mode():
        return speculative(target.model, drafter, ids, config, budget=budget)


def resume_check(target: LoadedModel, draft: LoadedModel | None, ids: torch.Tensor, config: DecodeConfig,
                 n_for_cycle: Callable[[int], int]) -> ResumeCheck:
    """Decode ``ids`` under ``n_for_cycle`` and compare acceptance after resumption with a fresh decode
    (module docstring). ``draft`` None is n-gram lookup. Greedy only."""
    result = _decode(target, draft, ids, config, n_for_cycle)
    cycles = result.cycles
    off = [i for i, c in enumerate(cycles) if n_for_cycle(i) == 0]
    resume = next((i for i in range(1, len(cycles)) if n_for_cycle(i) > 0 and i - 1 in off), None)
    if resume is None:
        return ResumeCheck(None, len(off), list(result.token_ids))
    after = cycles[resume:]
    emitted = sum(c.emitted for c in cycles[:resume])
    rest = config.max_new_tokens - emitted
    if rest < 1 or not after:
        return ResumeCheck(resume, len(off), list(result.token_ids))
    prefix = torch.tensor(result.token_ids[:emitted], dtype=ids.dtype, device=ids.device)
    fresh_config = DecodeConfig(rest, num_speculative_tokens=config.spec.num_speculative_tokens,
                                eos_token_id=config.eos_token_id)
    fresh = _decode(target, draft, torch.cat([ids, prefix]), fresh_config,
                    lambda i: n_for_cycle(resume + i)).cycles[:len(after)]
    return ResumeCheck(resume, len([i for i in off if i < resume]), list(result.token_ids),
                       sum(c.drafted for c in after[:len(fresh)]), sum(c.accepted for c in after[:len(fresh)]),
                       sum(c.drafted for c in fresh), sum(c.accepted for c in fresh))
