"""``specdec-tune bench``: our engine against HF generate and HF assisted generation, greedy."""
from __future__ import annotations

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from specdec_tune.engine import check_compatible, load_model
from specdec_tune.engine.workloads import load_workload
from specdec_tune.errors import InputError
from specdec_tune.profiler.bench import METHODS, run_bench
from specdec_tune.profiler.runs import encode_prompt
from specdec_tune.cli import _checks as chk
from specdec_tune.cli._app import app, print_json, quiet_loading
from specdec_tune.cli._options import ForwardOption

_LABELS = {
    "hf_generate": "(a) HF generate, target only",
    "hf_assisted": "(b) HF assisted generation",
    "ours_baseline": "(c) specdec-tune baseline",
    "ours_speculative": "(d) specdec-tune speculative",
}


@app.command()
def bench(
    target: str = typer.Option(..., "--target", help="Target model: bundled name, local folder or hub id."),
    draft: str = typer.Option(..., "--draft", help="Draft model sharing the target's tokenizer."),
    num_speculative_tokens: int = typer.Option(4, "--num-speculative-tokens", "-N", help="N for both HF assisted and ours (constant schedule)."),
    workload: str = typer.Option("functions", "--workload", help="Bundled workload name or a JSONL file of prompts."),
    max_prompts: int = typer.Option(8, "--max-prompts", help="Use the first P prompts of the workload."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="New tokens per prompt."),
    repeats: int = typer.Option(1, "--repeats", help="Times each prompt is run per method (totals are summed)."),
    compare: str = typer.Option("hf", "--compare", help="'hf' runs all four methods; 'none' only ours (c, d)."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
    dtype: str = typer.Option("auto", "--dtype", help="auto | float32 | bfloat16 | float16"),
    forward: ForwardOption = "auto",
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Greedy tokens/s of (a) HF generate, (b) HF assisted generation, (c) our baseline and (d) our
    speculative engine on the same prompts, their ratios, and whether all outputs are identical."""
    chk.check_num_speculative_tokens(num_speculative_tokens)
    chk.check_max_new_tokens(max_new_tokens)
    if max_prompts < 1 or repeats < 1:
        raise InputError(f"--max-prompts and --repeats must be >= 1, got {max_prompts} and {repeats}")
    if compare not in ("hf", "none"):
        raise InputError(f"--compare must be 'hf' or 'none', got {compare!r}")
    prompts = load_workload(workload)[:max_prompts]
    quiet_loading()
    tgt = load_model(target, device, dtype, forward)
    drf = load_model(draft, device, dtype, forward)
    check_compatible(tgt, drf)
    ids = [encode_prompt(tgt, p.prompt, p.id) for p in prompts]
    methods = METHODS if compare == "hf" else METHODS[2:]
    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=json_out) as bar:
        task = bar.add_task("bench", total=len(ids) * repeats)
        result = run_bench(tgt, drf, ids, num_speculative_tokens=num_speculative_tokens, max_new_tokens=max_new_tokens,
                           repeats=repeats, methods=methods, progress=lambda _: bar.advance(task))
    if json_out:
        print_json({**result.to_json(), "target": target, "draft": draft, "workload": workload,
                    "device": str(tgt.device), "dtype": str(tgt.dtype).replace("torch.", ""),
                    "forward": {"target": tgt.forward, "draft": drf.forward}})
        return
    table = Table(title=f"measured, greedy, N = {num_speculative_tokens}, {len(ids)} prompts × {max_new_tokens} new tokens × {repeats}, "
                        f"our forward: {tgt.forward} (target), {drf.forward} (draft)")
    table.add_column("method")
    table.add_column("tokens/s (measured)", justify="right")
    table.add_column("new tokens", justify="right")
    table.add_column("seconds", justify="right")
    for name, res in result.methods.items():
        table.add_row(_LABELS[name], f"{res.tokens_per_s:.1f}", str(res.new_tokens), f"{res.seconds:.2f}")
    out = Console()
    out.print(table)
    for label, (a, b) in {"(d)/(b) ours speculative vs HF assisted": ("ours_speculative", "hf_assisted"),
                          "(c)/(a) ours baseline vs HF generate": ("ours_baseline", "hf_generate"),
                          "(d)/(c) speculative speedup (ours)": ("ours_speculative", "ours_baseline"),
                          "(b)/(a) speculative speedup (HF)": ("hf_assisted", "hf_generate")}.items():
        if a in result.methods and b in result.methods:
            out.print(f"{label}: {result.ratio(a, b):.2f}x")
    if compare == "hf":
        verdict = "identical" if result.identical else f"DIFFER at {result.mismatches[:5]}"
        out.print(f"greedy outputs of the four methods: {verdict}")
    else:
        out.print(f"greedy outputs of (c) and (d): {'identical' if result.identical else 'DIFFER'}")
