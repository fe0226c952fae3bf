"""The README.md written next to the exported files: what was tuned, its numbers, and how to use it.

Every rate is labelled: *measured* (real decoding, on held-out or tuning prompts, as the result says)
or *predicted* (the throughput model). Nothing here computes a number or chooses a configuration: each
server's section renders the :class:`~._exports.Shipped` record its files were built from.
"""
from __future__ import annotations

from specdec_tune.tuner.model import MIN_LOWER, TuningResult, describe_side, format_value
from specdec_tune.tuner.servers._exports import batch_ranges, schedule_points
from specdec_tune.tuner.servers._paths import file_paths, relocated
from specdec_tune.tuner.servers._ship import Shipped
from specdec_tune.tuner.servers._table import SERVERS, caveats, expressible

_HOW = {
    "vllm": ("vllm/speculative_config.json", "`vllm serve TARGET --speculative-config \"$(cat vllm/speculative_config.json)\"` "
             "(or `sh vllm/launch.sh`); in Python `LLM(model=TARGET, speculative_config=json.load(open(...)))`."),
    "sglang": ("sglang/flags.txt", "one argument per line: `xargs -d '\\n' -a sglang/flags.txt python -m "
               "sglang.launch_server --model-path TARGET` (or `sh sglang/launch.sh`)."),
    "trtllm": ("trtllm/extra_llm_api_options.yaml", "`trtllm-serve TARGET --backend pytorch --extra_llm_api_options "
               "trtllm/extra_llm_api_options.yaml`; in Python pass its `speculative_config` mapping to `LLM(...)`."),
    "llamacpp": ("llamacpp/flags.txt", "`sh llamacpp/launch.sh` (it runs from its folder, where `target.gguf` and "
                 "`draft.gguf` are: both models converted to GGUF, float32, by llama.cpp's own converter; "
                 "`gguf_sources.json` names the models), or from `llamacpp/`, one argument per line: `xargs -d "
                 "'\\n' -a flags.txt llama-server -m target.gguf` (current `--spec-*` names); builds from before the "
                 "rename take `flags-before-spec-rename.txt` instead (current builds abort on `--draft-max`)."),
    "hf": ("hf/generation_config.json", "model draft: `assistant.generation_config = GenerationConfig.from_pretrained("
           "'hf')`, then `target.generate(..., assistant_model=assistant)`. n-gram: "
           "`target.generate(..., **json.load(open('hf/generation_config.json')))`."),
}


def _rate(x: float | None, label: str) -> str:
    return "not measured" if x is None and label == "measured" else ("–" if x is None else f"{x:.1f} tokens/s ({label})")


def _predicted(r: TuningResult) -> str:
    """The label of ``r``'s predicted rate: what it was computed for, where the result says."""
    return f"predicted for {r.predicted_basis}" if r.predicted_basis else "predicted"


def _ci(ci: tuple[float, float] | None) -> str:
    return f" (95% CI {ci[0]:.2f}–{ci[1]:.2f})" if ci else ""


