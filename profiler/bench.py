"""Head-to-head benchmark: HF ``generate`` (target only), HF assisted generation, our baseline and our
speculative engine, greedy, on the same prompts in one process.

Fairness rules: every method is warmed up first; methods are interleaved prompt by prompt (so slow
drift of the machine hits all four alike); each timed call is one whole generation, prefill
included, measured with one synchronisation at its end; tokens/s = new tokens / seconds summed over
prompts. HF assisted generation is configured through the *assistant's* ``generation_config``
(``num_assistant_tokens``, ``num_assistant_tokens_schedule="constant"``,
``assistant_confidence_threshold=0``), which is where transformers 5 reads them.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from specdec_tune.engine import DecodeConfig, LoadedModel
from specdec_tune.profiler.runs import DraftSpec, decode_once
from specdec_tune.profiler.timers import Stopwatch, synchronize

METHODS = ("hf_generate", "hf_assisted", "ours_baseline", "ours_speculative")


@dataclass
class MethodResult:
    """Measured totals of one method over all prompts (and repeats)."""

    name: str
    seconds: float = 0.0
    new_tokens: int = 0
    outputs: list[list[int]] = field(default_factory=list)  # per prompt, first repeat

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class BenchResult:
    """Measured tokens/s of every method, ratios and whether the greedy outputs agree."""

    methods: dict[str, MethodResult]
    prompts: int
    max_new_tokens: int
    num_speculative_tokens: int
    repeats: int

    def ratio(self, a: str, b: str) -> float:
        den = self.methods[b].tokens_per_s
        return self.methods[a].tokens_per_s / den if den else float("nan")

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
            "ratios": {
                "ours_speculative/hf_assisted": self.ratio("ours_speculative", "hf_assisted"),
                "ours_baseline/hf_generate": self.ratio("ours_baseline", "hf_generate"),
                "ours_speculative/ours_baseline": self.ratio("ours_speculative", "ours_baseline"),
                "hf_assisted/hf_generate": self.ratio("hf_assisted", "hf_generate"),
            },
            "outputs_identical": self.identical,
            "mismatches": [{"prompt": i, "method": m} for i, m in self.mismatches],
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


def configure_assistant(draft: LoadedModel, num_speculative_tokens: int) -> torch.nn.Module:
    """A view of the draft model whose generation_config asks HF for a constant N and no threshold."""
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
    methods: Iterable[str] = METHODS,
    progress: Callable[[str], None] | None = None,
) -> BenchResult:
    """Time every method on every prompt, interleaved; return measured totals."""
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
    results = {m: MethodResult(m) for m in chosen}
    watch = Stopwatch(target.device)
    with torch.inference_mode():
        for m in chosen:  # warm-up, untimed
            calls[m](prompts[0])
        for r in range(repeats):
            for i, ids in enumerate(prompts):
                for m in chosen:
                    synchronize(target.device)
                    watch.start()
                    out = calls[m](ids)
                    seconds = watch.stop()
                    res = results[m]
                    res.seconds += seconds
                    res.new_tokens += len(out)
                    if r == 0:
                        res.outputs.append(out)
                if progress is not None:
                    progress(f"repeat {r + 1}/{repeats}, prompt {i + 1}/{len(prompts)}")
    return BenchResult(results, len(prompts), max_new_tokens, num_speculative_tokens, repeats)
