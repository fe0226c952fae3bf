"""``bench --batch-sizes``: our baseline and our speculative engine at batch sizes B > 1 (the batched engine).

The bench's prompts are cut into consecutive batches of B (the partial rest is not decoded); each batch is
one timed call of the batched engine, plain and speculative taking turns batch by batch after a warm-up,
as ``profiler.bench`` interleaves its methods prompt by prompt at B = 1. Tokens/s = the batches' new tokens
over their wall seconds; the speedup's 95% CI is the paired bootstrap over batches. Every prompt's greedy
output, plain and speculative, is judged against its own plain decode at batch size 1 by the consistency
rule (float32: identical), so a batch that changed a sequence's tokens is caught, not hidden in a rate.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec_tune.core.consistency import Consistency, overall
from specdec_tune.core.stats import speedup_ci
from specdec_tune.engine import DecodeConfig, LoadedModel
from specdec_tune.profiler.batch_measure import batches_of
from specdec_tune.profiler.batch_runs import measure_batch, warm_up_batch
from specdec_tune.profiler.bench import MethodResult
from specdec_tune.profiler.logit_margins import check_outputs
from specdec_tune.profiler.runs import DraftSpec, decode_once

METHODS = ("ours_baseline", "ours_speculative")


@dataclass
class BatchBench:
    """Our two methods measured at one batch size B > 1 (rows of the results are batches)."""

    batch_size: int
    batches: list[list[int]]
    methods: dict[str, MethodResult]
    consistency: dict[tuple[int, str], Consistency]

    def to_json(self) -> dict:
        ci = speedup_ci(self.methods["ours_speculative"].samples(), self.methods["ours_baseline"].samples())
        base, spec = (self.methods[m] for m in METHODS)
        parted = sorted({i for (i, _), c in self.consistency.items() if c.status != "identical"})
        return {"batch_size": self.batch_size, "batches": self.batches,
                "tokens_per_s": {k: v.tokens_per_s for k, v in self.methods.items()},
                "new_tokens": {k: v.new_tokens for k, v in self.methods.items()},
                "seconds": {k: v.seconds for k, v in self.methods.items()},
                "speedup": spec.tokens_per_s / base.tokens_per_s if base.tokens_per_s else None,
                "speedup_ci95": None if ci is None else list(ci), "ci_unit": "batch",
                "consistency": {"verdict": overall([c.status for c in self.consistency.values()]),
                                "reference": "each prompt's plain decode at batch size 1", "prompts_parted": parted},
                "label": "measured"}


def run_bench_batches(target: LoadedModel, draft: LoadedModel, prompts: Sequence[torch.Tensor], batch_sizes: Sequence[int],
                      *, num_speculative_tokens: int, max_new_tokens: int, repeats: int = 1,
                      progress: Callable[[str], None] | None = None) -> list[BatchBench]:
    """Time our baseline and speculative engine at every batch size in ``batch_sizes`` (each > 1)."""
    plain = DecodeConfig(max_new_tokens, eos_token_id=target.eos_token_id)
    config = DecodeConfig(max_new_tokens, num_speculative_tokens=num_speculative_tokens, eos_token_id=target.eos_token_id)
    specs = {"ours_baseline": (DraftSpec("none"), plain), "ours_speculative": (DraftSpec("model", draft), config)}
    reference = [decode_once(target, DraftSpec("none"), ids, plain).token_ids for ids in prompts]
    out = []
    for b in batch_sizes:
        batches = batches_of(len(prompts), b)
        results = {m: MethodResult(m) for m in METHODS}
        outputs: dict[str, dict[int, list[int]]] = {m: {} for m in METHODS}
        for m, (spec, decode) in specs.items():
            warm_up_batch(target, spec, [prompts[i] for i in batches[0]], decode)
        for r in range(repeats):
            for g, batch in enumerate(batches):
                for m in (METHODS if (r + g) % 2 == 0 else METHODS[::-1]):
                    spec, decode = specs[m]
                    got = measure_batch(target, spec, [prompts[i] for i in batch], decode)
                    results[m].add(g, [t for res in got.results for t in res.token_ids], got.seconds)
                    for i, res in zip(batch, got.results):
                        outputs[m].setdefault(i, res.token_ids)
                if progress is not None:
                    progress(f"B={b}: repeat {r + 1}/{repeats}, batch {g + 1}/{len(batches)}")
        judged = {(i, m): check_outputs(target, prompts[i], reference[i], outputs[m][i])
                  for m in METHODS for i in sorted(outputs[m])}
        out.append(BatchBench(b, batches, results, judged))
    return out
