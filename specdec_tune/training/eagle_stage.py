"""The recipe's EAGLE-3 stage: a feature head for the trained target (``engine.eagle``), saved in the
layout vLLM's and SGLang's loaders read.

Data (EAGLE-3 trains on responses the target regenerated): the target's greedy continuations of
training-split prompts (``training.onpolicy.greedy_continuations``), alternating with ordinary training
windows of the same length; the draft vocabulary is the most frequent tokens of that data. Each step
runs the target once over the batch through the engine's lean forward (the same function decoding
uses), which returns the logits (the teacher) and the three fused layers' features, then the
training-time test (``training.eagle_train``). The budget is a step count, not wall time, so the stage is
reproducible from its seed on a loaded machine too (its seconds are recorded).
"""
from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdec_tune.engine import EagleHead, default_aux_layers, head_config, make_cache, save_head, wrap_forward
from specdec_tune.training.eagle_train import coverage, draft_vocabulary, init_from_target, lr_schedule, ttt_loss
from specdec_tune.training.onpolicy import OnPolicyPlan, _mixed, greedy_continuations
from specdec_tune.training.train import ThreadChooser

HEAD_NAME = "mini-eagle3"


@dataclass(frozen=True)
class EaglePlan:
    """Knobs of the EAGLE-3 stage."""

    name: str = HEAD_NAME
    draft_vocab: int = 2048
    ttt_steps: int = 5  # the training-time test's unrolled steps (SpecForge's default is 7; we draft N <= 6)
    sequences: int = 768  # target continuations generated for the training data
    prompt_tokens: int = 129
    new_tokens: int = 128
    gen_batch: int = 16
    batch: int = 4
    max_steps: int = 1000
    peak_lr: float = 2e-3
    warmup: int = 30
    decay: float = 0.8  # loss weight of step j: decay ** j
    threads: int = 0  # 0: the loop picks 1 or 2 by measured step time; N: N throughout, generation included


QUICK_EAGLE = EaglePlan(draft_vocab=1024, ttt_steps=3, sequences=8, prompt_tokens=33, new_tokens=16, gen_batch=4,
                        batch=2, max_steps=4, warmup=2)


@torch.no_grad()
def target_batch(lean: torch.nn.Module, batch: torch.Tensor, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the target's logits ``[B, S, V]``, its features ``[B, S, n·H]`` at ``layers``) on ``batch`` ``[B, S]``."""
    out = lean(input_ids=batch, cache=make_cache(lean, batch.shape[1]), logits_to_keep=0, aux_layers=layers)
    return out.logits.float(), out.aux


def train_head(target, tokenizer, stream: torch.Tensor, plan: EaglePlan, seed: int,
               log: Callable[[str], None] = print) -> tuple[EagleHead, dict]:
    """Train a head for ``target`` (an HF Llama model) on ``stream`` (training-split token ids); (head, report)."""
    target.eval()
    lean = wrap_forward(target)
    layers = default_aux_layers(int(target.config.num_hidden_layers))
    if plan.threads:  # two OpenMP threads on a core another process holds lose most of their time at barriers
        torch.set_num_threads(plan.threads)
    gen = OnPolicyPlan(sequences=plan.sequences, prompt_tokens=plan.prompt_tokens, new_tokens=plan.new_tokens,
                       gen_batch=plan.gen_batch, batch=plan.batch)
    generated = greedy_continuations(target, stream, gen, seed, log)
    vocab = int(target.config.vocab_size)
    draft_ids = draft_vocabulary([generated, stream], plan.draft_vocab, vocab, always=(int(tokenizer.eos_token_id),))
    cover = {"generated": coverage([generated], draft_ids, vocab), "corpus": coverage([stream], draft_ids, vocab)}
    log(f"eagle3: draft vocabulary of {draft_ids.numel()} tokens covers {cover['generated']:.3f} of the target's "
        f"greedy text and {cover['corpus']:.3f} of the corpus; layers {list(layers)}")
    torch.manual_seed(seed)
    head = EagleHead(head_config(target.config.to_dict(), plan.draft_vocab))
    source = init_from_target(head, target, draft_ids, layers)
    report = _loop(head, lean, _mixed(generated, stream, gen, seed + 1), layers, plan, log)
    report.update(draft_vocab=plan.draft_vocab, draft_vocab_coverage=cover, layers=list(layers),
                  initialised_from_target_layer=source, plan=asdict(plan),
                  objective=f"training-time test over {plan.ttt_steps} steps: soft CE to the target on the draft "
                            f"vocabulary, step j weighted {plan.decay}^j (EAGLE-3)")
    return head, report


def _loop(head: EagleHead, lean, data, layers: tuple[int, ...], plan: EaglePlan, log: Callable[[str], None]) -> dict:
    head.train()
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=plan.peak_lr, betas=(0.9, 0.95), weight_decay=0.0)
    chooser = ThreadChooser((plan.threads,)) if plan.threads else ThreadChooser()
    start, tokens, ema, agree = time.perf_counter(), 0, float("nan"), []
    for step in range(plan.max_steps):
        batch = next(data)
        threads = chooser.threads_for(step)
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        teacher, features = target_batch(lean, batch, layers)
        loss, agree = ttt_loss(head, features, batch, teacher, plan.ttt_steps, plan.decay)
        for group in opt.param_groups:
            group["lr"] = lr_schedule(step, plan.max_steps, plan.peak_lr, plan.warmup)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        chooser.record(threads, time.perf_counter() - t0)
        tokens += batch.numel()
        value = float(loss.detach())
        ema = value if ema != ema else 0.95 * ema + 0.05 * value
        if (step + 1) % 25 == 0 or step == 0:
            log(f"[eagle3] step {step + 1} loss {value:.4f} ema {ema:.4f} agreement by step "
                f"{' '.join(f'{a:.3f}' for a in agree)} threads {threads} t={time.perf_counter() - start:.0f}s")
    torch.set_num_threads(2)
    head.eval()
    seconds = time.perf_counter() - start
    log(f"[eagle3] done: {plan.max_steps} steps, {tokens} tokens, {seconds:.0f}s")
    return {"steps": plan.max_steps, "seconds": seconds, "tokens": tokens, "final_loss": ema,
            "stopped_by": "max_steps", "last_batch_agreement_by_step": agree, "batch": plan.batch,
            "seq": plan.prompt_tokens + plan.new_tokens, "peak_lr": plan.peak_lr}


def save_bundled(head: EagleHead, tokenizer, folder: Path) -> None:
    """The head's folder as the zoo ships it: config, float16 weights, and the target's tokenizer (vLLM and
    SGLang read the target's; it lets ``check_compatible`` compare every token)."""
    if folder.exists():
        shutil.rmtree(folder)
    save_head(head, folder)
    tokenizer.save_pretrained(folder)


def manifest_entry(head: EagleHead, plan: EaglePlan, report: dict) -> dict:
    """The head's entry in ``zoo.json`` (quality, files and latency are added by ``training.assess``)."""
    c = head.config
    return {"name": plan.name, "role": "eagle3", "path": f"models/{plan.name}", "layers": 1,
            "hidden_size": int(c.hidden_size), "intermediate_size": int(c.intermediate_size),
            "heads": int(c.num_attention_heads), "dtype": "float16", "training": report,
            "eagle3": {"draft_vocab_size": head.draft_vocab, "target_layers": report["layers"],
                       "config": json.loads(json.dumps(head.raw_config))}}