def _config_lines(r: TuningResult, ranges: list[tuple[int, int, int]] | None, per_b: bool = True) -> list[str]:
    c = r.candidate
    lines = [f"- configuration: **{c.label()}**"]
    if not c.is_plain:
        path = file_paths(r)[1]  # the draft the files name
        lines += [f"- drafter: `{c.drafter}`" + (f" (path `{path}`)" if path and path != c.drafter else ""),
                  f"- N (num_speculative_tokens): {c.num_speculative_tokens}",
                  f"- θ: {c.threshold:g}" + (f" (rule `{c.threshold_rule}`, {c.threshold_kind}"
                                             + (f", step {c.threshold_step:g})" if c.threshold_kind == "adaptive" else ")")
                                             if c.threshold > 0 or c.threshold_kind == "adaptive" else " (off)"),
                  f"- schedule: {c.schedule}"]
        if r.bias:
            b = r.bias
            measured = "" if b.get("measured_bias") is None else f"; measured {b['measured_bias']:.4f}"
            lines.append(f"- acceptance: {c.acceptance}" + (f" ε={c.epsilon:g}" if c.acceptance != "exact" else "")
                         + f"; bias {b['bias']:.4f} per verified position (mean TV(emitted, target), "
                         f"{b.get('label', 'computed')}{measured})"
                         + (f", budget {b['budget']:g}" if b.get("budget") is not None else ""))
        if c.is_ngram:
            lines.append(f"- n-gram sizes: {c.ngram_min}..{c.ngram_max}")
        if c.tree:
            lines.append(f"- token tree: `{c.tree}`, depth N (specdec_tune.core.trees)")
        if c.staged:
            lines.append(f"- staged drafting: the draft's own decoding speculated by `{c.staged}`")
    points = schedule_points(r) if per_b else {}
    if points:
        lines.append(f"- N per batch size ({r.per_batch_size_source}; B=1 takes the configuration's N; 0 = do not "
                     "speculate): " + ", ".join(f"B={b}: {n}" for b, n in points.items()))
        if ranges:
            lines.append("- as a schedule: " + ", ".join(f"B {lo}..{hi} → N={n}" for lo, hi, n in ranges))
        lines += [f"  - B={b}: {why}" for b, why in sorted(r.per_batch_size_reasons.items()) if b in points]
    return lines


def tuned_for(r: TuningResult, outcome: bool = True) -> str | None:
    """One line naming what the files were tuned for (objective, SLO, price, budget), or None for a
    result from before objectives were recorded; ``outcome`` adds whether the winner met the SLO held
    out (only for files that carry the winner)."""
    o = r.objective
    if not o:
        return None
    line = f"tuned for {o.get('describe') or o.get('objective')}"
    slo = (o.get("winner") or {}).get("slo")
    if slo and outcome:
        line += f"; held out, the SLO was {'met' if slo['met'] else 'NOT met'}"
    return line


def _objective_lines(r: TuningResult) -> list[str]:
    """The objective section: what was optimised, the SLO, and the measured held-out values with CIs."""
    o = r.objective
    if not o:
        return []
    out = ["## Objective", "", f"- {tuned_for(r)}"]
    slo = o.get("slo") or {}
    bounds = [f"TPOT (decode window) <= {slo['tpot_ms']:g} ms" if slo.get("tpot_ms") is not None else "",
              f"TTFT <= {slo['ttft_ms']:g} ms" if slo.get("ttft_ms") is not None else ""]
    if any(bounds):
        out.append(f"- latency SLO: p{slo.get('percentile', 99):g} of requests with "
                   + " and ".join(b for b in bounds if b))
    for key in ("winner", "plain"):
        side = o.get(key) or {}
        out.append(f"- {key} ({side.get('label', '–')}): {o['objective']} {describe_side(o['objective'], side)}")
    if o.get("predicted") is not None:
        out.append(f"- winner's {o['objective']}: {format_value(o['objective'], o['predicted'])} (predicted"
                   + (f" for {o['predicted_basis']})" if o.get("predicted_basis") else ")"))
    return out + [""]


def _speed(r: TuningResult) -> str:
    where = "held-out prompts" if r.heldout else "tuning prompts"
    if r.speedup is None:
        return "not measured" + (" (predicted only)" if r.measured_tokens_per_s is None else " against plain decoding")
    if r.measured_tokens_per_s is None:
        return f"{r.speedup:.2f}× (predicted); not measured"
    return f"{r.speedup:.2f}× over plain decoding, measured on {where}{_ci(r.speedup_ci)}"


def _numbers(r: TuningResult) -> list[str]:
    where = "held-out prompts" if r.heldout else "tuning prompts"
    return [f"- throughput: {_rate(r.measured_tokens_per_s, 'measured')}" + (f" on {where}" if r.measured_tokens_per_s else ""),
            f"- plain decoding: {_rate(r.baseline_tokens_per_s, 'measured' if r.measured_tokens_per_s else 'predicted')}",
            f"- speedup: {_speed(r)}",
            f"- predicted throughput: {_rate(r.predicted_tokens_per_s, _predicted(r))}",
            f"- temperature: {r.temperature:g}" + (" (greedy)" if r.temperature == 0 else "")]


