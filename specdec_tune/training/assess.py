"""Final step of the zoo recipe: measure the shipped models and write the manifest and model card.

Quality is measured on held-out files with the shipped float16 weights loaded as float32 (the way
the engine loads them). Latency is measured per forward with a KV cache, interleaving the models in
rounds so that load from other jobs on a shared machine hits every model alike (the ratios stay
fair even when absolute numbers are noisy): through Hugging Face's forward with 2 threads and with 1
thread, and through the engine's lean forward (:mod:`specdec_tune.engine.lean`, what speculative
decoding runs) with 1 thread.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from specdec_tune.engine import EagleHead, forward_with_cache, load_head, make_cache, wrap_forward
from specdec_tune.profiler import Stopwatch
from specdec_tune.training import card
from specdec_tune.training.corpus import stdlib_root
from specdec_tune.training.evaluate import agreement, eval_windows, held_out_loss, token_byte_lengths
from specdec_tune.training.train import encode_stream

MANIFEST_NAME = "zoo.json"
CONTEXT_TOKENS = 128
NEW_TOKENS = (1, 8)


@torch.no_grad()
def forward_samples(model: PreTrainedModel, new_tokens: int, *, repeats: int, warmup: int = 2,
                    context: int = CONTEXT_TOKENS, seed: int = 0, lean: bool = False) -> list[float]:
    """Milliseconds of ``repeats`` forwards of ``new_tokens`` tokens after ``context`` cached tokens.

    The cache is cropped back after each forward (outside the timed interval), so every repeat sees
    the same context length. ``lean``: the engine's lean forward on its preallocated cache, with
    ``logits_to_keep`` = new tokens as the engine calls it; otherwise HF's forward on a DynamicCache.
    """
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    if isinstance(model, EagleHead):  # a head has one forward, on the engine's cache (its features: zeros)
        cache = make_cache(model, context + new_tokens)
        kwargs = {"logits_to_keep": new_tokens}
    elif lean:
        model = wrap_forward(model, "lean")
        cache = make_cache(model, context + new_tokens)
        kwargs = {"logits_to_keep": new_tokens}
    else:
        cache, kwargs = DynamicCache(), {}
    forward_with_cache(model, torch.randint(0, vocab, (1, context), generator=gen), cache)
    new = torch.randint(0, vocab, (1, new_tokens), generator=gen)
    out: list[float] = []
    watch = Stopwatch()
    for i in range(warmup + repeats):
        watch.start()
        forward_with_cache(model, new, cache, **kwargs)
        elapsed = watch.stop()
        cache.crop(-new_tokens)
        if i >= warmup:
            out.append(elapsed * 1e3)
    return out


def _summary(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=10) if len(samples) >= 2 else samples * 9
    return {"median": statistics.median(samples), "p10": q[0], "p90": q[-1], "n": len(samples)}


def measure_latency(models: dict[str, PreTrainedModel], *, repeats: int, threads: int,
                    rounds: int = 5, lean: bool = False) -> dict[str, dict[str, dict[str, float]]]:
    """Per model and new-token count: median/p10/p90 ms per forward, models interleaved in rounds."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    per_round = max(2, -(-repeats // rounds))
    samples: dict[str, dict[int, list[float]]] = {name: {k: [] for k in NEW_TOKENS} for name in models}
    try:
        for r in range(rounds):
            for name, model in models.items():
                for k in NEW_TOKENS:
                    samples[name][k] += forward_samples(model, k, repeats=per_round, seed=r, lean=lean)
    finally:
        torch.set_num_threads(previous)
    return {name: {str(k): _summary(v) for k, v in by_k.items()} for name, by_k in samples.items()}


