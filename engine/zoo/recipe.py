"""The zoo recipe: corpus -> tokenizer -> workloads -> target -> distilled drafts -> evaluation.

Run it with ``specdec-tune zoo train [--out DIR] [--quick] [--seed N]``. The full recipe takes about
50 minutes on a 2-core CPU; ``--quick`` is a smoke version of a minute or two with tiny models.

The recipe is the one place of the zoo that reads a clock (``time.perf_counter``): for its wall-clock
training budgets and for the per-forward latencies written to the model card. It is a build script,
not part of the decode engine.
"""
from __future__ import annotations

import json
import platform
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaForCausalLM

from . import card
from .build_workloads import WORKLOAD_KINDS, build_workload, write_jsonl
from .corpus import load_corpus
from .evaluate import agreement, eval_windows, held_out_loss, token_byte_lengths
from .train import Shape, batches, build_model, encode_stream, init_draft_from_target, train_loop, train_tokenizer

MANIFEST_NAME = "zoo.json"
SAVE_DTYPE = torch.float16  # more mantissa than bf16; the weights' range fits easily


@dataclass(frozen=True)
class ModelPlan:
    """One zoo model: its name, role and shape."""

    name: str
    role: str  # "target" or "draft"
    shape: Shape


@dataclass(frozen=True)
class Stage:
    """One training loop: the models it trains together and how.

    Drafts are trained in one stage so that they share each forward of the teacher (the target).
    """

    names: tuple[str, ...]
    max_steps: int
    budget_s: float
    peak_lr: float
    warmup: int
    distill: bool = False
    ce_weight: float = 0.0


@dataclass(frozen=True)
class RecipeConfig:
    """All knobs of one recipe run."""

    seq: int
    batch: int
    eval_windows: int
    max_files: int | None
    workload_size: int
    timing_repeats: int
    models: tuple[ModelPlan, ...]
    stages: tuple[Stage, ...]


FULL = RecipeConfig(
    seq=512,
    batch=4,
    eval_windows=48,
    max_files=None,
    workload_size=40,
    timing_repeats=30,
    models=(
        ModelPlan("mini-target", "target", Shape(layers=12, hidden=192, intermediate=512, heads=4)),
        ModelPlan("mini-draft-1l", "draft", Shape(1, 192, 512, 4)),
        ModelPlan("mini-draft-2l", "draft", Shape(2, 192, 512, 4)),
    ),
    stages=(
        Stage(("mini-target",), max_steps=1600, budget_s=40 * 60, peak_lr=2e-3, warmup=50),
        Stage(("mini-draft-1l", "mini-draft-2l"), max_steps=1000, budget_s=16 * 60, peak_lr=2e-3, warmup=20,
              distill=True, ce_weight=0.1),
    ),
)
QUICK = RecipeConfig(
    seq=128,
    batch=4,
    eval_windows=4,
    max_files=40,
    workload_size=8,
    timing_repeats=5,
    models=(
        ModelPlan("mini-target", "target", Shape(3, 64, 128, 2)),
        ModelPlan("mini-draft-1l", "draft", Shape(1, 64, 128, 2)),
        ModelPlan("mini-draft-2l", "draft", Shape(2, 64, 128, 2)),
    ),
    stages=(
        Stage(("mini-target",), max_steps=30, budget_s=30, peak_lr=3e-3, warmup=5),
        Stage(("mini-draft-1l", "mini-draft-2l"), max_steps=15, budget_s=15, peak_lr=3e-3, warmup=3,
              distill=True, ce_weight=0.1),
    ),
)


