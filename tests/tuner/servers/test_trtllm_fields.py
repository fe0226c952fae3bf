"""``export --format trtllm`` against TensorRT-LLM's own field names and types.

The field list (``tuner/servers/_trtllm_fields.py``) is read from TensorRT-LLM's
``tensorrt_llm/llmapi/llm_args.py`` at a pinned commit (DecodingBaseConfig, DraftTargetDecodingConfig,
NGramDecodingConfig, the ``speculative_config`` top-level key). Exports must pass it; planted unknown
keys, wrong types and an old class name must fail it; and every field our own schema can write must
be one of TensorRT-LLM's for its decoding type.
"""
from __future__ import annotations

import pytest
import yaml

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import NGRAM, Candidate, TuningResult
from specdec_tune.tuner.servers import TrtllmSpeculativeConfig, render_exports
from specdec_tune.tuner.servers import _trtllm_fields as f

CASES = {
    "Draft_Target": TuningResult(candidate=Candidate("mini-draft-1l", 5), server="trtllm", target="mini-target",
                                 workload="functions", target_path="/m/t", draft_path="/m/d",
                                 per_batch_size={1: 5, 4: 3, 16: 0}),
    "NGram": TuningResult(candidate=Candidate(NGRAM, 3, ngram_max=4, ngram_min=1), server="trtllm", target="mini-target",
                          workload="functions", target_path="/m/t"),
}


def options(kind: str) -> dict:
    text = dict(render_exports(CASES[kind], ["trtllm"])["trtllm"])["trtllm/extra_llm_api_options.yaml"]
    return yaml.safe_load(text)


@pytest.mark.parametrize("kind", list(CASES))
def test_exports_use_tensorrt_llm_field_names_and_types(kind):
    opts = options(kind)
    assert opts["speculative_config"]["decoding_type"] == kind
    assert f.check_options(opts) == []


@pytest.mark.parametrize("kind", list(CASES))
def test_every_field_our_schema_writes_is_tensorrt_llm_s(kind):
    _, fields = f.DECODING_CLASSES[kind]
    ours = set(TrtllmSpeculativeConfig.model_fields)
    if kind == "Draft_Target":  # n-gram fields are refused for Draft_Target by our schema's validator
        ours -= {"max_matching_ngram_size", "is_use_oldest", "is_public_pool"}
    assert ours <= set(fields), ours - set(fields)


PLANTS = {
    "unknown field": lambda o: o["speculative_config"].update(max_draft_length=4),
    "unknown top-level key": lambda o: o.update(speculative_configs=o["speculative_config"]),
    "wrong type": lambda o: o["speculative_config"].update(max_draft_len="5"),
    "out of bounds": lambda o: o["speculative_config"].update(max_draft_len=-1),
    "old class name": lambda o: o["speculative_config"].update(decoding_type="DraftTarget"),
    "bad schedule": lambda o: o["speculative_config"].update(draft_len_schedule={"4": 3}),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_the_field_check_fails_on_a_planted_bad_key(plant):
    opts = options("Draft_Target")
    PLANTS[plant](opts)
    assert f.check_options(opts), f"planted {plant} went unnoticed"


def test_a_field_of_the_other_class_fails():
    opts = options("Draft_Target")
    opts["speculative_config"]["is_use_oldest"] = False  # an NGramDecodingConfig field
    assert any("DraftTargetDecodingConfig has no field 'is_use_oldest'" in p for p in f.check_options(opts))
    ngram = options("NGram")
    ngram["speculative_config"]["is_use_oldest"] = "no"
    assert f.check_options(ngram) == ["speculative_config.is_use_oldest: 'no' is not bool"]


def test_the_exporter_refuses_what_tensorrt_llm_lacks(monkeypatch):
    """The exporter runs the check before writing: were TensorRT-LLM to lack a field we write, the
    export is one line naming it."""
    name, fields = f.DECODING_CLASSES["NGram"]
    monkeypatch.setitem(f.DECODING_CLASSES, "NGram", (name, {k: v for k, v in fields.items() if k != "is_public_pool"}))
    with pytest.raises(InputError, match="NGramDecodingConfig has no field 'is_public_pool'"):
        render_exports(CASES["NGram"], ["trtllm"])