def _short(r: TuningResult) -> str:
    """The measured speedup in a table cell."""
    if r.speedup is None or r.measured_tokens_per_s is None:
        return "not measured"
    return f"{r.speedup:.2f}×{_ci(r.speedup_ci)}, " + ("held out" if r.heldout else "tuning prompts")


def _carried(s: Shipped | None) -> tuple[str, str]:
    """(what the file carries, its measured speedup) for the servers table."""
    if s is None:
        return "– (not written)", "–"
    measured = s.decision.candidate if s.decision is not None else None
    if s.result.candidate.is_plain and measured is not None and not measured.is_plain:
        return "plain decoding", f"{measured.label()}: {_short(s.result)}"
    return s.result.candidate.label(), _short(s.result) if not s.result.candidate.is_plain else "–"


def _servers_table(r: TuningResult, shipped: dict[str, Shipped]) -> list[str]:
    rows = ["| server | version checked | runs the winner? | what it cannot express | its file carries "
            "| measured speedup |",
            "|---|---|---|---|---|---|"]
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
        carries, speed = _carried(shipped.get(name))
        rows.append(f"| {space.title} | {space.version} | {'yes' if reason is None else 'no: ' + reason} | "
                    f"{lacks_text} | {carries} | {speed} |")
    return rows


def _file_section(s: Shipped) -> list[str]:
    """One server's section, rendered from the very result its files were built from."""
    space, this = SERVERS[s.fmt], s.result
    names = ", ".join(f"`{p}`" for p, _ in s.files) or "(none needed)"
    line = tuned_for(this, outcome=s.note is None)
    out = [f"### {space.title} ({space.version})", "", f"Files: {names}."
           + (f" Tuned for: {line[len('tuned for '):]}." if line else ""), ""]
    d = s.decision
    if s.note:
        out += [f"**{'Plain decoding' if this.candidate.is_plain else 'Not the overall winner'}:** {s.note}.", ""]
    out += _config_lines(this, batch_ranges(this), per_b=space.batch_schedule is not None)
    if d is not None and d.candidate.is_plain:
        out.append("- decision: plain decoding (the fastest measured)")
    elif d is not None and not d.speculates:
        out += [f"- measured: {d.candidate.label()}: {_speed(this)}",
                "- decision: plain decoding" + (f" (the CI's lower bound, {d.speedup_ci[0]:.2f}, is below "
                                                f"{MIN_LOWER:g})" if d.speedup_ci else "")]
    else:
        out += [f"- measured speedup: {_speed(this)}",
                f"- throughput: {_rate(this.measured_tokens_per_s, 'measured')}; plain decoding "
                f"{_rate(this.baseline_tokens_per_s, 'measured' if this.measured_tokens_per_s else 'predicted')}"]
        if d is not None and d.speedup_ci:
            out.append(f"- decision: speculate (the CI's lower bound, {d.speedup_ci[0]:.2f}, is at least "
                       f"{MIN_LOWER:g})")
    out.append(f"- predicted throughput: {_rate(this.predicted_tokens_per_s, _predicted(this))}"
               + (f", {d.predicted_speedup:.2f}× (predicted)" if d is not None and d.predicted_speedup else ""))
    if d is not None and d.selected:
        out.append(f"- chosen: {d.selected}")
    out.append("")
    if s.files and not this.candidate.is_plain:
        out += [f"How: {_HOW[s.fmt][1]}", ""]
    if s.fmt in ("vllm", "trtllm") and batch_ranges(this):
        out += [f"Per-batch-size N: {space.notes[0]}", ""]
    notes = caveats(space, this.candidate)
    if s.fmt == "llamacpp":
        notes = [space.notes[0], *notes]
    return out + [f"- {n}" for n in notes] + ([""] if notes else [])


