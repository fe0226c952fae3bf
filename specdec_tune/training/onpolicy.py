"""On-policy refinement of the distilled drafts: train them on the target's own greedy continuations.

Why: greedy speculative decoding accepts a draft token when it equals the target's argmax *on the
target's own output*, and a small LM's greedy output (repetitive, template-like) is not distributed
like source files. Distilling on data the target generated (DistillSpec, Zhou et al. 2023; the
"self-distillation" data of Medusa and EAGLE) moves the drafts towards what they are asked to
predict at decode time. Half of each step's batches stay ordinary training windows, so held-out
agreement (the card's bar) is kept.

Data: prompts are random windows of the *training* split (the workloads come from held-out files),
continued greedily by the target in batches through the engine's lean forward and preallocated
cache. Everything is seeded.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from transformers import LlamaForCausalLM

from specdec_tune.engine import forward_with_cache, make_cache, wrap_forward
from specdec_tune.training.train import TrainReport, batches, train_loop


@dataclass(frozen=True)
class OnPolicyPlan:
    """Knobs of the refinement stage."""

    sequences: int = 384  # target continuations generated
    prompt_tokens: int = 129
    new_tokens: int = 128
    gen_batch: int = 16
    max_steps: int = 600
    budget_s: float = 8 * 60
    batch: int = 4
    peak_lr: float = 5e-4
    warmup: int = 10
    ce_weight: float = 0.1


QUICK_PLAN = OnPolicyPlan(sequences=8, prompt_tokens=33, new_tokens=16, gen_batch=4, max_steps=6, budget_s=20,
                          batch=2, peak_lr=1e-3, warmup=2)


@torch.no_grad()
def greedy_continuations(target: LlamaForCausalLM, stream: torch.Tensor, plan: OnPolicyPlan, seed: int,
                         log: Callable[[str], None] = print) -> torch.Tensor:
    """``[sequences, prompt_tokens + new_tokens]`` int64: training-split prompts + the target's greedy text."""
    model = wrap_forward(target)
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - plan.prompt_tokens, (plan.sequences,), generator=gen)
    offsets = torch.arange(plan.prompt_tokens)
    out = []
    t0 = time.perf_counter()
    for i in range(0, plan.sequences, plan.gen_batch):
        prompts = stream[starts[i:i + plan.gen_batch, None] + offsets].long()  # [b, P]
        cache = make_cache(model, plan.prompt_tokens + plan.new_tokens)
        logits = forward_with_cache(model, prompts, cache, logits_to_keep=1).logits
        seq = [prompts]
        for _ in range(plan.new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)  # [b, 1]
            seq.append(nxt)
            logits = forward_with_cache(model, nxt, cache, logits_to_keep=1).logits
        out.append(torch.cat(seq, dim=1))
    result = torch.cat(out)
    log(f"on-policy data: {result.shape[0]} target continuations of {plan.new_tokens} tokens after "
        f"{plan.prompt_tokens}-token training prompts in {time.perf_counter() - t0:.0f}s")
    return result


def _mixed(generated: torch.Tensor, stream: torch.Tensor, plan: OnPolicyPlan, seed: int) -> Iterator[torch.Tensor]:
    """Alternate batches of generated sequences and ordinary training windows of the same length."""
    gen = torch.Generator().manual_seed(seed)
    data = batches(stream, plan.batch, generated.shape[1] - 1, seed=seed + 1)
    while True:
        rows = torch.randint(0, generated.shape[0], (plan.batch,), generator=gen)
        yield generated[rows]
        yield next(data)


def refine_drafts(target: LlamaForCausalLM, drafts: dict[str, LlamaForCausalLM], stream: torch.Tensor,
                  plan: OnPolicyPlan, seed: int, log: Callable[[str], None] = print) -> dict[str, TrainReport]:
    """Generate the target's continuations, then distil the drafts on them (KL to the target + CE)."""
    target.eval()
    generated = greedy_continuations(target, stream, plan, seed, log)
    return train_loop(drafts, _mixed(generated, stream, plan, seed), max_steps=plan.max_steps,
                      budget_s=plan.budget_s, peak_lr=plan.peak_lr, warmup=plan.warmup, teacher=target,
                      ce_weight=plan.ce_weight, log=log)
