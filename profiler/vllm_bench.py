"""vLLM's side of ``bench --compare vllm``: a plain and a speculative engine, kept running together.

Two worker processes (one engine each: vLLM's counters are per process) so that bench can interleave
vLLM's plain and speculative decoding with ours prompt by prompt. An idle vLLM engine waits on its
input queue, so the engine not being timed does not run beside the one that is.
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from specdec_tune.profiler.vllm_backend import SpecCounters, VllmWorker

KINDS = ("plain", "speculative")


class VllmPair:
    """vLLM's plain and speculative decoding of one target, started once, timed per call.

    Args:
        python: the vLLM venv's Python.
        target: the target model's folder (vLLM loads it itself).
        speculative_config: the ``--speculative-config`` dict (e.g. the tuner's vLLM export).
        threads: OpenMP threads for vLLM's model runner (``VLLM_CPU_OMP_THREADS_BIND=0-<threads-1>``
            unless that variable is set): the same number our engine uses makes the comparison fair.
        dtype, max_model_len, enforce_eager: passed to ``LLM(...)``.
    """

    def __init__(self, python: str | os.PathLike, target: str, speculative_config: dict[str, Any], *, threads: int = 1,
                 dtype: str = "float32", max_model_len: int = 1024, enforce_eager: bool = False) -> None:
        self.speculative_config = speculative_config
        env = {}
        if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads <= 1 else f"0-{threads - 1}"
        self.threads_bind = env.get("VLLM_CPU_OMP_THREADS_BIND", os.environ.get("VLLM_CPU_OMP_THREADS_BIND"))
        self.workers: dict[str, VllmWorker] = {}
        self.start_seconds: dict[str, float] = {}
        try:
            for kind in KINDS:
                w = VllmWorker(python, env=env)
                self.workers[kind] = w
                cfg = speculative_config if kind == "speculative" else None
                self.start_seconds[kind] = w.start(str(Path(target)), cfg, dtype=dtype, max_model_len=max_model_len,
                                                   max_num_seqs=1, enforce_eager=enforce_eager)
        except BaseException:
            self.close()
            raise
        self.enforce_eager = enforce_eager
        self.reset_counts()

    def reset_counts(self) -> None:
        """Forget counters and latencies so far (the warm-up's)."""
        self.counters: SpecCounters | None = None
        self.ttft: dict[str, list[float]] = {k: [] for k in KINDS}
        self.itl: dict[str, list[float]] = {k: [] for k in KINDS}

    def run(self, kind: str, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
        """One prompt, batch 1: (new token ids, seconds of the ``generate`` call in the worker)."""
        res = self.workers[kind].generate([prompt], max_tokens)
        out = res.outputs[0]
        if out.ttft is not None:
            self.ttft[kind].append(out.ttft)
        if out.itl_mean is not None:
            self.itl[kind].append(out.itl_mean)
        if kind == "speculative" and res.counters is not None:
            self.counters = res.counters if self.counters is None else self.counters + res.counters
        return out.token_ids, res.seconds

    def summary(self) -> dict[str, Any]:
        """Versions, start cost, median latencies and the measured calls' counters, for the report."""
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        w = self.workers.get("plain")
        return {
            "versions": w.versions if w else {},
            "speculative_config": self.speculative_config,
            "start_seconds": self.start_seconds,
            "enforce_eager": self.enforce_eager,
            "omp_threads_bind": self.threads_bind,
            "ttft_median_s": {k: med(v) for k, v in self.ttft.items()},
            "itl_median_s": {k: med(v) for k, v in self.itl.items()},
            "counters": self.counters.to_json() if self.counters else None,
        }

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers = {}

    def __enter__(self) -> VllmPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