def _model_paths(shipped: dict[str, Shipped], root: str | None) -> list[str]:
    """Which paths the files name, and the two ways to point them at the serving host's copies."""
    named: dict[str, str] = {}
    for s in shipped.values():
        if s.fmt == "hf":  # HF's file names no model: the models are given in code
            continue
        target, draft = file_paths(s.result)
        named.setdefault(f"target `{s.result.target}`", target)
        if draft:
            named.setdefault(f"draft `{s.result.candidate.drafter}`", draft)
    if not named:
        return []
    where = (f"under `--model-root {root}`, where the serving host keeps them" if root else
             "as they are on the machine that exported them")
    return ["## Model paths", "", f"The files name the models {where}:", ""] + [
        f"- {what}: `{path}`" for what, path in named.items()] + [
        "", "To serve other copies:", "",
        "- export again with `--model-root DIR` (`specdec-tune export ... --model-root DIR`, or `tune --export OUT "
        "--model-root DIR`): every file, JSON and YAML included, then names `DIR/<folder name>` for each local "
        "model folder (a hub id stays as it is, the server resolves it);",
        "- or, for one launch, set the variables each `launch.sh` reads: `TARGET_MODEL=/srv/models/target "
        "DRAFT_MODEL=/srv/models/draft sh vllm/launch.sh`. vLLM's script places `DRAFT_MODEL` inside its inline "
        "JSON (a path without `\"` or `\\`); TensorRT-LLM's serves a copy of its YAML that names `DRAFT_MODEL`. "
        "The JSON, YAML and flag files keep the paths above.",
        "- llama.cpp reads `target.gguf` and `draft.gguf` beside its flags: copy the `llamacpp` folder as a whole.",
        ""]


def render_readme(r: TuningResult, shipped: dict[str, Shipped], skipped: dict[str, str],
                  model_root: str | None = None) -> str:
    """The README text for the formats ``shipped`` (:func:`~._exports.ship_all`: each format's files and
    the result they were built from) and those ``skipped``. Each server's section renders the result its
    files were built from, so the README and the files state the same configuration."""
    source = f"study `{r.study}`" if r.study else (f"profile run {r.run_id}" if r.run_id is not None else "–")
    out = ["# Speculative decoding configuration (specdec-tune)", "",
           f"Tuned for server `{r.server}` from {source}. The overall winner is below; each server's file "
           "carries the configuration its own section names, measured on held-out prompts where it says so.", "",
           "## Configuration", ""]
    out += _config_lines(relocated(r, model_root), batch_ranges(r))  # the paths the files name
    out += ["", *_objective_lines(r), "## Numbers", ""] + _numbers(r)
    out += ["", "## Where it was tuned", "",
            f"- hardware: {r.hardware or '–'}",
            f"- target: `{r.target}`" + (f" (path `{r.target_path}`)" if r.target_path else ""),
            f"- draft: `{r.candidate.drafter}`",
            f"- workload: `{r.workload}`", ""]
    out += ["## What each server can run", ""] + _servers_table(r, shipped) + [""] + _model_paths(shipped, model_root)
    out += ["## Files and how to pass them", ""]
    if shipped and all(s.result.candidate.is_plain for s in shipped.values()):
        out += ["Every file carries plain decoding: launch each server without speculative options "
                "(the `launch.sh` files do).", ""]
    for s in shipped.values():
        out += _file_section(s)
    hf = shipped.get("hf")
    if hf is not None and not hf.result.candidate.is_plain and not hf.result.candidate.is_ngram:
        out += ["### What HF does with θ at run time", "",
                f"`assistant_confidence_threshold` = {hf.result.candidate.threshold:g} is always written: transformers' "
                "default is 0.4, so leaving it out would switch a threshold on. HF's rule proposes the token whose "
                "confidence is below θ, then stops drafting (the engine's `before` rule stops before it). "
                "When scikit-learn is installed and θ > 0, transformers re-tunes θ after every verification from an "
                "ROC curve of draft confidence against acceptance (cost = FPR + 3·FNR), so the exported θ is only "
                "its starting value; with θ = 0 or without scikit-learn θ stays as written.", ""]
    if skipped:
        out += ["## Formats not written", ""] + [f"- {f}: {why}" for f, why in skipped.items()] + [""]
    return "\n".join(out)