def assess_zoo(out_dir: Path, manifest: dict, *, repeats: int, log: Callable[[str], None] = print,
               only: set[str] | None = None) -> dict:
    """Measure quality and latency of a built zoo; write ``zoo.json`` and ``MODEL_CARD.md``.

    Args:
        out_dir: the zoo folder (``models/<name>/`` inside).
        manifest: the manifest so far: corpus (with ``held_out_list``), eval settings, tokenizer,
            workloads and one entry per model (name, role, path, shape, training report).
        repeats: timed forwards per model, token count and thread setting.
        log: where progress lines go.
        only: measure these models alone (timed interleaved with the target), keeping every other entry's
            stored numbers and the stored timing conditions: a stage that adds one model to a built zoo.

    Returns:
        The completed manifest (also written to ``out_dir / "zoo.json"``).
    """
    out_dir = Path(out_dir)
    entries = manifest["models"]
    target_entry = next(m for m in entries if m["role"] == "target")
    tokenizer = AutoTokenizer.from_pretrained(out_dir / target_entry["path"])
    root = stdlib_root()
    held_texts = [(root / rel).read_text(encoding="utf-8") for rel in manifest["corpus"]["held_out_list"]]
    windows = eval_windows(encode_stream(tokenizer, held_texts), manifest["eval"]["seq"],
                           manifest["eval"]["max_windows"])
    manifest["eval"]["windows"] = int(windows.shape[0])
    measured = [m for m in entries if only is None or m["name"] in only]
    timed = [m for m in entries if m is target_entry or m in measured]
    loaded = {m["name"]: load_head(out_dir / m["path"]) if m["role"] == "eagle3" else
              AutoModelForCausalLM.from_pretrained(out_dir / m["path"], dtype=torch.float32).eval() for m in timed}
    target = loaded[target_entry["name"]]
    _measure_quality(measured, loaded, target, windows, token_byte_lengths(tokenizer), out_dir, log)
    _measure_timing(measured, loaded, repeats, log)
    if only is None:
        manifest["timing"] = {"context_tokens": CONTEXT_TOKENS, "threads": 2, "also_measured_threads": 1,
                              "machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count() or 0,
                              "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    (out_dir / "MODEL_CARD.md").write_text(card.render(manifest), encoding="utf-8")
    for line in card.check_bars(manifest):
        log(line)
    return manifest


def _measure_quality(entries: list[dict], loaded: dict, target, windows: torch.Tensor, byte_len: torch.Tensor,
                     out_dir: Path, log: Callable[[str], None]) -> None:
    """Held-out loss of every model and each draft's agreement with the target, into ``entries``."""
    # One thread for the quality passes: on a shared 2-core machine two threads can be many times
    # slower (barrier waits), and the numbers do not depend on it.
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    for m in entries:
        model = loaded[m["name"]]
        if m["role"] == "eagle3":  # a head is no LM of the text: its agreement with the target is its quality
            from specdec_tune.training.eagle_eval import head_quality

            m["quality"] = head_quality(target, model, windows)
            _describe_files(m, model, out_dir)
            log(f"quality {m['name']}: {json.dumps(m['quality'])}")
            continue
        loss = held_out_loss(model, windows, byte_len)
        quality: dict = {"held_out_nats_per_token": loss.nats_per_token, "held_out_nats_per_byte": loss.nats_per_byte,
                         "held_out_bits_per_byte": loss.bits_per_byte, "eval_tokens": loss.tokens}
        if m["role"] == "draft":
            agr = agreement(target, model, windows)
            quality.update(greedy_agreement=agr.greedy_agreement, sampling_acceptance=agr.sampling_acceptance)
        m["quality"] = quality
        _describe_files(m, model, out_dir)
        log(f"quality {m['name']}: {json.dumps(quality)}")
    torch.set_num_threads(threads_before)


def _describe_files(m: dict, model, out_dir: Path) -> None:
    """The entry's files, weight bytes and parameter count."""
    folder = out_dir / m["path"]
    m["files"] = sorted(p.name for p in folder.iterdir())
    m["weight_bytes"] = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    m["parameters"] = sum(p.numel() for p in model.parameters())


def _measure_timing(entries: list[dict], loaded: dict, repeats: int, log: Callable[[str], None]) -> None:
    """Per-forward latency of every model (HF at 2 and 1 threads, the lean engine at 1), into ``entries``."""
    timing = {t: measure_latency(loaded, repeats=repeats, threads=t) for t in (2, 1)}  # the target is loaded too
    timing["engine"] = measure_latency(loaded, repeats=repeats, threads=1, lean=True)
    for m in entries:
        m["ms_per_forward_at_training_time"] = timing[2][m["name"]]
        m["ms_per_forward_1_thread"] = timing[1][m["name"]]
        m["ms_per_forward_engine_1_thread"] = timing["engine"][m["name"]]
        log(f"latency {m['name']}: " + ", ".join(
            f"{t} {k} tok {timing[t][m['name']][k]['median']:.2f} ms" for t in (2, 1, "engine") for k in ("1", "8")))
