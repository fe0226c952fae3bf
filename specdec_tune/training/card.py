"""Render the zoo's model card (MODEL_CARD.md) from the manifest, and check the quality bars."""
from __future__ import annotations

from collections.abc import Iterator

# The zoo's quality bars: the best draft agrees greedily with the target on >= 60% of held-out
# positions, one target forward costs >= 8x one forward of the smallest draft, and the target's
# held-out loss is below every draft's.
MIN_BEST_AGREEMENT = 0.60
MIN_LATENCY_RATIO = 8.0


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def latency_ratio(manifest: dict, new_tokens: str = "1", key: str = "ms_per_forward_at_training_time") -> float:
    """Target ms per forward over the smallest draft's (fewest layers), from the manifest.

    ``key`` selects the 2-thread (default) or the 1-thread (``ms_per_forward_1_thread``) timings.
    """
    target = _target(manifest)
    smallest = min((m for m in manifest["models"] if m["role"] == "draft"), key=lambda m: (m["layers"], m["parameters"]))
    return target[key][new_tokens]["median"] / smallest[key][new_tokens]["median"]


def _on_policy_cell(training: dict) -> str:
    op = training.get("on_policy")
    if not op:
        return ""
    return (f"; then on-policy: {op['sequences']} target continuations of {op['new_tokens']} tokens, "
            f"{op['steps']} steps, {op['seconds'] / 60:.1f} min")


def latency_settings(target: dict) -> list[tuple[str, str]]:
    """(manifest key, label) of each latency measurement the manifest holds."""
    candidates = [("ms_per_forward_at_training_time", "HF forward, 2 threads"),
                  ("ms_per_forward_1_thread", "HF forward, 1 thread"),
                  ("ms_per_forward_engine_1_thread", "engine (lean) forward, 1 thread")]
    return [(key, label) for key, label in candidates if key in target]


def check_bars(manifest: dict) -> list[str]:
    """One line per bar, starting with PASS or FAIL."""
    target = _target(manifest)
    drafts = [m for m in manifest["models"] if m["role"] == "draft"]
    best = max(d["quality"]["greedy_agreement"] for d in drafts)
    lines = [
        f"{'PASS' if best >= MIN_BEST_AGREEMENT else 'FAIL'}: best draft greedy agreement {best:.3f} "
        f"(bar {MIN_BEST_AGREEMENT})",
    ]
    for key, label in latency_settings(target):
        for k in ("1", "8"):
            ratio = latency_ratio(manifest, k, key)
            lines.append(f"{'PASS' if ratio >= MIN_LATENCY_RATIO else 'FAIL'}: target/smallest-draft latency "
                         f"ratio for {k} new token(s), {label}: {ratio:.1f}x (bar {MIN_LATENCY_RATIO}x)")
    t_loss = target["quality"]["held_out_nats_per_token"]
    worst = [d["name"] for d in drafts if d["quality"]["held_out_nats_per_token"] <= t_loss]
    lines.append(f"{'PASS' if not worst else 'FAIL'}: target held-out loss {t_loss:.3f} below every draft's"
                 + (f" (not below {', '.join(worst)})" if worst else ""))
    return lines


def render(manifest: dict) -> str:
    """The model card as Markdown."""
    sections = (_intro, _corpus, _tokenizer, _models, _quality, _latency, _workloads, _bars)
    return "\n".join(line for section in sections for line in section(manifest))


def _target(manifest: dict) -> dict:
    return next(m for m in manifest["models"] if m["role"] == "target")


def _intro(manifest: dict) -> Iterator[str]:
    yield "# specdec-tune mini model zoo\n"
    if manifest.get("quick"):
        yield "> **Smoke build (`--quick`)**: tiny models, not the bundled zoo.\n"
    yield ("A small family of Llama-architecture causal LMs that ship inside the package, so that the tool's main "
           "job (speculative decoding with a target and draft models that share a tokenizer) runs on a machine "
           "with no network. They are trained on Python source code and are useful for measuring and tuning "
           "speculative decoding, not as assistants.\n")
    yield ("Rebuild with `specdec-tune zoo train --out DIR` (seeded; this card, `zoo.json` and `train_log.txt` "
           "are written by that recipe).\n")


