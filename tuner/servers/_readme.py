"""The README.md written next to the exported files: what was tuned, its numbers, and how to use it.

Every rate is labelled: *measured* (real decoding, on held-out or tuning prompts, as the result says)
or *predicted* (the throughput model). Nothing here computes a number; it renders the result's.
"""
from __future__ import annotations

from typing import Any

from specdec_tune.tuner.model import Candidate, TuningResult
from specdec_tune.tuner.servers._table import SERVERS, caveats, expressible

_HOW = {
    "vllm": ("vllm/speculative_config.json", "`vllm serve TARGET --speculative-config \"$(cat vllm/speculative_config.json)\"` "
             "(or `sh vllm/launch.sh`); in Python `LLM(model=TARGET, speculative_config=json.load(open(...)))`."),
    "sglang": ("sglang/flags.txt", "one argument per line: `xargs -d '\\n' -a sglang/flags.txt python -m "
               "sglang.launch_server --model-path TARGET` (or `sh sglang/launch.sh`)."),
    "trtllm": ("trtllm/extra_llm_api_options.yaml", "`trtllm-serve TARGET --backend pytorch --extra_llm_api_options "
               "trtllm/extra_llm_api_options.yaml`; in Python pass its `speculative_config` mapping to `LLM(...)`."),
    "llamacpp": ("llamacpp/flags.txt", "one argument per line: `xargs -d '\\n' -a llamacpp/flags.txt llama-server -m "
                 "TARGET.gguf` (current `--spec-*` names); builds from before the rename take "
                 "`llamacpp/flags-before-spec-rename.txt` instead (current builds abort on `--draft-max`)."),
    "hf": ("hf/generation_config.json", "model draft: `assistant.generation_config = GenerationConfig.from_pretrained("
           "'hf')`, then `target.generate(..., assistant_model=assistant)`. n-gram: "
           "`target.generate(..., **json.load(open('hf/generation_config.json')))`."),
}


def _rate(x: float | None, label: str) -> str:
    return "not measured" if x is None and label == "measured" else ("–" if x is None else f"{x:.1f} tokens/s ({label})")


def _config_lines(r: TuningResult, ranges: list[tuple[int, int, int]] | None) -> list[str]:
    c = r.candidate
    lines = [f"- configuration: **{c.label()}**"]
    if not c.is_plain:
        lines += [f"- drafter: `{c.drafter}`" + (f" (path `{r.draft_path}`)" if r.draft_path else ""),
                  f"- N (num_speculative_tokens): {c.num_speculative_tokens}",
                  f"- θ: {c.threshold:g}" + (f" (rule `{c.threshold_rule}`)" if c.threshold > 0 else " (off)"),
                  f"- schedule: {c.schedule}"]
        if c.is_ngram:
            lines.append(f"- n-gram sizes: {c.ngram_min}..{c.ngram_max}")
        if c.tree:
            lines.append(f"- token tree: `{c.tree}`, depth N (specdec_tune.trees)")
        if c.staged:
            lines.append(f"- staged drafting: the draft's own decoding speculated by `{c.staged}`")
    if r.per_batch_size:
        lines.append(f"- best N per batch size ({r.per_batch_size_source}; 0 = do not speculate): "
                     + ", ".join(f"B={b}: {n}" for b, n in sorted(r.per_batch_size.items())))
        if ranges:
            lines.append("- as a schedule (B=1 takes the winner's N): "
                         + ", ".join(f"B {lo}..{hi} → N={n}" for lo, hi, n in ranges))
    return lines


def _numbers(r: TuningResult) -> list[str]:
    where = "held-out prompts" if r.heldout else "tuning prompts"
    ci = f" (95% CI {r.speedup_ci[0]:.2f}–{r.speedup_ci[1]:.2f})" if r.speedup_ci else ""
    speed = (f"{r.speedup:.2f}× over plain decoding, measured on {where}{ci}" if r.speedup is not None and
             r.measured_tokens_per_s is not None else
             (f"{r.speedup:.2f}× (predicted)" if r.speedup is not None else "–"))
    return [f"- throughput: {_rate(r.measured_tokens_per_s, 'measured')}" + (f" on {where}" if r.measured_tokens_per_s else ""),
            f"- plain decoding: {_rate(r.baseline_tokens_per_s, 'measured' if r.measured_tokens_per_s else 'predicted')}",
            f"- speedup: {speed}",
            f"- predicted throughput: {_rate(r.predicted_tokens_per_s, 'predicted')}",
            f"- temperature: {r.temperature:g}" + (" (greedy)" if r.temperature == 0 else "")]


