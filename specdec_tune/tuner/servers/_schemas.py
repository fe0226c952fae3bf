"""Pydantic schemas of what each server reads, checked before a file is written.

Each model mirrors the constraints the server's own source enforces at the version named in
:mod:`specdec_tune.tuner.servers` (the comment on each class says which), plus the ones an export must
meet to mean what the tuning meant (no value silently clamped by the server). ``extra="forbid"``
everywhere: a field the server lacks is an error here, not a surprise at launch.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# vLLM 0.32.0: vllm/config/speculative.py SpeculativeConfig, vllm/v1/spec_decode/dynamic/utils.py.
class VllmSpeculativeConfig(_Strict):
    """The JSON passed as ``--speculative-config``."""

    method: Literal["draft_model", "ngram", "eagle3", "suffix"]
    num_speculative_tokens: int = Field(gt=0)
    model: str | None = None
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None
    # _validate_suffix_decoding's bounds (method "suffix"; vLLM keeps its defaults 24, 10000, 1.0, 0.1 otherwise)
    suffix_decoding_max_tree_depth: int | None = Field(default=None, ge=1)
    suffix_decoding_max_cached_requests: int | None = Field(default=None, ge=0)
    suffix_decoding_max_spec_factor: float | None = Field(default=None, ge=0)
    suffix_decoding_min_token_prob: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _check(self) -> VllmSpeculativeConfig:
        if self.method in ("draft_model", "eagle3") and not self.model:
            raise ValueError(f"method {self.method!r} needs 'model' (the draft model or EAGLE-3 head)")
        suffix = [k for k in type(self).model_fields if k.startswith("suffix_decoding_") and getattr(self, k) is not None]
        if self.method == "suffix":
            if self.model is not None or len(suffix) != 4:
                raise ValueError("method 'suffix' takes no 'model' and needs its four suffix_decoding_* fields")
            if self.num_speculative_tokens_per_batch_size is not None:  # SuffixDecodingProposer.propose asserts K == N
                raise ValueError("method 'suffix' takes no num_speculative_tokens_per_batch_size")
        elif suffix:
            raise ValueError("suffix_decoding_* apply to method 'suffix' only")
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError("method 'ngram' takes no 'model'")
            if self.prompt_lookup_max is None or self.prompt_lookup_min is None:
                raise ValueError("method 'ngram' needs prompt_lookup_max and prompt_lookup_min")
            if self.prompt_lookup_min > self.prompt_lookup_max:
                raise ValueError("prompt_lookup_min must be <= prompt_lookup_max")
        elif self.prompt_lookup_max is not None or self.prompt_lookup_min is not None:
            raise ValueError("prompt_lookup_* apply to method 'ngram' only")
        sched = self.num_speculative_tokens_per_batch_size
        if sched is not None:
            if not sched:
                raise ValueError("num_speculative_tokens_per_batch_size must not be empty")
            expect = 1
            for lo, hi, k in sched:
                # vLLM: ranges start at 1, are sorted and do not overlap; ours are also contiguous.
                if lo != expect or hi < lo:
                    raise ValueError(f"range ({lo}, {hi}) must start at {expect} and end >= its start")
                if k < 0:
                    raise ValueError(f"K must be >= 0, got {k} for ({lo}, {hi})")
                expect = hi + 1
            # vLLM clamps every K to num_speculative_tokens: the largest K must be it, or it is lost.
            if max(k for _, _, k in sched) != self.num_speculative_tokens:
                raise ValueError("num_speculative_tokens must equal the schedule's largest K")
        return self


# SGLang 0.5.23: srt/arg_groups/fields/spec.py, srt/arg_groups/speculative_hook.py.
class SglangSpeculativeArgs(_Strict):
    """The speculative launch flags of ``python -m sglang.launch_server``."""

    speculative_algorithm: Literal["STANDALONE", "EAGLE3", "NGRAM"]
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = Field(default=None, ge=1)
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int = Field(ge=2)
    speculative_ngram_min_bfs_breadth: int | None = None
    speculative_ngram_max_bfs_breadth: int | None = None

    @model_validator(mode="after")
    def _check(self) -> SglangSpeculativeArgs:
        if self.speculative_algorithm in ("STANDALONE", "EAGLE3"):  # one handler: _handle_eagle_family
            algo = self.speculative_algorithm
            if not self.speculative_draft_model_path or self.speculative_num_steps is None:
                raise ValueError(f"{algo} needs --speculative-draft-model-path and --speculative-num-steps")
            k, steps = self.speculative_eagle_topk, self.speculative_num_steps
            if k is None or k < 1:
                raise ValueError(f"{algo} needs --speculative-eagle-topk >= 1")
            # speculative_hook: with topk 1 SGLang resets num_draft_tokens to num_steps + 1.
            if k == 1 and self.speculative_num_draft_tokens != steps + 1:
                raise ValueError("with topk 1, --speculative-num-draft-tokens must be --speculative-num-steps + 1")
            # eagle_utils.organize_draft_results: the best num_draft_tokens - 1 of the K + (steps - 1)·K² drafted
            if k > 1 and self.speculative_num_draft_tokens - 1 > k + (steps - 1) * k * k:
                raise ValueError("--speculative-num-draft-tokens - 1 exceeds the K + (steps - 1)·K² nodes drafted")
            if self.speculative_ngram_min_bfs_breadth is not None or self.speculative_ngram_max_bfs_breadth is not None:
                raise ValueError("--speculative-ngram-* apply to NGRAM only")
        else:
            if self.speculative_draft_model_path is not None or self.speculative_num_steps is not None:
                raise ValueError("NGRAM takes no draft model and derives its steps")
            if self.speculative_ngram_min_bfs_breadth != 1 or self.speculative_ngram_max_bfs_breadth != 1:
                raise ValueError("a linear n-gram draft needs min and max BFS breadth 1")
        return self

    def flags(self) -> list[str]:
        """``["--speculative-algorithm", "STANDALONE", ...]`` in field order, unset fields left out."""
        out: list[str] = []
        for name, value in self.model_dump(exclude_none=True).items():
            out += ["--" + name.replace("_", "-"), str(value)]
        return out


# TensorRT-LLM 00043967 (upper-bound keys): tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig and subclasses;
# the names and types are also checked against _trtllm_fields.py (TensorRT-LLM's own field list).
class TrtllmSpeculativeConfig(_Strict):
    """``speculative_config`` in an extra-LLM-API-options YAML file."""

    decoding_type: Literal["Draft_Target", "NGram", "Eagle3"]
    max_draft_len: int = Field(gt=0)
    speculative_model: str | None = None
    max_matching_ngram_size: int | None = Field(default=None, gt=0)
    is_use_oldest: bool | None = None
    is_public_pool: bool | None = None
    draft_len_schedule: dict[int, int] | None = None
    # Eagle3 only (EagleDecodingConfig): a static tree, or the dynamic one with its top-K and node budget.
    eagle_choices: list[list[int]] | None = None
    use_dynamic_tree: bool | None = None
    dynamic_tree_max_topK: int | None = Field(default=None, gt=0)
    max_total_draft_tokens: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> TrtllmSpeculativeConfig:
        ngram_fields = (self.max_matching_ngram_size, self.is_use_oldest, self.is_public_pool)
        tree_fields = (self.eagle_choices, self.use_dynamic_tree, self.dynamic_tree_max_topK, self.max_total_draft_tokens)
        if self.decoding_type != "Eagle3" and any(f is not None for f in tree_fields):
            raise ValueError("eagle_choices and the dynamic-tree fields apply to Eagle3 only")
        if self.decoding_type == "Eagle3":
            self._check_eagle3()
        if self.decoding_type in ("Draft_Target", "Eagle3"):
            if not self.speculative_model:
                raise ValueError(f"{self.decoding_type} needs speculative_model")
            if any(f is not None for f in ngram_fields):
                raise ValueError("n-gram fields apply to NGram only")
        else:
            if self.speculative_model is not None:
                raise ValueError("NGram takes no speculative_model")
            if self.max_matching_ngram_size is None:
                raise ValueError("NGram needs max_matching_ngram_size")
        sched = self.draft_len_schedule
        if sched is not None:
            if not sched:
                raise ValueError("draft_len_schedule must not be empty")
            for b, k in sched.items():
                if b < 1 or k < 0 or k > self.max_draft_len:
                    raise ValueError(f"draft_len_schedule entry {b}: {k} needs key >= 1 and 0 <= value <= max_draft_len")
            if sched[min(sched)] != self.max_draft_len:
                raise ValueError("draft_len_schedule at its smallest key must equal max_draft_len")
        return self

    def _check_eagle3(self) -> None:
        """EagleDecodingConfig.validate_eagle_config: a static tree or a dynamic one, not both; the dynamic tree
        needs its top-K and verifies max_draft_len..K·max_draft_len nodes; a static tree's depth is max_draft_len."""
        if self.eagle_choices is not None:
            if self.use_dynamic_tree:
                raise ValueError("eagle_choices and use_dynamic_tree are mutually exclusive")
            if max(len(p) for p in self.eagle_choices) != self.max_draft_len:
                raise ValueError("eagle_choices' depth must equal max_draft_len (TensorRT-LLM resets one to the other)")
        if self.use_dynamic_tree:
            k, total = self.dynamic_tree_max_topK, self.max_total_draft_tokens
            if k is None or total is None or not self.max_draft_len <= total <= k * self.max_draft_len:
                raise ValueError("a dynamic tree needs dynamic_tree_max_topK K and max_total_draft_tokens in "
                                 "[max_draft_len, K·max_draft_len]")
        elif self.dynamic_tree_max_topK is not None:
            raise ValueError("dynamic_tree_max_topK without use_dynamic_tree is ignored by TensorRT-LLM")