def _corpus(manifest: dict) -> Iterator[str]:
    c = manifest["corpus"]
    yield "## Corpus\n"
    yield (f"- Source: the `.py` files of the Python {c['python']} standard library (`sysconfig.get_paths()[\"stdlib\"]`), "
           "leaving out `site-packages` and the test folders (`test`, `tests`, `idle_test`).")
    yield (f"- Licence: {c['licence']}. The Python standard library is copyright the Python Software Foundation "
           "and distributed under the PSF License Agreement; the prompts in `workloads/` are excerpts of it.")
    yield ("- Split by file, deterministically: a file is held out when the first 4 bytes of "
           "SHA-256(`specdec-tune-zoo-v1:<relative path>`) mod 100 < 10 (~10%). The held-out file list is in `zoo.json`.")
    yield (f"- Train: {_fmt_int(c['train_files'])} files, {_fmt_int(c['train_bytes'])} bytes, "
           f"{_fmt_int(c['train_tokens'])} tokens.")
    yield (f"- Held-out: {_fmt_int(c['held_out_files'])} files, {_fmt_int(c['held_out_bytes'])} bytes, "
           f"{_fmt_int(c['held_out_tokens'])} tokens.\n")


def _tokenizer(manifest: dict) -> Iterator[str]:
    tok = manifest["tokenizer"]
    yield "## Tokenizer\n"
    yield (f"One {tok['type']} tokenizer, vocabulary {tok['vocab_size']}, shared by every model and saved in every "
           f"model folder (`tokenizer.json`, `tokenizer_config.json`; loads with `AutoTokenizer.from_pretrained`). "
           f"`{tok['eos_token']}` (id {tok['eos_token_id']}) is the EOS, BOS and padding token; files are separated "
           "by it in training. Byte-level, so every string round-trips.\n")


def _models(manifest: dict) -> Iterator[str]:
    yield "## Models\n"
    yield "| name | role | layers × width (heads, MLP) | parameters | weights | training |"
    yield "|---|---|---|---|---|---|"
    for m in manifest["models"]:
        t = m["training"]
        yield (f"| `{m['name']}` | {m['role']} | {m['layers']} × {m['hidden_size']} ({m['heads']}, "
               f"{m['intermediate_size']}) | {_fmt_int(m['parameters'])} | {m['dtype']}, "
               f"{m['weight_bytes'] / 1e6:.1f} MB | {t['objective'].replace('||', '‖')}; {t['steps']} steps × "
               f"{t['batch']}×{t['seq']} tokens, {t['seconds'] / 60:.1f} min (stopped by {t['stopped_by']})"
               + _on_policy_cell(t) + " |")
    yield ""
    seq = _target(manifest)["training"]["seq"]
    yield ("All: `LlamaForCausalLM`, tied input/output embeddings, RoPE (theta 10,000), max_position_embeddings "
           "1024, trained in fp32 on the CPU with AdamW (betas 0.9/0.95, weight decay 0.1, grad clip 1.0), "
           "linear warm-up and cosine decay to 10% of the peak lr (progress = the larger of steps done and time "
           f"budget spent), on seeded random {seq}-token windows of the train stream. The loop uses 1 or 2 threads, "
           "whichever its periodic probe measures faster (on a shared 2-core machine one thread is often ~3x "
           "more efficient). Weights are stored in float16 (more mantissa than bfloat16; loading with `dtype=torch.float32` "
           "is exact). The target is trained on the data; each draft starts from the target's embeddings, final "
           "norm and evenly spaced target layers, and is distilled from the target (forward KL to the target's "
           "logits plus a small data cross-entropy term), which raises agreement. Then (on-policy stage) the "
           "target greedily continues random training-split prompts and the drafts are distilled further on those "
           "continuations, alternating with ordinary windows: greedy speculative decoding is judged on the "
           "target's own output, which is not distributed like source files.\n")


def _quality(manifest: dict) -> Iterator[str]:
    target = _target(manifest)
    tq = target["quality"]
    yield "## Quality (held-out files, teacher-forced)\n"
    ev = manifest["eval"]
    yield (f"Evaluated on the first {ev['windows']} windows of {ev['seq']} tokens of the held-out stream "
           f"({_fmt_int(tq['eval_tokens'])} predicted tokens), with the shipped float16 weights loaded as float32.\n")
    yield (f"Target `{target['name']}`: **{tq['held_out_nats_per_token']:.3f} nats/token**, "
           f"{tq['held_out_nats_per_byte']:.3f} nats/byte ({tq['held_out_bits_per_byte']:.3f} bits/byte).\n")
    yield "| draft | held-out nats/token | greedy agreement with target (argmax equal) | sampling acceptance 1 − E[TV(p, q)] |"
    yield "|---|---|---|---|"
    for m in manifest["models"]:
        if m["role"] == "draft":
            q = m["quality"]
            yield (f"| `{m['name']}` | {q['held_out_nats_per_token']:.3f} | {q['greedy_agreement']:.3f} "
                   f"| {q['sampling_acceptance']:.3f} |")
    yield ""
    yield ("Greedy agreement is the per-token acceptance rate of greedy speculative decoding; 1 − E[TV] is the "
           "per-token acceptance rate of sampling (temperature 1) speculative decoding (Leviathan et al. 2023).\n")
    yield from _heads(manifest)


