"""Training pieces of the zoo recipe: tokenizer, model shapes, data batches, the training loops.

Everything is seeded; the loops stop at ``max_steps`` or when a wall-clock budget is spent, whichever
comes first (this CPU is shared, so a fixed step count could overrun the recipe's time budget), and
report the steps actually done.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 4096
MAX_POSITIONS = 1024


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with one special token, ``<|endoftext|>`` (id 0).

    It is the EOS, BOS and padding token of every zoo model. Byte-level means every string round-trips.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=None,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )


def encode_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """Encode files into one token stream, each file followed by EOS, ``[num_tokens]`` int32."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


@dataclass(frozen=True)
class Shape:
    """Architecture of one zoo model (Llama)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int


def build_model(shape: Shape, tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    """A freshly initialised Llama model with tied embeddings (halves the weight files)."""
    eos = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def batches(stream: torch.Tensor, batch: int, seq: int, seed: int) -> Iterable[torch.Tensor]:
    """Endless random windows of ``seq + 1`` tokens, ``[batch, seq + 1]`` int64, seeded."""
    gen = torch.Generator().manual_seed(seed)
    high = stream.numel() - seq - 1
    if high <= 0:
        raise ValueError(f"token stream of {stream.numel()} tokens is shorter than seq={seq}")
    offsets = torch.arange(seq + 1)
    while True:
        starts = torch.randint(0, high, (batch,), generator=gen)
        yield stream[starts[:, None] + offsets].long()


def lr_at(step: int, max_steps: int, peak: float, warmup: int, time_fraction: float = 0.0) -> float:
    """Linear warm-up then cosine decay to 10% of the peak (nanoGPT's schedule).

    Progress is the larger of the step fraction and the fraction of the time budget spent, so the
    lr has decayed whichever limit ends the run (a slow, shared CPU ends it by time).
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, max((step - warmup) / max(1, max_steps - warmup), time_fraction))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


@dataclass(frozen=True)
class TrainReport:
    """What one training loop did."""

    steps: int
    seconds: float
    tokens: int
    final_loss: float
    stopped_by: str  # "max_steps" or "time_budget"


def _adamw(model: LlamaForCausalLM, lr: float) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )


