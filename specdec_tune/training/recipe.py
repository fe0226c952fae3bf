"""The zoo recipe: corpus -> tokenizer -> workloads -> target -> distilled drafts -> on-policy
refinement of the drafts -> evaluation.

Run it with ``specdec-tune zoo train [--out DIR] [--quick] [--seed N]``. The full recipe takes about
70 minutes on a 2-core CPU (the bundled zoo: 59 min for everything up to the distilled drafts, then
7 min for the on-policy stage run by ``zoo refine``; wall-clock training budgets of 42 + 16 + 8 min);
``--quick`` is a smoke version of a minute or two with tiny models.

The recipe is the one place of the zoo that reads a clock (``time.perf_counter``): for its wall-clock
training budgets and for the per-forward latencies written to the model card. It is a build script,
not part of the decode engine.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import transformers
from transformers import GenerationConfig, LlamaForCausalLM

from specdec_tune.training.assess import MANIFEST_NAME, assess_zoo
from specdec_tune.training.build_workloads import WORKLOAD_KINDS, build_workload, write_jsonl
from specdec_tune.training.edit_workloads import build_edit_workload
from specdec_tune.training.corpus import Corpus, load_corpus
from specdec_tune.training.eagle_stage import QUICK_EAGLE, EaglePlan, manifest_entry, save_bundled, train_head
from specdec_tune.training.onpolicy import QUICK_PLAN, OnPolicyPlan, refine_drafts
from specdec_tune.training.train import Shape, batches, build_model, encode_stream, init_draft_from_target, train_loop
from specdec_tune.training.train import train_tokenizer

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
    on_policy: OnPolicyPlan | None = None  # drafts refined on the target's own greedy text
    eagle: EaglePlan | None = None  # last stage: an EAGLE-3 head for the target (training.eagle_stage)


FULL = RecipeConfig(
    seq=512,
    batch=4,
    eval_windows=48,
    max_files=None,
    workload_size=40,
    timing_repeats=30,
    models=(
        ModelPlan("mini-target", "target", Shape(layers=16, hidden=192, intermediate=512, heads=4)),
        ModelPlan("mini-draft-1l", "draft", Shape(1, 192, 512, 4)),
        ModelPlan("mini-draft-2l", "draft", Shape(2, 192, 512, 4)),
    ),
    stages=(
        Stage(("mini-target",), max_steps=1600, budget_s=42 * 60, peak_lr=2e-3, warmup=50),
        Stage(("mini-draft-1l", "mini-draft-2l"), max_steps=1000, budget_s=16 * 60, peak_lr=2e-3, warmup=20,
              distill=True, ce_weight=0.1),
    ),
    on_policy=OnPolicyPlan(),
    eagle=EaglePlan(),
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
    on_policy=QUICK_PLAN,
    eagle=QUICK_EAGLE,
)


class _Log:
    """Writes each line to stdout and to the run log file (the log is committed with the weights)."""

    def __init__(self, path: Path, append: bool = False) -> None:
        self.path = path
        self.start = time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = path.open("a" if append else "w", encoding="utf-8")

    def __call__(self, msg: str) -> None:
        line = f"[{time.perf_counter() - self.start:7.1f}s] {msg}"
        print(line, flush=True)
        self.fh.write(line + "\n")
        self.fh.flush()


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


def run_recipe(out_dir: Path, *, quick: bool = False, seed: int = 0) -> dict:
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
    _set_up_torch()
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

    workloads = _write_workloads(corpus, tokenizer, cfg, seed, out_dir, log)
    target_name = next(p.name for p in cfg.models if p.role == "target")
    trained, reports = _train_stages(cfg, tokenizer, train_stream, seed, out_dir, log)
    if cfg.on_policy is not None:
        _refine(trained, reports, target_name, tokenizer, train_stream, cfg.on_policy, seed, out_dir, log)
    workloads.append(_write_edits(corpus, tokenizer, trained[target_name], seed, out_dir, log))
    entries = [{"name": p.name, "role": p.role, "path": f"models/{p.name}", "layers": p.shape.layers,
                "hidden_size": p.shape.hidden, "intermediate_size": p.shape.intermediate, "heads": p.shape.heads,
                "dtype": str(SAVE_DTYPE).replace("torch.", ""), "training": reports[p.name]} for p in cfg.models]
    if cfg.eagle is not None:
        entries.append(_eagle(trained[target_name], tokenizer, train_stream, cfg.eagle, seed, out_dir, log))
    del trained
    manifest = {
        "version": 1,
        "quick": quick,
        "seed": seed,
        "tokenizer": {"type": "byte-level BPE (tokenizers)", "vocab_size": len(tokenizer),
                      "eos_token": tokenizer.eos_token, "eos_token_id": tokenizer.eos_token_id},
        "corpus": {**summary, "root": "<python stdlib>", "licence": "PSF License Agreement (PSF-2.0)",
                   "python": platform.python_version(), "held_out_list": [f.relpath for f in corpus.held_out]},
        "eval": {"max_windows": cfg.eval_windows, "seq": cfg.seq},
        "models": entries,
        "workloads": workloads,
    }
    manifest = assess_zoo(out_dir, manifest, repeats=cfg.timing_repeats, log=log)
    log("recipe done")
    return manifest


def _read_built(out_dir: Path) -> dict:
    """The manifest of a built zoo in ``out_dir``."""
    path = out_dir / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {MANIFEST_NAME} in {out_dir}")
    return json.loads(path.read_text(encoding="utf-8"))


def _set_up_torch() -> None:
    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()


def _write_workloads(corpus: Corpus, tokenizer, cfg: RecipeConfig, seed: int, out_dir: Path, log: _Log) -> list[dict]:
    """Cut each workload's prompts from the held-out files, write them as JSONL and describe them."""
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
    return workloads


