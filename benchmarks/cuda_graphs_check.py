"""CUDA graphs against the eager lean forward on one GPU, in one process, interleaved (about a minute).

    python benchmarks/cuda_graphs_check.py --out "$OUT/cuda_graphs"

Measures, for the bundled pair in bf16 (and fp32 for the equality check):
- T_v(k) of mini-target for k = 1, 5, 9 and T_s of mini-draft-1l at a 128-token context, graphed and eager
  (the profile's micro-benchmark, CUDA events; median and p10-p90 of 50 repeats);
- tokens/s of plain decoding and of speculative decoding (N = 4 and 8), graphed and eager, over 8
  workload prompts × 64 tokens, passes interleaved (3 repeats), with 95 % CIs and the paired ratios;
- greedy outputs of graphed and eager decoding in fp32 on the same prompts: identical (the contract);
- the graphs captured and whether any capture failed.
Without CUDA it refuses (engine.cuda_graphs runs its static-cache function on a CPU only in tests).
"""
from __future__ import annotations

import time
from pathlib import Path

import typer

from specdec_tune.cli import _options as opts


def _timings(target, draft, ctx_ids, device) -> dict:
    from specdec_tune.profiler.microbench import cached_cases, run_interleaved

    cases = cached_cases(target.model, "verify", [(128, 1), (128, 5), (128, 9)], source=ctx_ids, device=device)
    cases += cached_cases(draft.model, "draft_step", [(128, 1)], source=ctx_ids, draft="d", device=device)
    out = {}
    for t in run_interleaved(cases, warmup=5, repeats=50, device=device):
        s = t.samples
        out[f"{t.kind}_k{t.k}"] = {"median_ms": round(s.median * 1e3, 4), "p10_ms": round(s.p10 * 1e3, 4),
                                  "p90_ms": round(s.p90 * 1e3, 4)}
    return out


def _decode(pairs: dict, prompts, max_new: int, repeats: int, ns: tuple[int, ...]) -> dict:
    """tokens/s (95 % CI) per (mode, method), every pass interleaving all of them; outputs of pass 0."""
    from specdec_tune.engine import DecodeConfig
    from specdec_tune.profiler.runs import DraftSpec, decode_once
    from specdec_tune.profiler.timers import synchronize
    from specdec_tune.core.stats import RateSamples, bounds, tokens_per_s_ci

    methods = [("plain", 0)] + [(f"N={n}", n) for n in ns]
    keys = [(m, name, n) for m in pairs for name, n in methods]
    raw = {(m, name): [[[], []] for _ in prompts] for m, name, _ in keys}  # [prompt] -> [tokens], [seconds]
    outputs: dict = {}
    for r in range(repeats + 1):  # pass 0 captures every graph and gives the outputs; not timed
        for mode, name, n in keys:
            tgt, drf = pairs[mode]
            cfg = DecodeConfig(max_new_tokens=max_new, num_speculative_tokens=max(n, 1), eos_token_id=None)
            spec = DraftSpec("none") if n == 0 else DraftSpec("model", drf)
            for i, ids in enumerate(prompts):
                synchronize(tgt.device)
                start = time.perf_counter()
                res = decode_once(tgt, spec, ids, cfg)
                synchronize(tgt.device)
                if r:
                    raw[(mode, name)][i][0].append(len(res.token_ids))
                    raw[(mode, name)][i][1].append(time.perf_counter() - start)
                else:
                    outputs.setdefault((mode, name), {})[i] = res.token_ids
    result = {}
    if repeats:
        for (mode, name), per in raw.items():
            samples = RateSamples(tuple(str(i) for i in range(len(per))), tuple(tuple(t) for t, _ in per),
                                  tuple(tuple(s) for _, s in per))
            rate = sum(map(sum, (t for t, _ in per))) / sum(map(sum, (s for _, s in per)))
            low, high = bounds(tokens_per_s_ci(samples))
            result[f"graphs {mode} {name}"] = {"tokens_per_s": round(rate, 1), "ci95": [round(low, 1), round(high, 1)]}
        for mode in pairs:
            plain = result[f"graphs {mode} plain"]["tokens_per_s"]
            for name, _ in methods[1:]:
                result[f"graphs {mode} {name}"]["speedup_over_plain"] = round(
                    result[f"graphs {mode} {name}"]["tokens_per_s"] / plain, 3)
    return {"tokens_per_s": result, "outputs": outputs}


def main(
    out: str = typer.Option("cuda_graphs_check", "--out", help="Folder for the JSON result."),
    prompts: int = typer.Option(8, "--prompts", help="Workload prompts decoded per pass."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens"),
    repeats: int = typer.Option(3, "--repeats", help="Timed passes (interleaved) after one warm-up pass."),
    dry_run: bool = typer.Option(False, "--dry-run", help="CPU, graphs off both ways: checks the script only."),
    dtypes: str = typer.Option("bf16,fp32", "--dtypes", help="bf16: timings and tokens/s; fp32: output equality."),
) -> None:
    import json

    import torch

    from specdec_tune.engine import load_model
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.runs import encode_prompt

    if not torch.cuda.is_available() and not dry_run:
        raise SystemExit("cuda_graphs_check needs a CUDA GPU (or --dry-run)")
    device = torch.device("cpu" if dry_run else "cuda")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    report: dict = {"label": "measured", "gpu": None if dry_run else torch.cuda.get_device_name(0),
                    "torch": torch.__version__, "dry_run": dry_run}
    for dtype in dtypes.split(","):
        how = (device.type, dtype, "lean")
        pairs = {mode: (load_model("mini-target", *how, "off" if dry_run else mode),
                        load_model("mini-draft-1l", *how, "off" if dry_run else mode)) for mode in ("on", "off")}
        tgt = pairs["on"][0]
        ids = [encode_prompt(tgt, p.prompt, p.id) for p in load_workload("functions")[:prompts]]
        with torch.inference_mode():
            part: dict = {}
            if dtype == "bf16":
                ctx = torch.cat(ids)
                part["forward_ms"] = {mode: _timings(t, d, ctx, device) for mode, (t, d) in pairs.items()}
            dec = _decode(pairs, ids, max_new_tokens, repeats if dtype == "bf16" else 0, (4, 8))
        outs = dec.pop("outputs")
        part["identical_outputs_graphs_vs_eager"] = {name: outs[("on", name)] == outs[("off", name)]
                                                     for name in ("plain", "N=4", "N=8")}
        if dtype == "bf16":
            part.update(dec)
        part["graphs"] = {name: {"captured": getattr(m.model.cuda_graph_runner, "captured", 0), "state": m.cuda_graphs}
                          for name, m in (("target", pairs["on"][0]), ("draft", pairs["on"][1]))}
        report[dtype] = part
        print(json.dumps({dtype: part}, indent=1, default=str), flush=True)
    (folder / "cuda_graphs_check.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    opts.run_script(main)