class ThreadChooser:
    """Picks 1 or 2 intra-op threads by measured step time, re-probing every ``period`` steps.

    On a shared 2-core machine two OpenMP threads lose most of their time at barriers when another
    process holds a core; on an idle machine two threads are faster. So the loop times a few steps with each setting and keeps the
    faster one until the next probe.
    """

    def __init__(self, choices: tuple[int, ...] = (2, 1), probe_steps: int = 6, period: int = 150) -> None:
        self.choices, self.probe_steps, self.period = choices, probe_steps, period
        self.best = choices[0]
        self._times: dict[int, list[float]] = {c: [] for c in choices}

    def threads_for(self, step: int) -> int:
        phase = step % self.period
        probing = len(self.choices) * self.probe_steps
        if phase < probing:
            return self.choices[phase // self.probe_steps]
        if phase == probing:
            # Median of the probe (the first step of each probe may pay a warm-up).
            med = {c: sorted(t)[len(t) // 2] for c, t in self._times.items() if t}
            self.best = min(med, key=med.get) if med else self.best
            self._times = {c: [] for c in self.choices}
        return self.best

    def record(self, threads: int, seconds: float) -> None:
        self._times.setdefault(threads, []).append(seconds)


def train_loop(
    models: dict[str, LlamaForCausalLM],
    data: Iterable[torch.Tensor],
    *,
    max_steps: int,
    budget_s: float,
    peak_lr: float,
    warmup: int,
    teacher: LlamaForCausalLM | None = None,
    ce_weight: float = 1.0,
    log: Callable[[str], None] = print,
) -> dict[str, TrainReport]:
    """Train one or more models on the same batches with AdamW; data CE, or distillation from ``teacher``.

    Distillation loss = KL(p_teacher || q_student) per token + ``ce_weight`` * data CE. The forward
    KL matches what speculative decoding rewards: acceptance is sum_x min(p, q), driven by covering
    the target's mass. Several students share each teacher forward, the dominant cost on a CPU.

    Which limit ended the run is recorded in the reports (``stopped_by``); when the step count ends
    it, the run is reproducible from the seed.
    """
    opts = {name: _adamw(model, peak_lr) for name, model in models.items()}
    _training_mode(models, teacher)
    start = time.perf_counter()
    step, tokens = 0, 0
    ema = {name: float("nan") for name in models}
    stopped_by = "max_steps"
    tag = "+".join(models)
    chooser = ThreadChooser()
    for batch in data:
        if step >= max_steps:
            break
        if time.perf_counter() - start > budget_s:
            stopped_by = "time_budget"
            break
        lr = lr_at(step, max_steps, peak_lr, warmup, (time.perf_counter() - start) / budget_s)
        threads = chooser.threads_for(step)
        torch.set_num_threads(threads)
        step_start = time.perf_counter()
        inputs, labels = batch[:, :-1], batch[:, 1:]
        t_logp = _teacher_logp(teacher, inputs)  # [B*T, V] or None
        parts = []
        for name, model in models.items():
            value, ce = _student_step(model, opts[name], inputs, labels, t_logp, lr, ce_weight)
            ema[name] = value if math.isnan(ema[name]) else 0.95 * ema[name] + 0.05 * value
            parts.append(f"{name} loss {value:.4f} ema {ema[name]:.4f} ce {ce:.4f}")
        chooser.record(threads, time.perf_counter() - step_start)
        step += 1
        tokens += inputs.numel()
        if step % 25 == 0 or step == 1:
            log(f"[{tag}] step {step} {'; '.join(parts)} lr {lr:.2e} threads {threads} "
                f"t={time.perf_counter() - start:.0f}s")
    torch.set_num_threads(2)
    for model in models.values():
        model.eval()
    seconds = time.perf_counter() - start
    log(f"[{tag}] done: {step} steps, {tokens} tokens, {seconds:.0f}s, stopped by {stopped_by}")
    return {name: TrainReport(steps=step, seconds=seconds, tokens=tokens, final_loss=ema[name], stopped_by=stopped_by)
            for name in models}


def _training_mode(models: dict[str, LlamaForCausalLM], teacher: LlamaForCausalLM | None) -> None:
    """Students in training mode, the teacher in eval mode."""
    for model in models.values():
        model.train()
    if teacher is not None:
        teacher.eval()


def _teacher_logp(teacher: LlamaForCausalLM | None, inputs: torch.Tensor) -> torch.Tensor | None:
    """The teacher's log-probabilities ``[B*T, V]`` on ``inputs`` ``[B, T]`` (no gradient); None without one."""
    if teacher is None:
        return None
    with torch.no_grad():
        return F.log_softmax(teacher(input_ids=inputs).logits.float(), dim=-1).flatten(0, 1)


def _student_step(
    model: LlamaForCausalLM,
    opt: torch.optim.Optimizer,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    t_logp: torch.Tensor | None,
    lr: float,
    ce_weight: float,
) -> tuple[float, float]:
    """One optimiser step of one model on a batch; returns (loss, data CE).

    ``inputs`` and ``labels`` are ``[B, T]``; ``t_logp`` is the teacher's ``[B*T, V]`` log-probabilities
    (None trains on the data CE alone).
    """
    for group in opt.param_groups:
        group["lr"] = lr
    logits = model(input_ids=inputs).logits.float().flatten(0, 1)  # [B*T, V]
    ce = F.cross_entropy(logits, labels.flatten())
    loss = ce
    if t_logp is not None:
        s_logp = F.log_softmax(logits, dim=-1)
        loss = F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean") + ce_weight * ce
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach()), float(ce.detach())


def init_draft_from_target(draft: LlamaForCausalLM, target: LlamaForCausalLM) -> list[int]:
    """Copy the target's embeddings, final norm and evenly spaced layers into a draft of the same width.

    A warm start that makes distillation converge in fewer steps (the draft starts from a truncated
    target, as in layer-skipping self-speculation). Returns the copied target layer indices.
    """
    n_d, n_t = draft.config.num_hidden_layers, target.config.num_hidden_layers
    picks = [round(i * (n_t - 1) / max(1, n_d - 1)) for i in range(n_d)] if n_d > 1 else [0]
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.model.norm.weight.copy_(target.model.norm.weight)
        for i, j in enumerate(picks):
            draft.model.layers[i].load_state_dict(target.model.layers[j].state_dict())
    return picks