def _heads(manifest: dict) -> Iterator[str]:
    """The EAGLE-3 heads' quality (``training.eagle_eval``), teacher-forced on the same windows."""
    heads = [m for m in manifest["models"] if m["role"] == "eagle3"]
    if not heads:
        return
    yield "| EAGLE-3 head | draft vocabulary | greedy agreement (step 1) | sampling acceptance (step 1) | agreement by chain step |"
    yield "|---|---|---|---|---|"
    for m in heads:
        q, e = m["quality"], m.get("eagle3", {})
        steps = " ".join(f"{a:.3f}" for a in q["agreement_by_step"])
        yield (f"| `{m['name']}` | {e.get('draft_vocab_size', '?')} tokens, target layers {e.get('target_layers', '?')} "
               f"| {q['greedy_agreement']:.3f} | {q['sampling_acceptance']:.3f} | {steps} |")
    yield ""
    yield ("A head reads the target's residual stream after a low, a middle and a high layer (EAGLE-3, arXiv "
           "2503.01840) and is trained by the training-time test: step j of the chain reads the head's own output "
           "of step j − 1. Step j's agreement is measured the same way, given the text's tokens before it.\n")


def _latency(manifest: dict) -> Iterator[str]:
    yield "## Latency on the build machine\n"
    tm = manifest["timing"]
    yield (f"Milliseconds per forward with a KV cache after {tm['context_tokens']} context tokens, float32, "
           f"{tm['cpu_count']}-core CPU (`{tm['machine']}`), median (p10–p90) of the repeats, the models "
           "interleaved in rounds so that load from other jobs hits all alike. The machine was shared with other "
           f"jobs (load average at the end: {tm.get('load_average_at_end', '?')}), so expect noise; "
           "`specdec-tune zoo list` measures again on your machine.\n")
    keys = latency_settings(_target(manifest))
    yield ("| model | " + " | ".join(f"{label}, {k} new token{'s' if k != '1' else ''}" for _, label in keys
                                  for k in ("1", "8")) + " |")
    yield "|---|" + "---|" * (2 * len(keys))
    for m in manifest["models"]:
        cells = []
        for key, _ in keys:
            t = m[key]
            cells += [f"{t[k]['median']:.2f} ({t[k]['p10']:.2f}–{t[k]['p90']:.2f})" for k in ("1", "8")]
        yield f"| `{m['name']}` | " + " | ".join(cells) + " |"
    yield ""
    for key, label in keys:
        yield (f"Target / smallest draft, {label}: {latency_ratio(manifest, '1', key):.1f}× for 1 token, "
               f"{latency_ratio(manifest, '8', key):.1f}× for 8 tokens.\n")


# Where each bundled workload's prompts end (the card's last column).
_ENDS = {"functions": "a function body, after its first statements",
         "docstrings": "a docstring (after its summary line) or a `#` comment block",
         "tables": "a long dict/list/tuple/set literal (tables, codecs): repetitive",
         "edits": "a restated function header, after the function and the target's earlier answers (multi-turn)"}


def _workloads(manifest: dict) -> Iterator[str]:
    yield "## Workloads\n"
    yield ("Prompt sets cut from held-out files (JSONL: `id`, `category`, `prompt`, `source`), each prompt a run "
           "of whole source lines ending at the cut point:\n")
    yield "| name | prompts | tokens (min–max, mean) | categories | ends inside |"
    yield "|---|---|---|---|---|"
    for wl in manifest["workloads"]:
        yield (f"| `{wl['name']}` | {wl['prompts']} | {wl['min_tokens']}–{wl['max_tokens']}, {wl['mean_tokens']} "
               f"| {', '.join(wl['categories'])} | {_ENDS.get(wl['name'], '')} |")
    yield ""


def _bars(manifest: dict) -> Iterator[str]:
    yield "## Bars\n"
    for line in check_bars(manifest):
        yield f"- {line}"
    yield ""
