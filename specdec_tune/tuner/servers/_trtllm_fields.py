"""TensorRT-LLM's own field names and types for what ``export --format trtllm`` writes, and a check.

Read from NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py`` at commit
:data:`TRTLLM_COMMIT` (main, 2026; the draft_len_schedule keys are upper bounds there):

- ``BaseLlmArgs.speculative_config: SpeculativeConfig`` where ``SpeculativeConfig`` is an
  ``Annotated[Union[DraftTargetDecodingConfig, ..., NGramDecodingConfig, ...],
  Field(discriminator="decoding_type")]``: the YAML's top-level key and how its class is chosen;
- ``DecodingBaseConfig(StrictBaseModel)``: the fields every decoding config shares (a
  ``StrictBaseModel`` forbids unknown fields, so an unknown key fails at launch);
- ``DraftTargetDecodingConfig``: ``decoding_type: Literal["Draft_Target"]``, nothing else of its own;
- ``NGramDecodingConfig``: ``decoding_type: Literal["NGram"]``, ``max_matching_ngram_size:
  PositiveInt``, ``is_keep_all``, ``is_use_oldest``, ``is_public_pool: bool``;
- ``Eagle3DecodingConfig(EagleDecodingConfig)``: ``decoding_type: Literal["Eagle3"]``, ``sa_config``, and
  EagleDecodingConfig's ``eagle_choices: Optional[List[List[int]]]``, ``greedy_sampling``,
  ``posterior_threshold``, ``use_dynamic_tree``, ``dynamic_tree_max_topK``, ``num_eagle_layers``,
  ``max_non_leaves_per_layer``, ``eagle3_one_model``, ``eagle3_layers_to_capture: Optional[Set[int]]``,
  ``eagle3_model_arch: Literal["llama3", "mistral_large3"]``.

The tables are data transcribed from that source (names, pydantic types, bounds), not TensorRT-LLM
code; :func:`check_options` applies them to an options mapping the way pydantic would reject it
(unknown key, wrong type, bound violated). Pydantic's lax mode would coerce ``"4"`` to 4; YAML
written by us never needs that, so strings for numbers are refused here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TRTLLM_COMMIT = "0004396720054fd8e205cbf616f21f0b57c6b412"
TRTLLM_SOURCE = "tensorrt_llm/llmapi/llm_args.py"


@dataclass(frozen=True)
class FieldType:
    """One pydantic field: ``kind`` is int, bool, str, float, path (``Union[str, Path]``),
    schedule (``dict[int, int]``) or enum; ``minimum`` a lower bound (NonNegativeInt 0,
    PositiveInt 1); ``choices`` an enum's or Literal's values."""

    kind: str
    optional: bool = True
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()


# DecodingBaseConfig (every field; private attributes such as _allow_greedy_draft_tokens are not fields).
DECODING_BASE: dict[str, FieldType] = {
    "max_draft_len": FieldType("int", minimum=0),  # Optional[NonNegativeInt]
    "max_total_draft_tokens": FieldType("int"),  # Optional[int]
    "speculative_model": FieldType("path"),  # Optional[Union[str, Path]], alias speculative_model_dir
    "speculative_model_dir": FieldType("path"),  # the alias (AliasChoices)
    "max_concurrency": FieldType("int", minimum=1),  # Optional[PositiveInt]
    "draft_len_schedule": FieldType("schedule"),  # Optional[dict[int, int]]
    "load_format": FieldType("str"),
    "acceptance_rate_window_size": FieldType("int", minimum=0),
    "acceptance_rate_threshold": FieldType("float", minimum=0.0, maximum=1.0),
    "use_rejection_sampling": FieldType("bool", optional=False),
    "allow_advanced_sampling": FieldType("bool", optional=False),  # deprecated no-op
    "advanced_sampling_mode": FieldType("enum", optional=False, choices=("full", "no_topk", "no_topp", "no_topk_no_topp")),
    "enable_penalty": FieldType("bool", optional=False),
}
DECODING_CLASSES: dict[str, tuple[str, dict[str, FieldType]]] = {
    "Draft_Target": ("DraftTargetDecodingConfig", {
        **DECODING_BASE, "decoding_type": FieldType("enum", optional=False, choices=("Draft_Target",))}),
    "NGram": ("NGramDecodingConfig", {
        **DECODING_BASE, "decoding_type": FieldType("enum", optional=False, choices=("NGram",)),
        "max_matching_ngram_size": FieldType("int", optional=False, minimum=1),
        "is_keep_all": FieldType("bool", optional=False), "is_use_oldest": FieldType("bool", optional=False),
        "is_public_pool": FieldType("bool", optional=False)}),
    # EagleDecodingConfig's fields (Eagle3DecodingConfig adds decoding_type "Eagle3" and sa_config).
    "Eagle3": ("Eagle3DecodingConfig", {
        **DECODING_BASE, "decoding_type": FieldType("enum", optional=False, choices=("Eagle3",)),
        "eagle_choices": FieldType("choices"),  # Optional[List[List[int]]]
        "greedy_sampling": FieldType("bool"), "posterior_threshold": FieldType("float"),
        "use_dynamic_tree": FieldType("bool"), "dynamic_tree_max_topK": FieldType("int"),
        "num_eagle_layers": FieldType("int"), "max_non_leaves_per_layer": FieldType("int"),
        "eagle3_one_model": FieldType("bool"), "eagle3_layers_to_capture": FieldType("intset"),  # Optional[Set[int]]
        "eagle3_model_arch": FieldType("enum", optional=False, choices=("llama3", "mistral_large3")),
        "sa_config": FieldType("mapping")}),  # Optional[SAEnhancerConfig]
}
# The top-level keys of an extra-LLM-API-options file that export writes (BaseLlmArgs fields).
TOP_LEVEL: dict[str, str] = {"speculative_config": "SpeculativeConfig (discriminator decoding_type)"}


def _type_problem(name: str, value: Any, spec: FieldType) -> str | None:
    if value is None:
        return None if spec.optional else f"{name}: None is not allowed"
    kind = spec.kind
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "bool": isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "str": isinstance(value, str), "path": isinstance(value, str) and bool(value),
          "enum": isinstance(value, str) and value in spec.choices,
          "schedule": isinstance(value, dict) and all(isinstance(k, int) and not isinstance(k, bool) and
                                                      isinstance(v, int) and not isinstance(v, bool)
                                                      for k, v in value.items()),
          "choices": isinstance(value, list) and all(isinstance(p, list) and all(isinstance(r, int) and not
                                                                                 isinstance(r, bool) for r in p)
                                                     for p in value),
          "intset": isinstance(value, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in value),
          "mapping": isinstance(value, dict)}[kind]
    if not ok:
        want = f"one of {', '.join(spec.choices)}" if kind == "enum" else kind
        return f"{name}: {value!r} is not {want}"
    if kind in ("int", "float") and spec.minimum is not None and value < spec.minimum:
        return f"{name}: {value!r} is below {spec.minimum:g}"
    if kind in ("int", "float") and spec.maximum is not None and value > spec.maximum:
        return f"{name}: {value!r} is above {spec.maximum:g}"
    return None


def check_options(options: Any) -> list[str]:
    """Every way ``options`` (a parsed extra-LLM-API-options mapping) breaks TensorRT-LLM's fields at
    :data:`TRTLLM_COMMIT`: unknown top-level key, unknown ``decoding_type``, a field the chosen class
    lacks, a value of the wrong type or out of bounds. Empty: TensorRT-LLM's models accept the names
    and types (its validators' cross-field rules, such as the schedule's, are our schema's job)."""
    if not isinstance(options, dict):
        return [f"options must be a mapping, got {type(options).__name__}"]
    problems = [f"unknown top-level key {k!r} (BaseLlmArgs has no such field we write; known: {', '.join(TOP_LEVEL)})"
                for k in options if k not in TOP_LEVEL]
    spec = options.get("speculative_config")
    if spec is None:
        return problems
    if not isinstance(spec, dict):
        return [*problems, "speculative_config must be a mapping"]
    kind = spec.get("decoding_type")
    if kind not in DECODING_CLASSES:
        return [*problems, f"speculative_config.decoding_type {kind!r} is none of {', '.join(DECODING_CLASSES)}"]
    cls, fields = DECODING_CLASSES[kind]
    for key, value in spec.items():
        if key not in fields:
            problems.append(f"speculative_config.{key}: {cls} has no field {key!r} (extra fields are forbidden)")
            continue
        why = _type_problem(f"speculative_config.{key}", value, fields[key])
        if why:
            problems.append(why)
    return problems