class TrtllmExtraOptions(_Strict):
    """The whole YAML file passed as ``--extra_llm_api_options``."""

    speculative_config: TrtllmSpeculativeConfig


# llama.cpp 0c1e57098 (llama-cpp-python 0.3.36): common/arg.cpp; run by tests/tuner/servers/test_llamacpp_consumer.py.
class LlamacppSpeculativeArgs(_Strict):
    """The speculative flags of ``llama-server`` (current ``--spec-*`` names)."""

    spec_type: Literal["draft-simple", "draft-eagle3", "ngram-simple"]
    spec_draft_model: str | None = None
    spec_draft_n_max: int | None = Field(default=None, ge=1)
    spec_draft_n_min: int | None = Field(default=None, ge=0)
    spec_draft_p_min: float | None = Field(default=None, ge=0.0, lt=1.0)
    spec_ngram_simple_size_n: int | None = Field(default=None, ge=1, le=1024)
    spec_ngram_simple_size_m: int | None = Field(default=None, ge=1, le=1024)

    @model_validator(mode="after")
    def _check(self) -> LlamacppSpeculativeArgs:
        draft = (self.spec_draft_model, self.spec_draft_n_max, self.spec_draft_n_min)
        ngram = (self.spec_ngram_simple_size_n, self.spec_ngram_simple_size_m)
        if self.spec_type in ("draft-simple", "draft-eagle3"):
            if any(v is None for v in draft):
                raise ValueError(f"{self.spec_type} needs --spec-draft-model, --spec-draft-n-max and --spec-draft-n-min")
            if any(v is not None for v in ngram):
                raise ValueError("--spec-ngram-simple-* apply to ngram-simple only")
            if self.spec_draft_n_min > self.spec_draft_n_max:
                raise ValueError("--spec-draft-n-min must be <= --spec-draft-n-max")
        else:
            if any(v is None for v in ngram):
                raise ValueError("ngram-simple needs --spec-ngram-simple-size-n and -size-m")
            if any(v is not None for v in (*draft, self.spec_draft_p_min)):
                raise ValueError("--spec-draft-* apply to draft-simple only")
        return self

    def flags(self) -> list[str]:
        out: list[str] = []
        for name, value in self.model_dump(exclude_none=True).items():
            out += ["--" + name.replace("_", "-"), f"{value:g}" if isinstance(value, float) else str(value)]
        return out


# transformers 5.23.0: generation/configuration_utils.py.
class HfAssistantGenerationConfig(_Strict):
    """The assistant model's ``generation_config.json`` (model draft).

    ``assistant_confidence_threshold`` is always written: transformers' default is 0.4, so leaving it
    out would switch a threshold on.
    """

    num_assistant_tokens: int = Field(gt=0)
    num_assistant_tokens_schedule: Literal["constant", "heuristic", "heuristic_transient"]
    assistant_confidence_threshold: float = Field(ge=0.0, lt=1.0)


class HfPromptLookupGenerationConfig(_Strict):
    """The *target* model's ``generation_config.json`` for prompt lookup (n-gram)."""

    prompt_lookup_num_tokens: int = Field(gt=0)
    max_matching_ngram_size: int = Field(gt=0)