class _Log:
    """Writes each line to stdout and to the run log file (the log is committed with the weights)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = path.open("w", encoding="utf-8")

    def __call__(self, msg: str) -> None:
        line = f"[{time.perf_counter() - self.start:7.1f}s] {msg}"
        print(line, flush=True)
        self.fh.write(line + "\n")
        self.fh.flush()


@torch.no_grad()
def forward_ms(model: LlamaForCausalLM, new_tokens: int, *, context: int = 128, repeats: int = 30,
               warmup: int = 5, seed: int = 0) -> dict[str, float]:
    """Time one forward of ``new_tokens`` tokens after ``context`` cached tokens (KV cache).

    The cache is cropped back after every forward, so each repeat sees the same context length.
    Returns median, p10 and p90 in milliseconds.
    """
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    cache = DynamicCache()
    model(input_ids=torch.randint(0, vocab, (1, context), generator=gen), past_key_values=cache, use_cache=True)
    new = torch.randint(0, vocab, (1, new_tokens), generator=gen)
    samples: list[float] = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        model(input_ids=new, past_key_values=cache, use_cache=True)
        elapsed = time.perf_counter() - t0
        cache.crop(-new_tokens)
        if i >= warmup:
            samples.append(elapsed * 1e3)
    samples.sort()
    q = statistics.quantiles(samples, n=10) if len(samples) >= 2 else samples * 9
    return {"median": statistics.median(samples), "p10": q[0], "p90": q[-1]}


def _save_model(model: LlamaForCausalLM, tokenizer, folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    model.to(SAVE_DTYPE).save_pretrained(folder, safe_serialization=True, max_shard_size="15MB")
    model.to(torch.float32)
    eos = tokenizer.eos_token_id
    # Plain defaults: greedy, no length limits or penalties forced on the user.
    GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def run_recipe(out_dir: Path, *, quick: bool = False, seed: int = 0,
               log_fn: Callable[[str], None] | None = None) -> dict:
    """Run the whole recipe and write models, workloads, manifest, model card and run log.

    Args:
        out_dir: folder to write into (``models/<name>/``, ``workloads/*.jsonl``, ``zoo.json``,
            ``MODEL_CARD.md``, ``train_log.txt``). Pass the package's zoo folder to refresh the
            bundled models.
        quick: tiny smoke version (minutes), not for use as a real zoo.
        seed: seeds the data order, initialisation and prompt selection.

    Returns:
        The manifest that was written.
    """
    cfg = QUICK if quick else FULL
    out_dir = Path(out_dir)
    log = _Log(out_dir / "train_log.txt")
    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(seed)
    log(f"recipe start: quick={quick} seed={seed} out={out_dir} torch {torch.__version__} "
        f"transformers {transformers.__version__} python {platform.python_version()}")

    corpus = load_corpus(max_files=cfg.max_files)
    summary = corpus.summary()
    log(f"corpus: {summary}")

    t0 = time.perf_counter()
    tokenizer = train_tokenizer(f.text for f in corpus.train)
    log(f"tokenizer: vocab {len(tokenizer)} trained in {time.perf_counter() - t0:.1f}s")
    train_stream = encode_stream(tokenizer, [f.text for f in corpus.train])
    held_stream = encode_stream(tokenizer, [f.text for f in corpus.held_out])
    summary.update(train_tokens=train_stream.numel(), held_out_tokens=held_stream.numel())
    log(f"tokens: train {train_stream.numel()}, held-out {held_stream.numel()}")

    workloads = []
    backend = tokenizer.backend_tokenizer
    count = lambda text: len(backend.encode(text, add_special_tokens=False).ids)  # noqa: E731
    for kind in WORKLOAD_KINDS:
        records = build_workload(kind, list(corpus.held_out), count, size=cfg.workload_size, seed=seed)
        write_jsonl(records, out_dir / "workloads" / f"{kind}.jsonl")
        lengths = [count(r["prompt"]) for r in records]
        info = {"name": kind, "file": f"workloads/{kind}.jsonl", "prompts": len(records),
                "min_tokens": min(lengths, default=0), "max_tokens": max(lengths, default=0),
                "mean_tokens": round(sum(lengths) / max(1, len(lengths)), 1),
                "categories": sorted({r["category"] for r in records})}
        workloads.append(info)
        log(f"workload {kind}: {info}")

    windows = eval_windows(held_stream, cfg.seq, cfg.eval_windows)
    plans = {p.name: p for p in cfg.models}
    target_name = next(p.name for p in cfg.models if p.role == "target")
    trained: dict[str, LlamaForCausalLM] = {}
    reports: dict[str, dict] = {}
    for i, stage in enumerate(cfg.stages):
        models, extra = {}, {}
        teacher = trained[target_name] if stage.distill else None
        for name in stage.names:
            models[name] = build_model(plans[name].shape, tokenizer, seed=seed + cfg.models.index(plans[name]))
            if teacher is not None:
                extra[name] = {"initialised_from_target_layers": init_draft_from_target(models[name], teacher)}
        data = batches(train_stream, cfg.batch, cfg.seq, seed=seed * 1000 + i)
        stage_reports = train_loop(models, data, max_steps=stage.max_steps, budget_s=stage.budget_s,
                                   peak_lr=stage.peak_lr, warmup=stage.warmup, teacher=teacher,
                                   ce_weight=stage.ce_weight, log=log)
        for name, model in models.items():
            trained[name] = model
            reports[name] = {**asdict(stage_reports[name]), **extra.get(name, {}), "max_steps": stage.max_steps,
                             "budget_s": stage.budget_s, "peak_lr": stage.peak_lr, "batch": cfg.batch,
                             "seq": cfg.seq, "trained_with": list(stage.names),
                             "objective": ("KL(p_target || q) + %.2f * CE" % stage.ce_weight) if stage.distill
                             else "CE on data"}
            _save_model(model, tokenizer, out_dir / "models" / name)
            log(f"saved {name} to {out_dir / 'models' / name}")

    # Evaluate the shipped (fp16-rounded) weights, reloaded as the engine loads them.
    del trained
    loaded = {p.name: AutoModelForCausalLM.from_pretrained(out_dir / "models" / p.name, dtype=torch.float32).eval()
              for p in cfg.models}
    byte_len = token_byte_lengths(tokenizer)
    entries = []
    for plan in cfg.models:
        model = loaded[plan.name]
        loss = held_out_loss(model, windows, byte_len)
        quality: dict = {"held_out_nats_per_token": loss.nats_per_token, "held_out_nats_per_byte": loss.nats_per_byte,
                         "held_out_bits_per_byte": loss.bits_per_byte, "eval_tokens": loss.tokens}
        if plan.role == "draft":
            agr = agreement(loaded[target_name], model, windows)
            quality.update(greedy_agreement=agr.greedy_agreement, sampling_acceptance=agr.sampling_acceptance)
        timing = {str(k): forward_ms(model, k, repeats=cfg.timing_repeats) for k in (1, 8)}
        folder = out_dir / "models" / plan.name
        files = sorted(p.name for p in folder.iterdir())
        weight_bytes = sum((folder / f).stat().st_size for f in files if f.endswith(".safetensors"))
        entry = {
            "name": plan.name, "role": plan.role, "path": f"models/{plan.name}",
            "layers": plan.shape.layers, "hidden_size": plan.shape.hidden,
            "intermediate_size": plan.shape.intermediate, "heads": plan.shape.heads,
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(SAVE_DTYPE).replace("torch.", ""), "weight_bytes": weight_bytes, "files": files,
            "training": reports[plan.name], "quality": quality,
            "ms_per_forward_at_training_time": timing,
        }
        entries.append(entry)
        log(f"eval {plan.name}: {json.dumps(quality)} ms/forward "
            f"1={timing['1']['median']:.2f} 8={timing['8']['median']:.2f}")

    manifest = {
        "version": 1,
        "quick": quick,
        "seed": seed,
        "tokenizer": {"type": "byte-level BPE (tokenizers)", "vocab_size": len(tokenizer),
                      "eos_token": tokenizer.eos_token, "eos_token_id": tokenizer.eos_token_id},
        "corpus": {**summary, "root": "<python stdlib>", "licence": "PSF License Agreement (PSF-2.0)",
                   "python": platform.python_version(), "held_out_list": [f.relpath for f in corpus.held_out]},
        "eval": {"windows": int(windows.shape[0]), "seq": cfg.seq},
        "timing": {"context_tokens": 128, "threads": torch.get_num_threads(), "machine": platform.processor()
                   or platform.machine(), "cpu_count": _cpu_count()},
        "models": entries,
        "workloads": workloads,
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    (out_dir / "MODEL_CARD.md").write_text(card.render(manifest), encoding="utf-8")
    for line in card.check_bars(manifest):
        log(line)
    log("recipe done")
    return manifest


def _cpu_count() -> int:
    import os

    return os.cpu_count() or 0
