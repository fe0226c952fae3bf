"""EAGLE-3 heads in every server's files, each field as that server's own code reads it (issue 39).

vLLM ``method: "eagle3"``; SGLang ``--speculative-algorithm EAGLE3`` with num-steps, eagle-topk and
num-draft-tokens; TensorRT-LLM's ``Eagle3`` decoding config (chains, static trees as ``eagle_choices``, the
dynamic tree), checked against TensorRT-LLM's own field list; llama.cpp's ``draft-eagle3`` spec type, refused
out loud when the llama.cpp built here lacks it; HF transformers refused (it has no heads). The servers'
own parsers run in the marked tests (``tests/tuner/servers/test_eagle_vllm.py``; SGLang's in ``tests/tuner/servers/test_sglang_parser.py``).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specdec_tune.core.errors import InputError
from specdec_tune.core.trees import parse_tree
from specdec_tune.engine import save_head
from specdec_tune.tuner.model import Candidate, TuningResult
from specdec_tune.tuner.servers import SERVERS, expressible, project, render_exports
from specdec_tune.tuner.servers import _eagle, _schemas as sch
from specdec_tune.tuner.servers import _trtllm_fields as f
from tests.support.eagle_stub import random_head, tiny_target

TARGET_PATH = "/models/target"


@pytest.fixture(scope="module")
def head(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("head")
    save_head(random_head(tiny_target()), folder)
    return str(folder)


def exported(head: str, c_kwargs: dict, fmt: str, per_b: dict | None = None) -> dict[str, str]:
    c = Candidate(head, **c_kwargs)
    r = TuningResult(candidate=c, server=fmt, target="mini-target", workload="functions", target_path=TARGET_PATH,
                     draft_path=head, per_batch_size=per_b or {})
    return dict(render_exports(r, [fmt])[fmt])


def test_vllm_runs_the_head_as_method_eagle3(head):
    cfg = json.loads(exported(head, {"num_speculative_tokens": 4}, "vllm", {1: 4, 8: 2})["vllm/speculative_config.json"])
    sch.VllmSpeculativeConfig(**cfg)
    assert cfg == {"method": "eagle3", "num_speculative_tokens": 4, "model": head,
                   "num_speculative_tokens_per_batch_size": [[1, 7, 4], [8, 8, 2]]}


def test_sglang_eagle3_flags_chain_and_tree(head):
    chain = exported(head, {"num_speculative_tokens": 4}, "sglang")["sglang/flags.txt"].split()
    assert chain == ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", head,
                     "--speculative-num-steps", "4", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5"]
    tree = exported(head, {"num_speculative_tokens": 3, "tree": "eagle:2:6"}, "sglang")["sglang/flags.txt"].split()
    assert tree[tree.index("--speculative-eagle-topk") + 1] == "2"
    assert tree[tree.index("--speculative-num-draft-tokens") + 1] == "7"  # the 6 nodes verified + the root
    with pytest.raises(Exception, match="steps \\+ 1"):  # SGLang resets num-draft-tokens with top-k 1
        sch.SglangSpeculativeArgs(speculative_algorithm="EAGLE3", speculative_draft_model_path=head,
                                  speculative_num_steps=4, speculative_eagle_topk=1, speculative_num_draft_tokens=4)


@pytest.mark.parametrize("tree", ["", "eagle:2:5", "topk:2-1", "chains:2"])
def test_trtllm_eagle3_config_passes_tensorrt_llm_fields(head, tree):
    text = exported(head, {"num_speculative_tokens": 3, "tree": tree}, "trtllm")["trtllm/extra_llm_api_options.yaml"]
    opts = yaml.safe_load(text)
    assert f.check_options(opts) == []
    spec = opts["speculative_config"]
    assert spec["decoding_type"] == "Eagle3" and spec["max_draft_len"] == 3 and spec["speculative_model"] == head
    kind = tree.split(":")[0]
    if kind == "eagle":
        assert (spec["use_dynamic_tree"], spec["dynamic_tree_max_topK"], spec["max_total_draft_tokens"]) == (True, 2, 5)
    elif kind:
        shape = parse_tree(tree).shape(3)
        assert len(spec["eagle_choices"]) == shape.size  # one path of sibling ranks per node
        assert max(len(p) for p in spec["eagle_choices"]) == 3
        assert all(p[:-1] in spec["eagle_choices"] for p in spec["eagle_choices"] if len(p) > 1)  # connected


def test_tensorrt_llm_fields_catch_a_planted_bad_eagle3_key(head):
    opts = yaml.safe_load(exported(head, {"num_speculative_tokens": 3}, "trtllm")["trtllm/extra_llm_api_options.yaml"])
    opts["speculative_config"]["eagle_choices"] = "[[0], [1]]"  # a string: the YAML would need a list
    assert f.check_options(opts)
    opts["speculative_config"].pop("eagle_choices")
    opts["speculative_config"]["dynamic_tree_topK"] = 2  # not TensorRT-LLM's name (dynamic_tree_max_topK)
    assert f.check_options(opts)


def test_trtllm_refuses_a_dynamic_tree_over_its_node_cap(head):
    c = Candidate(head, 2, tree="eagle:2:5")  # verifies min(5, 2 + 4) = 5 nodes > K·N = 4
    reason = expressible(SERVERS["trtllm"], c)
    assert reason and "dynamic_tree_max_topK·max_draft_len = 4" in reason


def test_llamacpp_draft_eagle3_flags_and_converter_sources(head):
    files = exported(head, {"num_speculative_tokens": 4, "threshold": 0.3}, "llamacpp")
    assert files["llamacpp/flags.txt"].split() == ["--spec-type", "draft-eagle3", "--spec-draft-model", "draft.gguf",
                                                    "--spec-draft-n-max", "4", "--spec-draft-n-min", "0",
                                                    "--spec-draft-p-min", "0.3"]
    sources = json.loads(files["llamacpp/gguf_sources.json"])
    assert sources["draft.gguf"] == {"model": head, "outtype": "f32", "target_model_dir": TARGET_PATH}
    assert "llamacpp/flags-before-spec-rename.txt" not in files  # those builds had no EAGLE-3 draft type


def test_llamacpp_refuses_out_loud_when_its_build_lacks_eagle3(head, tmp_path, monkeypatch):
    from specdec_tune.profiler.backends._llamacpp import LlamaCpp

    (tmp_path / "llama.cpp" / "common").mkdir(parents=True)
    (tmp_path / "llama.cpp" / "common" / "speculative.cpp").write_text('{"draft-simple", ...}\n')
    monkeypatch.setattr("specdec_tune.profiler.find_llamacpp", lambda: LlamaCpp(tmp_path))
    reason = expressible(SERVERS["llamacpp"], Candidate(head, 4))
    assert reason and "draft-eagle3" in reason and _eagle.LLAMACPP_EAGLE3 in reason
    with pytest.raises(InputError, match="draft-eagle3"):
        exported(head, {"num_speculative_tokens": 4}, "llamacpp")


def test_hf_and_chain_only_servers_refuse_or_project(head):
    assert "no EAGLE-3 heads" in expressible(SERVERS["hf"], Candidate(head, 4))
    assert project(SERVERS["hf"], Candidate(head, 4)) is None
    tree = Candidate(head, 4, tree="eagle:2:6", threshold=0.3)
    assert "one chain" in expressible(SERVERS["vllm"], tree)
    projected = project(SERVERS["vllm"], tree)
    assert projected is not None and projected.tree == "" and projected.threshold == 0.0
    assert project(SERVERS["llamacpp"], tree).threshold == 0.3  # llama.cpp's p-min applies to draft-eagle3
    assert "EAGLE-3 heads" in SERVERS["vllm"].capabilities()


def test_a_draft_model_is_not_taken_for_a_head(head):
    assert _eagle.is_head(Candidate(head, 4))
    assert not _eagle.is_head(Candidate("mini-draft-1l", 4))
    assert not _eagle.is_head(Candidate(str(Path(head).parent / "missing"), 4))