def _best(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "–"
    try:
        label = Candidate.from_dict(entry).label()
    except (KeyError, TypeError):
        return "–"
    nums = []
    if entry.get("measured_tokens_per_s") is not None:
        nums.append(f"{entry['measured_tokens_per_s']:.1f} tok/s measured")
    if entry.get("predicted_tokens_per_s") is not None:
        nums.append(f"{entry['predicted_tokens_per_s']:.1f} tok/s predicted")
    return f"{label}" + (f" ({', '.join(nums)})" if nums else "")


def _servers_table(r: TuningResult) -> list[str]:
    rows = ["| server | version checked | runs this config? | what it cannot express | best inside its space |",
            "|---|---|---|---|---|"]
    for name, space in SERVERS.items():
        reason = expressible(space, r.candidate)
        lacks = ["θ" if not space.threshold_rules else "",
                 "per-batch-size N" if space.batch_schedule is None else "",
                 "heuristic schedule" if "heuristic" not in space.schedules else "",
                 "token trees" if not space.trees else f"token trees other than {', '.join(space.trees)}",
                 "staged drafting" if not space.staged else ""]
        lacks_text = ", ".join(x for x in lacks if x) or "–"
        if space.threshold_rules:
            lacks_text += f"; θ rule other than `{space.threshold_rules[0]}`"
        rows.append(f"| {space.title} | {space.version} | {'yes' if reason is None else 'no: ' + reason} | "
                    f"{lacks_text} | {_best(r.best_per_server.get(name))} |")
    return rows


def render_readme(r: TuningResult, built: dict[str, list[tuple[str, str]]], skipped: dict[str, str],
                  substituted: dict[str, str] | None = None) -> str:
    """The README text for the exports in ``built`` (format -> files), the formats ``skipped`` and those
    ``substituted`` (written with their own server's best configuration instead of the winner)."""
    from specdec_tune.tuner.servers._exports import batch_ranges, server_best

    substituted = substituted or {}

    ranges = batch_ranges(r)
    source = f"study `{r.study}`" if r.study else (f"profile run {r.run_id}" if r.run_id is not None else "–")
    out = ["# Speculative decoding configuration (specdec-tune)", "",
           f"Tuned for server `{r.server}` from {source}.", "", "## Configuration", ""]
    out += _config_lines(r, ranges)
    out += ["", "## Numbers", ""] + _numbers(r)
    out += ["", "## Where it was tuned", "",
            f"- hardware: {r.hardware or '–'}",
            f"- target: `{r.target}`" + (f" (path `{r.target_path}`)" if r.target_path else ""),
            f"- draft: `{r.candidate.drafter}`",
            f"- workload: `{r.workload}`", ""]
    out += ["## What each server can run", ""] + _servers_table(r) + [""]
    out += ["## Files and how to pass them", ""]
    if r.candidate.is_plain:
        out += ["The winner is plain decoding: launch each server without speculative options "
                "(the `launch.sh` files do).", ""]
    for fmt, files in built.items():
        space = SERVERS[fmt]
        names = ", ".join(f"`{p}`" for p, _ in files) or "(none needed)"
        out += [f"### {space.title} ({space.version})", "", f"Files: {names}.", ""]
        this = server_best(r, fmt) if fmt in substituted else r
        if fmt in substituted:
            out += [f"**Not the winner:** {substituted[fmt]}.", ""] + _config_lines(this, batch_ranges(this))
            out += [f"- throughput: {_rate(this.measured_tokens_per_s, 'measured')} on tuning prompts"
                    if this.measured_tokens_per_s is not None else "- throughput: not measured",
                    f"- predicted throughput: {_rate(this.predicted_tokens_per_s, 'predicted')}", ""]
        if files and not this.candidate.is_plain:
            out += [f"How: {_HOW[fmt][1]}", ""]
        if fmt in ("vllm", "trtllm") and batch_ranges(this):
            out += [f"Per-batch-size N: {space.notes[0]}", ""]
        notes = caveats(space, this.candidate)
        if fmt == "llamacpp":
            notes = [space.notes[0], *notes]
        out += [f"- {n}" for n in notes] + ([""] if notes else [])
    if "hf" in built and not r.candidate.is_plain and not r.candidate.is_ngram:
        out += ["### What HF does with θ at run time", "",
                f"`assistant_confidence_threshold` = {r.candidate.threshold:g} is always written: transformers' "
                "default is 0.4, so leaving it out would switch a threshold on. HF's rule proposes the token whose "
                "confidence is below θ, then stops drafting (the engine's `before` rule stops before it). "
                "When scikit-learn is installed and θ > 0, transformers re-tunes θ after every verification from an "
                "ROC curve of draft confidence against acceptance (cost = FPR + 3·FNR), so the exported θ is only "
                "its starting value; with θ = 0 or without scikit-learn θ stays as written.", ""]
    if skipped:
        out += ["## Formats not written", ""] + [f"- {f}: {why}" for f, why in skipped.items()] + [""]
    return "\n".join(out)
