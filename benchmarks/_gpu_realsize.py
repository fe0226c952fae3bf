"""The real-size stage of ``benchmarks/gpu_check.py`` (issue 37, item 5): a ``shape:`` pair with synthetic
acceptance, profiled at several batch sizes, predicted at each, measured at B = 1 against its prediction,
and plain decoding's memory-bandwidth utilisation at B = 1 (``core.bandwidth``).

    python benchmarks/_gpu_realsize.py --target shape:llama-3.1-8b --draft shape:llama-3.2-1b \\
        --alphas 0.6,0.8 --batch-sizes 1,4,16,64 --out DIR [--dry-run]

Per α: ``profile`` (the project's ``run_profile``; the first α at every batch size, later ones at B = 1 only:
the micro-benchmarks do not depend on α, the traces and the measured passes do), ``predict --batch-sizes``
of the first run at this α (the best N and its tokens/s at each B), ``measure`` (``measure_predicted``: plain
decoding and each N, interleaved, held-out prompts) at B = 1. Numbers go to ``DIR/events.jsonl`` as they come
and the stage's result to ``DIR/realsize_<pair>.json``; the database is ``DIR/realsize.db``.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu_log import device_and_dtype, emit, write_json  # noqa: E402  (benchmarks/ is this script's folder)

ROOT = Path(__file__).resolve().parents[1]


def model_bytes(shape: str, dtype: str) -> dict:
    """Weight bytes a step reads (and gpt-fast's count) and key/value bytes per position of a ``shape:``
    model in ``dtype``, from its published config on the meta device (nothing allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdec_tune.core import bandwidth as bw
    from specdec_tune.engine import get_shape

    config = AutoConfig.from_pretrained(get_shape(shape.removeprefix("shape:")).folder)
    torch_dtype = getattr(torch, dtype)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config).to(torch_dtype)
    size = torch.empty((), dtype=torch_dtype).element_size()
    return {"weights_read": bw.weight_bytes(model), "weights_all": bw.weight_bytes(model, whole_embedding=True),
            "kv_per_position": bw.kv_bytes_of(config, size)}


def plain_mbu(plain, sizes: dict, device_name: str | None, max_new: int) -> dict:
    """Plain decoding's MBU at B = 1 from its measurement (decode-only tokens/s: the prefill left out)."""
    from specdec_tune.core import bandwidth as bw

    card = bw.find_card(device_name or "")
    rate = plain.decode_tokens_per_s or plain.tokens_per_s
    context = bw.mean_context(plain.prompt_tokens or [0], max_new)
    read = bw.bytes_per_token(sizes["weights_read"], sizes["kv_per_position"], context)
    out = {"device": device_name, "card": card.name if card else None, "card_source": card.source if card else None,
           "card_bytes_per_s": card.bytes_per_s if card else None, "decode_tokens_per_s": rate,
           "decode_only": plain.decode_tokens_per_s is not None, "mean_context": context, "bytes_per_token": read,
           "achieved_bytes_per_s": read * rate, "anchor": bw.GPT_FAST_A100, "label": "measured"}
    if card:
        out["mbu"] = bw.mbu(read, rate, card.bytes_per_s)
        out["mbu_gpt_fast_convention"] = bw.mbu(sizes["weights_all"], rate, card.bytes_per_s)
    return out


def _predict(db: str, run: int, alpha: float, sizes: str) -> dict | None:
    """``predict --batch-sizes`` (the CLI, its JSON) of run ``run`` as if accepted at ``alpha``."""
    done = subprocess.run([sys.executable, "-m", "specdec_tune.cli", "predict", "--run", str(run), "--db", db,
                           "--batch-sizes", sizes, "--synthetic-acceptance", str(alpha), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-2000:]}


def _profile(db, target: str, draft: str, alpha: float, batch_sizes: tuple[int, ...], a: dict) -> int:
    from specdec_tune.profiler import ProfileSettings, StageLog, run_profile

    ns = a["ns"]
    settings = ProfileSettings(
        device=a["device"], dtype=a["dtype"], synthetic_acceptance=(alpha,), n_max=max(ns), k_max=max(ns) + 1,
        repeats=a["repeats"], warmup=2, max_prompts=a["prompts"], max_new_tokens=a["max_new"], context_lens=(128,),
        prefill_repeats=2, overhead_prompts=2, overhead_ns=tuple(ns[:-1]) or (1,), batch_sizes=batch_sizes,
        threshold_prompts=2, hook_tax_prompts=1, front_prompts=0, split="tune",
        threads=1 if a["device"] == "cpu" else None)
    return run_profile(db, target, [draft], "functions", settings, StageLog()).run_id


def _measure(db, run: int, a: dict) -> list:
    from specdec_tune.profiler import StageLog
    from specdec_tune.tuner.model import SpecConfig
    from specdec_tune.tuner.search import measure_predicted

    items = [(None, SpecConfig(n)) for n in a["ns"]] + [("none", SpecConfig(0))]
    return measure_predicted(db, run, items, split="holdout", max_prompts=a["prompts"], repeats=a["measure_repeats"],
                             progress=StageLog(), threads=1 if a["device"] == "cpu" else None)


def _rows(got: list) -> list[dict]:
    from specdec_tune.core.stats import bounds, speedup_estimate

    plain = got[-1].measurement
    rows = []
    for v in got:
        m, p = v.measurement, v.prediction
        est = speedup_estimate(m, plain) if v is not got[-1] else None
        rows.append({"N": v.config.spec.num_speculative_tokens, "measured_tokens_per_s": m.tokens_per_s,
                     "measured_ci95": list(m.ci95) if m.ci95 else None,
                     "predicted_tokens_per_s": p.tokens_per_s if p else None, "error": v.relative_error,
                     "measured_speedup": est.value if est else None,
                     "measured_speedup_ci95": list(bounds(est.ci)) if est and est.ci else None,
                     "predicted_speedup": p.speedup if p else None, "tau_measured": m.mean_tokens_per_cycle,
                     "tau_predicted": p.expected_tokens_per_cycle if p else None,
                     "per_repeat_tokens_per_s": m.per_repeat_tokens_per_s, "timed_regions": m.timed_regions,
                     "label": "measured vs predicted, synthetic acceptance"})
    return rows


def main(
    target: str = typer.Option("shape:llama-3.1-8b", "--target"),
    draft: str = typer.Option("shape:llama-3.2-1b", "--draft"),
    alphas: str = typer.Option("0.6,0.8", "--alphas", help="Synthetic acceptance rates, one profile each."),
    batch_sizes: str = typer.Option("1,4,16,64", "--batch-sizes", help="Batch sizes the first profile times."),
    ns: str = typer.Option("1,2,3,4", "--ns", help="N values measured at B = 1 (the largest is the profile's N_max)."),
    prompts: int = typer.Option(4, "--prompts", help="Prompts profiled, and held-out prompts measured."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens"),
    repeats: int = typer.Option(7, "--repeats", help="Micro-benchmark repeats."),
    measure_repeats: int = typer.Option(3, "--measure-repeats", help="Interleaved measured passes."),
    out: Path = typer.Option(..., "--out"),
    dry_run: bool = typer.Option(False, "--dry-run", help="CPU, float32 (give small shapes)."),
    name: str = typer.Option("", "--name", help="The result's name: realsize_<name>.json (default: the pair)."),
) -> None:
    from specdec_tune.db import open_database

    device, dtype = device_and_dtype(dry_run)
    out.mkdir(parents=True, exist_ok=True)
    pair = f"{target.removeprefix('shape:')}+{draft.removeprefix('shape:')}"
    a = {"device": device, "dtype": dtype, "ns": [int(n) for n in ns.split(",")], "prompts": prompts,
         "max_new": max_new_tokens, "repeats": repeats, "measure_repeats": measure_repeats}
    url = f"sqlite:///{out / 'realsize.db'}"
    db = open_database(url)
    card = _device_name(device)
    result: dict = {"target": target, "draft": draft, "device": card, "dtype": dtype, "batch_sizes": batch_sizes,
                    "sizes": model_bytes(target, dtype), "per_alpha": {}}
    stem = out / f"realsize_{name or pair}.json"
    first = None
    for i, alpha in enumerate(float(x) for x in alphas.split(",")):
        sizes = tuple(int(b) for b in batch_sizes.split(",")) if i == 0 else (1,)
        run = _profile(db, target, draft, alpha, sizes, a)
        _free()
        first = first or run
        part = result["per_alpha"][str(alpha)] = {"run_id": run, "profiled_batch_sizes": list(sizes)}
        emit(out, "realsize", "profile", pair=pair, alpha=alpha, run_id=run, batch_sizes=list(sizes))
        part["predicted_per_batch_size"] = _predict(url, first, alpha, batch_sizes)
        emit(out, "realsize", "predict", pair=pair, alpha=alpha, per_batch_size=part["predicted_per_batch_size"])
        got = _measure(db, run, a)
        _free()
        part["measured_b1"] = [emit(out, "realsize", "measure", pair=pair, alpha=alpha, **r) for r in _rows(got)]
        part["plain_mbu_b1"] = emit(out, "realsize", "mbu", pair=pair, alpha=alpha,
                                    **plain_mbu(got[-1].measurement, result["sizes"], card, max_new_tokens))
        write_json(stem, result)


def _free() -> None:
    """Give the last step's models back: the next shape's memory check (``engine.shapes.check_fits``) reads the
    GPU's free memory, which the caching allocator's idle blocks would otherwise hold."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _device_name(device: str) -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else None


if __name__ == "__main__":
    typer.run(main)
