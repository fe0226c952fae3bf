"""Head-to-head benchmark: HF ``generate`` (target only), HF assisted generation, our baseline and our
speculative engine, greedy, on the same prompts in one process; optionally vLLM's plain and
speculative decoding (two engines in the vLLM venv, see :class:`VllmPair`), interleaved with them.

Fairness rules: every method is warmed up first (with CUDA graphs on every prompt, and every graph our
engine can replay made: ``profiler.measure_passes``); methods are interleaved prompt by prompt (so slow
drift of the machine hits all four alike); each timed call is one whole generation, prefill
included, measured with one synchronisation at its end, checked for a graph capture or new KV slot
inside (re-run when one happened, ``profiler.clean``) with the garbage collector off; tokens/s = new
tokens / seconds summed over prompts. HF assisted generation is configured through the *assistant's*
``generation_config`` (``num_assistant_tokens``, ``num_assistant_tokens_schedule="constant"``,
``assistant_confidence_threshold=0``), which is where transformers 5 reads them.

vLLM: each call is one ``LLM.generate`` of one prompt (batch 1), timed inside the worker process
around that call (what an in-process vLLM user waits for; the JSON round trip is not counted). Our
torch threads and vLLM's OpenMP threads are made equal (``VLLM_CPU_OMP_THREADS_BIND`` = cores
0..threads-1 unless set); vLLM's scheduler and front end run in processes of their own beside them.
Every ratio comes with a paired bootstrap 95% CI over prompts and repeats (specdec_tune.core.stats).
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from specdec_tune.core.consistency import Consistency, overall
from specdec_tune.engine import DecodeConfig, LoadedModel, decode_keys, prepare_graphs
from specdec_tune.profiler.clean import TimedRegions, quiet_gc
from specdec_tune.profiler.logit_margins import check_outputs
from specdec_tune.profiler.runs import DraftSpec, decode_once
from specdec_tune.profiler.timers import Stopwatch, synchronize
from specdec_tune.profiler.backends import VllmPair
from specdec_tune.core.stats import RateSamples, speedup_estimate

HF_METHODS = ("hf_generate", "hf_assisted")
OURS = ("ours_baseline", "ours_speculative")
VLLM_METHODS = ("vllm_plain", "vllm_speculative")
METHODS = HF_METHODS + OURS + VLLM_METHODS
# (a, b): ratio a / b, reported when both were measured.
RATIOS = (
    ("ours_speculative", "hf_assisted"),
    ("ours_baseline", "hf_generate"),
    ("ours_speculative", "ours_baseline"),
    ("hf_assisted", "hf_generate"),
    ("ours_baseline", "vllm_plain"),
    ("ours_speculative", "vllm_speculative"),
    ("vllm_speculative", "vllm_plain"),
)


@dataclass
class MethodResult:
    """Measured totals of one method over all prompts (and repeats)."""

    name: str
    seconds: float = 0.0
    new_tokens: int = 0
    outputs: list[list[int]] = field(default_factory=list)  # per prompt, first repeat
    seconds_rows: list[list[float]] = field(default_factory=list)  # [prompt][repeat]
    tokens_rows: list[list[int]] = field(default_factory=list)  # [prompt][repeat]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def add(self, prompt: int, tokens: list[int], seconds: float) -> None:
        if prompt == len(self.seconds_rows):
            self.seconds_rows.append([])
            self.tokens_rows.append([])
            self.outputs.append(tokens)
        self.seconds_rows[prompt].append(seconds)
        self.tokens_rows[prompt].append(len(tokens))
        self.seconds += seconds
        self.new_tokens += len(tokens)

    def samples(self) -> RateSamples:
        return RateSamples(tuple(str(i) for i in range(len(self.seconds_rows))),
                           tuple(tuple(float(t) for t in r) for r in self.tokens_rows),
                           tuple(tuple(r) for r in self.seconds_rows))


@dataclass
class BenchResult:
    """Measured tokens/s of every method, ratios and whether the greedy outputs agree."""

    methods: dict[str, MethodResult]
    prompts: int
    max_new_tokens: int
    num_speculative_tokens: int
    repeats: int
    vllm: dict = field(default_factory=dict)  # versions, start seconds, counters, latencies
    dtype: str = "float32"
    # (prompt, method) -> the consistency rule's verdict against the first method's output
    consistency: dict[tuple[int, str], Consistency] = field(default_factory=dict)
    timed_regions: dict | None = None  # the timed calls' check (profiler.clean.TimedRegions.report)
    _estimates: dict = field(default_factory=dict, repr=False, compare=False)

    def _estimate(self, a: str, b: str):
        """Tokens/s of ``a`` ÷ tokens/s of ``b``, each over the prompts' medians, and its paired CI: one
        estimator (``stats.speedup_estimate``; with one repeat, the ratio of the pooled rates)."""
        if (a, b) not in self._estimates:
            self._estimates[(a, b)] = speedup_estimate(self.methods[a].samples(), self.methods[b].samples())
        return self._estimates[(a, b)]

    def ratio(self, a: str, b: str) -> float:
        if not self.methods[b].seconds_rows or not self.methods[b].tokens_per_s:
            return float("nan")
        return self._estimate(a, b).value

    def ratio_ci(self, a: str, b: str) -> tuple[float, float] | None:
        """Paired bootstrap 95% CI of ratio(a, b) (same prompts, interleaved; it contains the ratio); None
        from one prompt."""
        return self._estimate(a, b).ci

    def ratios(self) -> dict[str, dict[str, float | list[float]]]:
        out = {}
        for a, b in RATIOS:
            if a in self.methods and b in self.methods:
                ci = self.ratio_ci(a, b)
                out[f"{a}/{b}"] = {"value": self.ratio(a, b), "ci95": None if ci is None else list(ci)}
        return out

    @property
    def mismatches(self) -> list[tuple[int, str]]:
        """(prompt index, method) pairs whose output differs from the first method's."""
        ref = next(iter(self.methods.values())).outputs
        return [
            (i, name)
            for name, res in self.methods.items()
            for i, out in enumerate(res.outputs)
            if out != ref[i]
        ]

    @property
    def identical(self) -> bool:
        return not self.mismatches

    @property
    def reference(self) -> str:
        """The method whose greedy output the others are judged against (the first measured)."""
        return next(iter(self.methods))

    @property
    def verdict(self) -> str:
        """``identical``, ``near-tie`` (parted only within the dtype's rounding tolerance) or
        ``differ`` (``specdec_tune.core.consistency``)."""
        return overall([c.status for c in self.consistency.values()] or ["differ"] * bool(self.mismatches))

    def consistency_json(self) -> dict:
        """The verdict, the share of prompts that parted, and where each parted."""
        parted = sorted({i for (i, _m), c in self.consistency.items() if c.status != "identical"})
        return {
            "verdict": self.verdict, "dtype": self.dtype, "reference": self.reference,
            "rule": "float32: identical; bfloat16/float16: parted only where the reference's logit margin is within "
                    "the dtype's rounding tolerance (specdec_tune.core.consistency)",
            "prompts_parted": len(parted), "share_parted": len(parted) / self.prompts if self.prompts else 0.0,
            "parted": [{"prompt": i, "method": m, **c.to_json()} for (i, m), c in sorted(self.consistency.items())
                       if c.status != "identical"],
        }

    def to_json(self) -> dict:
        return {
            "label": "measured",
            "prompts": self.prompts,
            "max_new_tokens": self.max_new_tokens,
            "num_speculative_tokens": self.num_speculative_tokens,
            "repeats": self.repeats,
            "tokens_per_s": {k: v.tokens_per_s for k, v in self.methods.items()},
            "seconds": {k: v.seconds for k, v in self.methods.items()},
            "new_tokens": {k: v.new_tokens for k, v in self.methods.items()},
            "ratios": {k: v["value"] for k, v in self.ratios().items()},
            "ratio_ci95": {k: v["ci95"] for k, v in self.ratios().items()},
            "outputs_identical": self.identical,
            "mismatches": [{"prompt": i, "method": m} for i, m in self.mismatches],
            "consistency": self.consistency_json(),
            "timed_regions": self.timed_regions,
            **({"vllm": self.vllm} if self.vllm else {}),
        }


