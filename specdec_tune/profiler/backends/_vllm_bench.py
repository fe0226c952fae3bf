"""Several vLLM engines kept running together, one per configuration (``bench --compare vllm``: a
plain and a speculative one; ``measure --backend vllm`` would hold one per configuration).

One worker process per engine (vLLM's counters are per process), so calls can be interleaved prompt
by prompt with each other and with our engine. An idle vLLM engine waits on its input queue (checked:
no CPU time while idle), so the engines not being timed do not run beside the one that is.
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from specdec_tune.profiler.backends._vllm import SpecCounters, VllmOutput, VllmWorker, omp_bind_env


class VllmEngines:
    """vLLM engines of one target, one per named configuration, started once, timed per call.

    Args:
        python: the vLLM venv's Python.
        target: the target model's folder (vLLM loads it itself).
        configs: name -> ``--speculative-config`` dict (e.g. the tuner's vLLM export), ``None`` = plain.
        threads: OpenMP threads for vLLM's model runner (``VLLM_CPU_OMP_THREADS_BIND=0-<threads-1>``
            unless that variable is set): the same number our engine uses makes the comparison fair.
        dtype, max_model_len, enforce_eager, max_num_seqs: passed to ``LLM(...)``.
    """

    def __init__(self, python: str | os.PathLike, target: str, configs: dict[str, dict[str, Any] | None], *,
                 threads: int = 1, dtype: str = "float32", max_model_len: int = 1024, enforce_eager: bool = False,
                 max_num_seqs: int = 1) -> None:
        self.configs = dict(configs)
        env = omp_bind_env(threads)
        self.threads_bind = env.get("VLLM_CPU_OMP_THREADS_BIND", os.environ.get("VLLM_CPU_OMP_THREADS_BIND"))
        self.workers: dict[str, VllmWorker] = {}
        self.start_seconds: dict[str, float] = {}
        try:
            for name, cfg in self.configs.items():
                w = VllmWorker(python, env=env)
                self.workers[name] = w
                self.start_seconds[name] = w.start(str(Path(target)), cfg, dtype=dtype, max_model_len=max_model_len,
                                                   max_num_seqs=max_num_seqs, enforce_eager=enforce_eager)
                w.pause()  # an idle engine still polls (VllmWorker.pause): frozen except in its own run()
        except BaseException:
            self.close()
            raise
        self.enforce_eager = enforce_eager
        self.reset_counts()

    def reset_counts(self) -> None:
        """Forget counters, latencies and outputs so far (the warm-up's)."""
        self.counters: dict[str, SpecCounters | None] = {k: None for k in self.configs}
        self.ttft: dict[str, list[float]] = {k: [] for k in self.configs}
        self.itl: dict[str, list[float]] = {k: [] for k in self.configs}
        self.outputs: dict[str, list[VllmOutput]] = {k: [] for k in self.configs}

    def run(self, name: str, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
        """One prompt, batch 1: (new token ids, seconds of the ``generate`` call in the worker).
        The request's record (TTFT, per-step acceptance) is kept in ``outputs[name]``."""
        with self.workers[name].awake() as worker:
            res = worker.generate([prompt], max_tokens)
        out = res.outputs[0]
        self.outputs[name].append(out)
        if out.ttft is not None:
            self.ttft[name].append(out.ttft)
        if out.itl_mean is not None:
            self.itl[name].append(out.itl_mean)
        if res.counters is not None:
            prev = self.counters[name]
            self.counters[name] = res.counters if prev is None else prev + res.counters
        return out.token_ids, res.seconds

    @property
    def versions(self) -> dict[str, Any]:
        return next(iter(self.workers.values())).versions if self.workers else {}

    def summary(self) -> dict[str, Any]:
        """Versions, start cost, median latencies and the measured calls' counters, for the report."""
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        return {
            "versions": self.versions,
            "configs": self.configs,
            "start_seconds": self.start_seconds,
            "enforce_eager": self.enforce_eager,
            "prefix_caching": False,
            "omp_threads_bind": self.threads_bind,
            "ttft_median_s": {k: med(v) for k, v in self.ttft.items()},
            "itl_median_s": {k: med(v) for k, v in self.itl.items()},
            "counters": {k: c.to_json() for k, c in self.counters.items() if c is not None},
        }

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers = {}

    def __enter__(self) -> VllmEngines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class VllmPair(VllmEngines):
    """vLLM's plain (``"plain"``) and speculative (``"speculative"``) decoding: bench's vLLM side."""

    def __init__(self, python: str | os.PathLike, target: str, speculative_config: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(python, target, {"plain": None, "speculative": speculative_config}, **kwargs)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["speculative_config"] = self.configs["speculative"]
        out["counters"] = out["counters"].get("speculative")
        return out