def _write_edits(corpus: Corpus, tokenizer, target: LlamaForCausalLM, seed: int, out_dir: Path, log: _Log) -> dict:
    """The multi-turn ``edits`` workload (``training.edit_workloads``): its later turns hold the trained target's
    own greedy answers to the earlier ones, so it is built after training."""
    count = lambda text: len(tokenizer(text).input_ids)  # noqa: E731
    records = build_edit_workload(list(corpus.held_out), count, lambda text: greedy_answer(target, tokenizer, text),
                                  seed=seed)
    write_jsonl(records, out_dir / "workloads" / "edits.jsonl")
    lengths = [count(r["prompt"]) for r in records]
    info = {"name": "edits", "file": "workloads/edits.jsonl", "prompts": len(records), "min_tokens": min(lengths),
            "max_tokens": max(lengths), "mean_tokens": round(sum(lengths) / len(lengths), 1),
            "categories": sorted({r["category"] for r in records})}
    log(f"workload edits: {info}")
    return info


def greedy_answer(model: LlamaForCausalLM, tokenizer, text: str, max_new_tokens: int = 64) -> str:
    """The model's greedy continuation of ``text`` (float32, end-of-text dropped): a turn's answer."""
    ids = tokenizer(text, return_tensors="pt").input_ids
    model = model.float().eval()
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def _train_stages(
    cfg: RecipeConfig, tokenizer, train_stream: torch.Tensor, seed: int, out_dir: Path, log: _Log
) -> tuple[dict[str, LlamaForCausalLM], dict[str, dict]]:
    """Run the stages in order (drafts distilled from the trained target); the models and their reports."""
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
    return trained, reports


def _refine(trained: dict, reports: dict, target_name: str, tokenizer, stream, plan: OnPolicyPlan, seed: int,
            out_dir: Path, log: _Log) -> None:
    """Run the on-policy stage on the trained drafts, save them and record it in their reports."""
    target = trained[target_name]
    drafts = {name: m for name, m in trained.items() if name != target_name}
    stage = refine_drafts(target, drafts, stream, plan, seed=seed * 1000 + 7, log=log)
    for name, model in drafts.items():
        reports[name]["on_policy"] = {**asdict(stage[name]), **asdict(plan),
                                      "objective": "KL(p_target || q) + %.2f * CE on target greedy text "
                                                   "and training windows, alternating" % plan.ce_weight}
        _save_model(model, tokenizer, out_dir / "models" / name)
        log(f"saved {name} (on-policy refined) to {out_dir / 'models' / name}")


