"""A machine-speed reference for regression runs: a fixed workload the code under test cannot touch.

A nightly runner's speed wanders: other jobs on the host, clocks, thermal limits, a neighbour on the
other core competing for cache and memory bandwidth. Absolute tokens/s and latency move with it, so
a comparison of two nights' absolute speed flags the machine, not the code (docs/results.md,
Regression: noise and power).

The probe is a synthetic decoder step built only from torch operators with fixed, seeded weights:
per layer an RMS norm, a fused QKV projection, attention of one query over a fixed 64-token cache,
an output projection and a SiLU-gated MLP; then a vocabulary projection. It has the same operator
mix and roughly the shapes of the bundled target (192 wide, 512 MLP, 16 layers, 4 heads, vocabulary
4096), so it slows down with the machine the way a decode step does, but it runs none of
specdec-tune's engine, drafter or model-loading code and loads no model: a change in our code or in
a model cannot move it. What can move it (torch, threads, device) is in the environment fingerprint,
which already withholds a speed verdict when it changes.

``suite_runs`` times the probe right after each prompt's decodes, in every repeat; the comparison
(``tuner/regress/_compare.py``) divides the machine out of the absolute speed cells.
"""
from __future__ import annotations

import torch

from specdec_tune.profiler.timers import Stopwatch, synchronize

__all__ = ["MachineProbe"]


class MachineProbe:
    """``run()`` times ``steps`` synthetic decoder steps (seconds). Weights are built once, seeded."""

    def __init__(self, device: torch.device | str = "cpu", *, width: int = 192, mlp: int = 512, layers: int = 16,
                 heads: int = 4, cache: int = 64, vocab: int = 4096, steps: int = 4) -> None:
        self.device = torch.device(device)
        self.steps = steps
        self.heads = heads
        g = torch.Generator().manual_seed(1234)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).to(self.device)

        self.layers = [(w(width, 3 * width), w(width, width), w(width, 2 * mlp), w(mlp, width),
                        w(heads, cache, width // heads), w(heads, cache, width // heads)) for _ in range(layers)]
        self.unembed = w(width, vocab)
        self.x0 = w(1, width)

    def _step(self, x: torch.Tensor) -> torch.Tensor:
        h = self.heads
        for qkv_w, o_w, up_w, down_w, k_cache, v_cache in self.layers:
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            q, _k, _v = (y @ qkv_w).chunk(3, dim=-1)
            q = q.view(h, 1, -1)
            att = torch.softmax(q @ k_cache.transpose(1, 2) / q.shape[-1] ** 0.5, dim=-1)
            x = x + (att @ v_cache).reshape(1, -1) @ o_w
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            gate, up = (y @ up_w).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ down_w
        logits = x @ self.unembed
        return x + logits[:, : x.shape[-1]] * 1e-6  # keeps the projection live; values stay bounded

    def run(self) -> float:
        """Seconds for ``steps`` synthetic decoder steps."""
        watch = Stopwatch(self.device)
        synchronize(self.device)
        with torch.inference_mode():
            x = self.x0
            watch.start()
            for _ in range(self.steps):
                x = self._step(x)
            return watch.stop()
