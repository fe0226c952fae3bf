"""The in-process stages of ``benchmarks/gpu_check.py`` (DIAGNOSIS.md §5, steps 1-2), one per call:

    python benchmarks/_gpu_micro.py slots   --out DIR [--dry-run]
    python benchmarks/_gpu_micro.py overlap --out DIR [--dry-run]

``slots``: T_v(k) of the target and the draft's (1, 1) and (2, 1) on 256-, 512- and 1024-position slots at
one context (R4/F9: does the slot length cost?), the time of each first call (the graphs it captured: the
cost of a capture, which §2.1 assumed at 25 ms), and per replay its host time (the call returns once
enqueued) against its GPU time (CUDA events around the call with the stream held busy first, so the host
runs ahead and the events bracket GPU work only): h and g of the overlap model. The graph counters are
snapshotted around the timed repeats (they must not move).

``overlap``: held-out prompts decoded with plain decoding, N = 4 at θ = 0, N = 4 at θ = 1e-9 (drafts exactly
as θ = 0 does, but pays θ's host sync after every draft forward: their difference is θ's cost per draft
forward, nothing else changes), N = 4 at θ = 0.4 and N = 16 at θ = 0. An untimed pass over everything, graphs
prepared, then interleaved repeats unhooked and hooked (the profile's recorder): the hooks' cost per forward.
Every number goes to ``DIR/events.jsonl`` as it is measured and the stage's result to ``DIR/<stage>.json``.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu_log import counters, emit, load_pair, write_json  # noqa: E402  (benchmarks/ is this script's folder)

TARGET, DRAFT = "mini-target", "mini-draft-1l"
CONTEXT = 200
SLOT_MAX_LENS = {256: 256, 512: 300, 1024: 600}  # a cache of max_len positions takes a slot of its length class
VERIFY_KS = (1, 2, 3, 4, 5, 9, 17)


def _timed(fn, setup, repeats: int, device) -> list[float]:
    from specdec_tune.profiler.timers import Stopwatch, synchronize

    out = []
    for _ in range(repeats):
        setup()
        synchronize(device)
        watch = Stopwatch(device)
        watch.start()
        fn()
        out.append(watch.stop())
    return out


def _split(fn, setup, repeats: int, device) -> dict:
    """Host time (enqueue only) and GPU time (events with the stream pre-loaded) of ``fn``, medians in ms."""
    from specdec_tune.profiler.timers import synchronize

    host, gpu = [], []
    for _ in range(repeats):
        setup()
        synchronize(device)
        if device.type == "cuda":
            torch.cuda._sleep(2_000_000)  # ~1 ms of GPU spin: the host enqueues fn's work behind it
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        if device.type == "cuda":
            end.record()
            end.synchronize()
            gpu.append(start.elapsed_time(end) / 1e3)
    med = {"host_ms": statistics.median(host) * 1e3}
    med["gpu_ms"] = statistics.median(gpu) * 1e3 if gpu else None
    return med


def _cache(model, ids, max_len: int):
    """A cache of ``max_len`` positions (a slot of its length class) holding CONTEXT tokens."""
    from specdec_tune.engine import forward_with_cache, make_cache

    cache = make_cache(model, max_len)
    with torch.inference_mode():
        forward_with_cache(model, ids[None, :CONTEXT], cache, logits_to_keep=1)
    return cache


def _case(model, cache, ids, k: int, keep: int):
    """(fn, setup) of a k-token forward keeping ``keep`` logits, the cache rolled back before every call."""
    from specdec_tune.engine import forward_with_cache

    new = ids[None, CONTEXT:CONTEXT + k]

    def fn():
        with torch.inference_mode():
            return forward_with_cache(model, new, cache, logits_to_keep=keep)
    return fn, (lambda: cache.truncate(CONTEXT))


def _row(fn, setup, m, dev, repeats: int) -> dict:
    """One forward shape: its first call (the graphs it made: a capture's cost on CUDA), then timed repeats
    with the graph counters snapshotted around them."""
    made0 = (counters(m)[0] or {}).get("made", 0)
    first = _timed(fn, setup, 1, dev)[0]  # captures this width (and narrower verify widths) on CUDA
    made = (counters(m)[0] or {}).get("made", 0) - made0
    _timed(fn, setup, 2, dev)  # untimed: the replay's own first calls
    before = counters(m)
    samples = sorted(_timed(fn, setup, repeats, dev))
    return {"first_call_ms": first * 1e3, "graphs_made_by_first_call": made,
            "median_ms": statistics.median(samples) * 1e3, "p10_ms": samples[len(samples) // 10] * 1e3,
            "p90_ms": samples[(len(samples) * 9) // 10] * 1e3, "counters_moved_while_timed": counters(m) != before}


def slots(out: Path, dry_run: bool, repeats: int) -> dict:
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.runs import encode_prompt

    tgt, drf = load_pair(TARGET, DRAFT, dry_run)
    dev = tgt.device
    text = " ".join(p.prompt for p in load_workload("functions")[:6])
    ids = encode_prompt(tgt, text, "slots").to(dev)
    result: dict = {"context": CONTEXT, "repeats": repeats, "rows": [], "counters_before": counters(tgt, drf)}
    keep_alive = []  # the caches stay bound to their slots until the stage ends
    for slot, max_len in SLOT_MAX_LENS.items():
        caches = {id(m): _cache(m.model, ids, max_len) for m in (tgt, drf)}
        keep_alive.append(caches)
        cases = [("verify", tgt, k, k) for k in VERIFY_KS] + [("draft_step", drf, 1, 1), ("draft_catch_up", drf, 2, 1)]
        for kind, m, k, keep in cases:
            fn, setup = _case(m.model, caches[id(m)], ids, k, keep)
            result["rows"].append(emit(out, "slots", "forward", **_row(fn, setup, m, dev, repeats),
                                       kind=kind, k=k, keep=keep, slot=slot))
            if slot == 512 and (kind == "verify" and k in (1, 5, 17) or kind == "draft_step"):
                split = _split(fn, setup, repeats, dev)
                result["rows"][-1].update(split)
                emit(out, "slots", "host_vs_gpu", kind=kind, k=k, slot=slot, **split)
    result["counters_after"] = counters(tgt, drf)
    result["captures_while_timed"] = sum(r["counters_moved_while_timed"] for r in result["rows"])
    write_json(out / "slots.json", result)
    return result


DESIGNS = (("plain", 0, 0.0), ("N=4 θ=0", 4, 0.0), ("N=4 θ=1e-9", 4, 1e-9), ("N=4 θ=0.4", 4, 0.4),
           ("N=16 θ=0", 16, 0.0))


def _decoder(tgt, drf, name: str, n: int, theta: float, max_new: int):
    from specdec_tune.core.speculative import SpeculativeConfig
    from specdec_tune.engine import DecodeConfig
    from specdec_tune.profiler.runs import DraftSpec, decode_once

    spec = DraftSpec("none") if n == 0 else DraftSpec("model", drf)
    spec_config = SpeculativeConfig(num_speculative_tokens=max(n, 1), threshold=theta)
    cfg = DecodeConfig(max_new_tokens=max_new, spec=spec_config, eos_token_id=None)
    return lambda ids, on_cycle=None: decode_once(tgt, spec, ids, cfg, seed=0, on_cycle=on_cycle)


def _pass(designs, prompts, dev, recorder=None, models=()) -> dict:
    """One interleaved pass, prompt by prompt: per design, (seconds, hooked forwards, draft forwards) summed."""
    from specdec_tune.profiler.timers import Stopwatch, synchronize

    got = {name: [0.0, 0, 0] for name in designs}
    for ids in prompts:
        for name, run in designs.items():
            synchronize(dev)
            if recorder is None:
                watch = Stopwatch(dev)
                watch.start()
                run(ids)
                got[name][0] += watch.stop()
                continue
            with recorder.attach(*models):
                recorder.begin()
                run(ids, recorder.on_cycle)
                timeline = recorder.finish()
            got[name][0] += timeline.wall_s
            got[name][1] += len(timeline.forwards)
            got[name][2] += sum(f.role == "draft" for f in timeline.forwards)
    return got


def overlap(out: Path, dry_run: bool, repeats: int, prompts: int, max_new: int) -> dict:
    from specdec_tune.core.splits import split_prompts
    from specdec_tune.engine import decode_keys, prepare_graphs
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.clean import quiet_gc
    from specdec_tune.profiler.overhead import ForwardRecorder
    from specdec_tune.profiler.runs import encode_prompt

    tgt, drf = load_pair(TARGET, DRAFT, dry_run)
    dev = tgt.device
    ids = [encode_prompt(tgt, p.prompt, p.id) for p in split_prompts(load_workload("functions"), "holdout")[:prompts]]
    designs = {name: _decoder(tgt, drf, name, n, th, max_new) for name, n, th in DESIGNS}
    _pass(designs, ids, dev)  # untimed: every slot class, graph key and prefill shape
    prepare_graphs(tgt.model, decode_keys(16, False))
    prepare_graphs(drf.model, decode_keys(16, True))
    recorder = ForwardRecorder(dev)
    bare, hooked = {n: [] for n in designs}, {n: [] for n in designs}
    before = counters(tgt, drf)
    with quiet_gc():
        for r in range(repeats):
            for name, v in _pass(designs, ids, dev).items():
                bare[name].append(v[0])
            if r < 2:
                for name, v in _pass(designs, ids, dev, recorder, (tgt.model, drf.model)).items():
                    hooked[name].append(v)
            emit(out, "overlap", "pass", repeat=r, bare_s={n: s[-1] for n, s in bare.items()})
    result = {"prompts": len(ids), "max_new_tokens": max_new, "repeats": repeats, "designs": {},
              "captures_while_timed": counters(tgt, drf) != before}
    for name in designs:
        b = statistics.median(bare[name])
        h = statistics.median(v[0] for v in hooked[name])
        forwards, drafts = hooked[name][0][1], hooked[name][0][2]
        spread = (max(bare[name]) - min(bare[name])) / b if b else None
        result["designs"][name] = emit(out, "overlap", "design", design=name, bare_s=b, hooked_s=h, forwards=forwards,
                                       draft_forwards=drafts, hook_cost_per_forward_ms=(h - b) / max(forwards, 1) * 1e3,
                                       hook_cost_share=h / b - 1, pass_spread=spread, bare_passes_s=bare[name])
    d = result["designs"]
    result["theta_cost_per_draft_forward_ms"] = (d["N=4 θ=1e-9"]["bare_s"] - d["N=4 θ=0"]["bare_s"]) / max(
        d["N=4 θ=0"]["draft_forwards"], 1) * 1e3
    emit(out, "overlap", "theta_cost", ms_per_draft_forward=result["theta_cost_per_draft_forward_ms"])
    write_json(out / "overlap.json", result)
    return result


def main(
    stage: str = typer.Argument(..., help="slots | overlap"),
    out: Path = typer.Option(..., "--out", help="The check's output folder."),
    dry_run: bool = typer.Option(False, "--dry-run", help="CPU, float32, the graph runner's stand-in."),
    repeats: int = typer.Option(30, "--repeats", help="Timed repeats (slots) or interleaved passes (overlap)."),
    prompts: int = typer.Option(4, "--prompts", help="overlap: held-out prompts."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="overlap: tokens per decode."),
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if stage == "slots":
        slots(out, dry_run, repeats)
    elif stage == "overlap":
        overlap(out, dry_run, repeats, prompts, max_new_tokens)
    else:
        raise typer.BadParameter(f"stage must be slots or overlap, got {stage!r}")


if __name__ == "__main__":
    typer.run(main)
