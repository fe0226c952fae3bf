"""A real consumer: transformers' own assisted generation runs the exported HF configuration.

The exported ``hf/generation_config.json`` is loaded with ``GenerationConfig.from_pretrained`` and set
as the assistant's generation config; ``target.generate(..., assistant_model=assistant)`` (greedy) must
give exactly our engine's tokens. With the target as its own assistant every draft is accepted, so the
number of verification rounds HF runs is fixed by N: it must equal our engine's number of cycles, which
shows HF applied the exported N (and, with a threshold, HF's θ rule) rather than its defaults.
"""
from __future__ import annotations

import copy

import pytest
import torch

from specdec_tune.engine.decode import DecodeConfig, speculative
from specdec_tune.engine.drafters import build_drafter
from specdec_tune.engine.loading import load_model
from specdec_tune.tuner.model import Candidate, TuningResult
from specdec_tune.tuner.servers import write_exports

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range("]
MAX_NEW = 12


@pytest.fixture(scope="module")
def models(tiny_model_dirs):
    target = load_model(tiny_model_dirs["target"], device="cpu", dtype="float32", forward="hf")
    draft = load_model(tiny_model_dirs["draft"], device="cpu", dtype="float32", forward="hf")
    # a second instance of the target as its own draft (hooks on the target must not count its calls)
    twin = load_model(tiny_model_dirs["target"], device="cpu", dtype="float32", forward="hf")
    return target, draft, twin, tiny_model_dirs


def export_hf(tmp_path, c: Candidate, dirs, draft_dir: str):
    from transformers import GenerationConfig

    r = TuningResult(candidate=c, server="hf", target="tiny-target", workload="tiny", target_path=dirs["target"],
                     draft_path=draft_dir)
    out = write_exports(r, ["hf"], tmp_path / "exp")
    assert [p.name for p in out["hf"]] == ["generation_config.json"]
    return GenerationConfig.from_pretrained(tmp_path / "exp" / "hf")


def hf_assisted(target, assistant_model, gen_config, ids: torch.Tensor) -> tuple[list[int], int]:
    """transformers' own generate with the exported config; returns (new tokens, target forwards)."""
    assistant = copy.copy(assistant_model)  # shallow: shared weights, its own generation_config
    assistant.generation_config = gen_config
    calls = {"n": 0}
    hook = target.hf.register_forward_pre_hook(lambda *a, **k: calls.__setitem__("n", calls["n"] + 1))
    try:
        out = target.hf.generate(input_ids=ids[None], attention_mask=torch.ones_like(ids[None]),
                                 max_new_tokens=MAX_NEW, do_sample=False, num_beams=1, assistant_model=assistant,
                                 eos_token_id=None, pad_token_id=0)
    finally:
        hook.remove()
    return out[0, ids.shape[0]:].tolist(), calls["n"]


def ours(target, draft_model, c: Candidate, ids: torch.Tensor):
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=c.num_speculative_tokens,
                       threshold=c.threshold, schedule=c.schedule, eos_token_id=None)
    drafter = build_drafter(draft_model, max_len=ids.shape[0] + MAX_NEW + c.num_speculative_tokens + 2,
                            threshold=c.threshold, threshold_rule=c.threshold_rule)
    with torch.inference_mode():
        return speculative(target.model, drafter, ids, cfg)


def encode(target, text: str) -> torch.Tensor:
    return torch.tensor(target.tokenizer(text)["input_ids"], dtype=torch.long)


@pytest.mark.parametrize("n", [2, 5])
def test_hf_runs_the_export_and_matches_our_engine(tmp_path, models, n):
    target, draft, _, dirs = models
    c = Candidate("tiny-draft", n)
    gen = export_hf(tmp_path, c, dirs, dirs["draft"])
    assert gen.num_assistant_tokens == n and gen.assistant_confidence_threshold == 0.0
    for text in PROMPTS:
        ids = encode(target, text)
        hf_tokens, _ = hf_assisted(target, draft.hf, gen, ids)
        assert hf_tokens == ours(target, draft.model, c, ids).token_ids


@pytest.mark.parametrize("n", [1, 3])
def test_hf_applies_the_exported_n(tmp_path, models, n):
    """Target as its own assistant: every draft is accepted, so rounds = cycles only if HF used N."""
    target, _, twin, dirs = models
    c = Candidate("tiny-target-as-draft", n)
    gen = export_hf(tmp_path, c, dirs, dirs["target"])
    ids = encode(target, PROMPTS[0])
    hf_tokens, hf_forwards = hf_assisted(target, twin.hf, gen, ids)
    res = ours(target, twin.model, c, ids)
    assert hf_tokens == res.token_ids
    # HF verifies prompt and first draft in one forward; our engine prefills first (one extra forward).
    assert hf_forwards == len(res.cycles)
    assert all(cyc.accepted == cyc.drafted for cyc in res.cycles)


def test_hf_threshold_rule_matches_hf(tmp_path, models, monkeypatch):
    """θ = 0.99 under HF's rule: each round proposes the low-confidence token, then stops; our engine
    with rule 'hf' runs the same rounds. With scikit-learn installed HF would re-tune θ at run time
    from an ROC curve of its rounds (``AssistedCandidateGenerator``, gated on ``is_sklearn_available``);
    that is switched off here, so HF keeps θ as exported whether or not scikit-learn is installed."""
    from transformers.generation import candidate_generator

    monkeypatch.setattr(candidate_generator, "is_sklearn_available", lambda: False)
    target, _, twin, dirs = models
    c = Candidate("tiny-target-as-draft", 4, 0.99, "hf")
    gen = export_hf(tmp_path, c, dirs, dirs["target"])
    assert gen.assistant_confidence_threshold == pytest.approx(0.99)
    ids = encode(target, PROMPTS[1])
    hf_tokens, hf_forwards = hf_assisted(target, twin.hf, gen, ids)
    res = ours(target, twin.model, c, ids)
    assert hf_tokens == res.token_ids
    assert hf_forwards == len(res.cycles)
    assert all(cyc.drafted == 1 for cyc in res.cycles[:-1])  # the token below θ was proposed, then stop