def _eagle(target: LlamaForCausalLM, tokenizer, stream: torch.Tensor, plan: EaglePlan, seed: int, out_dir: Path,
           log: _Log) -> dict:
    """Train the EAGLE-3 head, save it next to the models; its manifest entry."""
    head, report = train_head(target, tokenizer, stream, plan, seed * 1000 + 11, log)
    save_bundled(head, tokenizer, out_dir / "models" / plan.name)
    log(f"saved {plan.name} to {out_dir / 'models' / plan.name}")
    return manifest_entry(head, plan, report)


def train_eagle(out_dir: Path, *, quick: bool = False, seed: int = 0, repeats: int = 30, **plan_fields) -> dict:
    """Run only the EAGLE-3 stage on a built zoo (the head replaces any of the same name), then measure the
    head (the other models keep their numbers). ``plan_fields`` override the plan's (``EaglePlan``:
    ``max_steps``, ``sequences``, ``threads``); the manifest records the plan used. The bundled head was
    made this way on the bundled zoo. Appends to ``train_log.txt``."""
    out_dir = Path(out_dir)
    manifest = _read_built(out_dir)
    cfg = QUICK if quick else FULL
    plan = replace(cfg.eagle or EaglePlan(), **{k: v for k, v in plan_fields.items() if v is not None})
    log = _Log(out_dir / "train_log.txt", append=True)
    _set_up_torch()
    log(f"eagle3: EAGLE-3 stage on the built zoo in {out_dir} (seed {seed})")
    from transformers import AutoTokenizer

    target_entry = next(m for m in manifest["models"] if m["role"] == "target")
    tokenizer = AutoTokenizer.from_pretrained(out_dir / target_entry["path"])
    stream = encode_stream(tokenizer, [f.text for f in load_corpus(max_files=cfg.max_files).train])
    target = LlamaForCausalLM.from_pretrained(out_dir / target_entry["path"], dtype=torch.float32)
    entry = _eagle(target, tokenizer, stream, plan, seed, out_dir, log)
    manifest["models"] = [m for m in manifest["models"] if m["name"] != plan.name] + [entry]
    manifest = assess_zoo(out_dir, manifest, repeats=repeats, log=log, only={plan.name})
    log("eagle3 done")
    return manifest


def refine(out_dir: Path, *, quick: bool = False, seed: int = 0, repeats: int = 30) -> dict:
    """Run only the on-policy stage on a built zoo (drafts refined in place), then re-measure it.

    The bundled zoo was built this way: stages 1-2 by ``zoo train``, then this stage, which
    ``zoo train`` now runs itself. Appends to ``train_log.txt``.
    """
    out_dir = Path(out_dir)
    manifest = _read_built(out_dir)
    cfg = QUICK if quick else FULL
    log = _Log(out_dir / "train_log.txt", append=True)
    _set_up_torch()
    torch.manual_seed(seed)
    log(f"refine: on-policy stage on the built zoo in {out_dir} (seed {seed})")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out_dir / manifest["models"][0]["path"])
    corpus = load_corpus(max_files=cfg.max_files)
    stream = encode_stream(tokenizer, [f.text for f in corpus.train])
    trained = {m["name"]: LlamaForCausalLM.from_pretrained(out_dir / m["path"], dtype=torch.float32)
               for m in manifest["models"]}
    reports = {m["name"]: m["training"] for m in manifest["models"]}
    target_name = next(m["name"] for m in manifest["models"] if m["role"] == "target")
    _refine(trained, reports, target_name, tokenizer, stream, cfg.on_policy or OnPolicyPlan(), seed, out_dir, log)
    manifest = assess_zoo(out_dir, manifest, repeats=repeats, log=log)
    log("refine done")
    return manifest


def reassess(out_dir: Path, *, repeats: int = 30) -> dict:
    """Rerun only the final measurement step on a built zoo (appends to its ``train_log.txt``)."""
    out_dir = Path(out_dir)
    manifest = _read_built(out_dir)
    manifest["eval"].setdefault("max_windows", manifest["eval"].get("windows", 48))
    log = _Log(out_dir / "train_log.txt", append=True)
    _set_up_torch()
    log(f"reassess: measuring the built zoo again (torch {torch.__version__}, load {os.getloadavg()})")
    manifest = assess_zoo(out_dir, manifest, repeats=repeats, log=log)
    log("reassess done")
    return manifest