def _hf_generate(target: LoadedModel, prompt_ids: torch.Tensor, max_new_tokens: int, assistant=None) -> list[int]:
    ids = prompt_ids[None]
    out = target.hf.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        assistant_model=assistant,
        eos_token_id=target.eos_token_id,
        pad_token_id=target.eos_token_id if target.tokenizer.pad_token_id is None else target.tokenizer.pad_token_id,
    )
    return out[0, ids.shape[1]:].tolist()


class _HfInternalDeprecation(logging.Filter):
    """Drops the deprecation warning transformers 5.24 raises against itself in assisted generation.

    ``AssistedCandidateGenerator._prepare_generation_args`` (``generation/candidate_generator.py``) calls
    the assistant's ``generate`` with ``generation_config`` *and* ``min_new_tokens``/``max_new_tokens``/
    ``use_cache``, which ``GenerationMixin._prepare_generation_config`` warns about: nothing a user of
    ``bench`` can change, so it is not shown to them.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "Passing `generation_config` together with generation-related" not in record.getMessage()


def configure_assistant(draft: LoadedModel, num_speculative_tokens: int) -> torch.nn.Module:
    """A view of the draft model whose generation_config asks HF for a constant N and no threshold."""
    hf_logger = logging.getLogger("transformers.generation.utils")
    if not any(isinstance(f, _HfInternalDeprecation) for f in hf_logger.filters):
        hf_logger.addFilter(_HfInternalDeprecation())
    assistant = copy.copy(draft.hf)  # shallow: shares weights, own generation_config
    assistant.generation_config = copy.deepcopy(draft.hf.generation_config)
    assistant.generation_config.num_assistant_tokens = num_speculative_tokens
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    return assistant


def run_bench(
    target: LoadedModel,
    draft: LoadedModel,
    prompts: list[torch.Tensor],
    *,
    num_speculative_tokens: int,
    max_new_tokens: int,
    repeats: int = 1,
    methods: Iterable[str] = HF_METHODS + OURS,
    progress: Callable[[str], None] | None = None,
    vllm: VllmPair | None = None,
) -> BenchResult:
    """Time every method on every prompt, interleaved; return measured totals.

    ``vllm`` (started engines) is needed when a ``vllm_*`` method is asked for.
    """
    assistant = configure_assistant(draft, num_speculative_tokens)
    config = DecodeConfig(max_new_tokens=max_new_tokens, num_speculative_tokens=num_speculative_tokens,
                          eos_token_id=target.eos_token_id)
    spec = DraftSpec("model", draft)
    calls: dict[str, Callable[[torch.Tensor], list[int]]] = {
        "hf_generate": lambda ids: _hf_generate(target, ids, max_new_tokens),
        "hf_assisted": lambda ids: _hf_generate(target, ids, max_new_tokens, assistant),
        "ours_baseline": lambda ids: decode_once(target, DraftSpec("none"), ids, config).token_ids,
        "ours_speculative": lambda ids: decode_once(target, spec, ids, config).token_ids,
    }
    chosen = [m for m in METHODS if m in set(methods)]
    timed: dict[str, Callable[[torch.Tensor], tuple[list[int], float]]] = {}
    for m in chosen:
        if m in VLLM_METHODS:
            if vllm is None:
                raise ValueError(f"method {m} needs started vLLM engines (vllm=VllmPair)")
            kind = m.removeprefix("vllm_")
            timed[m] = lambda ids, kind=kind: vllm.run(kind, ids.tolist(), max_new_tokens)
    results = {m: MethodResult(m) for m in chosen}
    watch = Stopwatch(target.device)

    def run(m: str, ids: torch.Tensor) -> tuple[list[int], float]:
        if m in timed:  # timed inside the vLLM worker
            return timed[m](ids)
        synchronize(target.device)
        watch.start()
        out = calls[m](ids)
        return out, watch.stop()

    regions = TimedRegions({"target": target.model, "draft": draft.model})
    with torch.inference_mode():
        _warm(target, draft, prompts, chosen, run, num_speculative_tokens, bool(regions.models))
        if vllm is not None:
            vllm.reset_counts()  # vLLM's counters and latencies cover the measured calls only
        with quiet_gc():
            for r in range(repeats):
                for i, ids in enumerate(prompts):
                    for m in chosen:  # vLLM runs in its own processes: nothing of ours to watch there
                        out, seconds = run(m, ids) if m in timed else regions.run(lambda: run(m, ids), f"{m} {i}")
                        results[m].add(i, out, seconds)
                    if progress is not None:
                        progress(f"repeat {r + 1}/{repeats}, prompt {i + 1}/{len(prompts)}")
    return BenchResult(results, len(prompts), max_new_tokens, num_speculative_tokens, repeats,
                       vllm.summary() if vllm is not None else {}, str(target.dtype).replace("torch.", ""),
                       judge_outputs(target, prompts, results), regions.report())


def _warm(target: LoadedModel, draft: LoadedModel, prompts: list[torch.Tensor], chosen: list[str], run,
          n: int, graphed: bool) -> None:
    """Untimed warm-up of every method: on the longest prompt (the largest KV cache), on every prompt where
    our engine replays CUDA graphs (each prompt's slot length and first prefill), then every graph a
    decode at N can replay made (``engine.prepare_graphs``)."""
    for m in chosen:
        for ids in prompts if graphed else [max(prompts, key=len)]:
            run(m, ids)
    prepare_graphs(target.model, decode_keys(n, draft=False))
    prepare_graphs(draft.model, decode_keys(n, draft=True))


def judge_outputs(target: LoadedModel, prompts: list[torch.Tensor],
                  results: dict[str, MethodResult]) -> dict[tuple[int, str], Consistency]:
    """Every method's greedy output on every prompt judged against the first method's by the
    consistency rule (a margin is measured only where two outputs part)."""
    ref_name = next(iter(results))
    ref = results[ref_name].outputs
    return {(i, name): check_outputs(target, ids, ref[i], res.outputs[i])
            for name, res in results.items() if name != ref_name for i, ids in enumerate(prompts)}
