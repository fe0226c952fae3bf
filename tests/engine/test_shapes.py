"""Model shapes without weights (engine.shapes) and synthetic acceptance (engine.verify.SyntheticAcceptance):
the published configs, memory refusal, seeded materialisation, the synthetic tokenizer, acceptance at the
given rates whatever the target says, and profile / measure / predict labelled synthetic end to end."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, LlamaConfig

from specdec_tune.cli import main
from specdec_tune.db import get_run, list_measured, open_database
from specdec_tune.engine import DecodeConfig, acceptance_per_position, build_drafter, load_model, resolve_source
from specdec_tune.engine import shapes, speculative
from specdec_tune.engine.shape_tokenizer import ShapeTokenizer
from specdec_tune.core.errors import ModelLoadError, NotFoundError
from specdec_tune.tuner.model import ModelProfile, SpecConfig, closed_form_tokens_per_cycle, predict

# Parameter counts of the published checkpoints (their model cards: 8.03 B, 7.61 B, 1.24 B, 0.49 B):
# held against the shipped configs, built on the meta device.
PUBLISHED = {"llama-3.1-8b": 8.03e9, "qwen2.5-7b": 7.62e9, "llama-3.2-1b": 1.24e9, "qwen2.5-0.5b": 0.494e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_shapes_resolve_and_have_the_published_size(name):
    shape = shapes.get_shape(f"shape:{name}")
    assert shape.published and shape.source.startswith("https://huggingface.co/") and name in shape.source.lower()
    assert resolve_source(f"shape:{name}") == f"shape:{name}"
    assert abs(shapes.parameter_count(shape) / PUBLISHED[name] - 1) < 0.005
    config = AutoConfig.from_pretrained(shape.folder)
    assert config.vocab_size >= shape.tokenizer_vocab_size  # padded embeddings hold the whole tokenizer


def test_every_pair_shares_a_family():
    manifest = shapes._manifest()
    for target, draft in manifest["pairs"]:
        assert shapes.get_shape(target).family == shapes.get_shape(draft).family
    assert {n.removeprefix("shape:") for n in shapes.shape_names()} == set(manifest["shapes"])


def test_unknown_shape_is_one_line_naming_the_shapes(capsys):
    with pytest.raises(NotFoundError, match="shape:qwen2.5-0.5b"):
        resolve_source("shape:gpt-5")
    assert main(["generate", "--target", "shape:gpt-5", "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model shape 'shape:gpt-5'" in err


def test_a_shape_that_does_not_fit_is_refused_naming_the_memory(monkeypatch, capsys):
    monkeypatch.setattr(shapes, "available_memory", lambda device: 3 * 2**30)
    with pytest.raises(ModelLoadError, match=r"needs about 5\.3 GiB in float32 on cpu .*1\.24 B parameters.*3\.0 GiB"):
        load_model("shape:llama-3.2-1b", "cpu", "float32")
    assert main(["generate", "--target", "shape:llama-3.1-8b", "--prompt", "x", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "needs about 34.4 GiB" in err and "8.03 B parameters" in err and err.count("\n") == 1


def test_shape_tokenizer_is_deterministic_and_spans_the_vocabulary():
    tok = ShapeTokenizer(151665, 151643, "qwen2.5")
    text = "def add(a, b):\n    return a + b  # 12345"
    ids = tok(text, return_tensors="pt").input_ids[0].tolist()
    assert ids == ShapeTokenizer(151665, 151643, "qwen2.5").encode(text)  # another instance, same ids
    assert ids != ShapeTokenizer(128256, 128001, "llama-3").encode(text)
    assert 12 <= len(ids) <= 20 and all(0 <= i < 151665 and i != 151643 for i in ids)
    assert tok.decode(ids) == text and tok.decode([151643, 5], skip_special_tokens=True) in ("", tok.decode([5]))
    spread = ShapeTokenizer(1000, 3, "x").encode(" ".join(f"w{i}" for i in range(300)))
    assert len(set(spread)) > 250 and max(spread) > 900  # ids spread over the whole vocabulary
    assert len(tok) == 151665 and len(tok.get_vocab()) == 151665


@pytest.fixture()
def tiny_shapes(tmp_path, monkeypatch):
    """A shape family small enough for the tests: a 3-layer target and a 1-layer draft."""
    folder = tmp_path / "shapes"
    for name, layers in (("tiny-target", 3), ("tiny-draft", 1)):
        cfg = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                          initializer_range=0.5, tie_word_embeddings=name == "tiny-draft")
        (folder / name).mkdir(parents=True)
        cfg.to_json_file(folder / name / "config.json")
    (folder / "manifest.json").write_text(json.dumps({
        "families": {"tiny": {"tokenizer_vocab_size": 300, "eos_token_id": 299}},
        "shapes": {n: {"family": "tiny", "published": False, "source": "test"} for n in ("tiny-target", "tiny-draft")},
        "pairs": [["tiny-target", "tiny-draft"]]}))
    monkeypatch.setattr(shapes, "CONFIGS", folder)
    shapes._manifest.cache_clear()
    yield folder
    shapes._manifest.cache_clear()


def test_materialised_weights_are_seeded_and_padding_rows_zero(tiny_shapes):
    a, tok = shapes.build_shape("shape:tiny-draft", "cpu", torch.float32, seed=0)
    b, _ = shapes.build_shape("shape:tiny-draft", "cpu", torch.float32, seed=0)
    c, _ = shapes.build_shape("shape:tiny-draft", "cpu", torch.float32, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert a.lm_head.weight is a.model.embed_tokens.weight  # tied as configured
    assert torch.count_nonzero(a.lm_head.weight[300:]) == 0 and torch.count_nonzero(a.lm_head.weight[:300]) > 0
    w = a.model.layers[0].self_attn.q_proj.weight
    assert abs(float(w.std()) - 0.5) < 0.05 and torch.all(a.model.norm.weight == 1)
    fresh = type(a.model.rotary_emb)(a.config)  # the frequencies a model built normally has
    assert torch.allclose(a.model.rotary_emb.inv_freq, fresh.inv_freq)
    ids = torch.tensor(tok.encode("def add(a, b): return a + b"))
    logits = a(ids[None]).logits[0, -1]
    assert int(logits.argmax()) < 300


def _synthetic_run(tiny_shapes, rates, n=4, tokens=400):
    target = load_model("shape:tiny-target", "cpu", "float32")
    draft = load_model("shape:tiny-draft", "cpu", "float32")
    ids = torch.tensor(target.tokenizer.encode("def add(a, b):\n    return a + b"))
    cfg = DecodeConfig(max_new_tokens=tokens, num_speculative_tokens=n, synthetic_acceptance=rates)
    with torch.inference_mode():
        result = speculative(target.model, build_drafter(draft.model, max_len=tokens + 64), ids, cfg)
    return result


def test_synthetic_acceptance_follows_the_given_rates_not_the_target(tiny_shapes):
    """An unrelated random draft: the target would accept almost nothing; the synthetic verify step
    accepts at the given conditional rates (within 0.03 after ~150 cycles: a golden-ratio sequence per
    position), and 1.0 / 0.0 accept everything / nothing."""
    result = _synthetic_run(tiny_shapes, (0.8, 0.6))
    alpha, _ = acceptance_per_position(result.cycles)
    assert len(result.token_ids) == 400 and len(result.cycles) > 100
    assert [round(a, 2) for a in alpha] == pytest.approx([0.8, 0.6, 0.6, 0.6], abs=0.03)
    tau = sum(c.accepted + 1 for c in result.cycles) / len(result.cycles)
    assert tau == pytest.approx(1 + 0.8 + 0.8 * 0.6 + 0.8 * 0.36 + 0.8 * 0.216, rel=0.03)
    assert all(c.accepted == 4 for c in _synthetic_run(tiny_shapes, (1.0,), tokens=40).cycles[:-1])
    assert all(c.accepted == 0 for c in _synthetic_run(tiny_shapes, (0.0,), tokens=20).cycles)


def test_synthetic_acceptance_is_refused_when_sampling():
    with pytest.raises(ValueError, match="greedily"):
        DecodeConfig(max_new_tokens=4, temperature=1.0, synthetic_acceptance=(0.5,))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        DecodeConfig(max_new_tokens=4, synthetic_acceptance=(1.5,))


def test_model_predicts_from_given_rates():
    profile = ModelProfile(draft_step_s={1: 0.001}, verify_s={1: {1: 0.01, 2: 0.011, 3: 0.012, 4: 0.013}},
                           synthetic_acceptance=(0.7,))
    p = predict(profile, SpecConfig(3))
    assert p.source == "synthetic" and p.expected_tokens_per_cycle == pytest.approx(closed_form_tokens_per_cycle(0.7, 3))
    assert p.cycle_time_s == pytest.approx(3 * 0.001 + 0.013)
    from specdec_tune.core.errors import InputError

    with pytest.raises(InputError, match="θ must be 0"):
        predict(profile, SpecConfig(3, threshold=0.3))


def _cli_json(capsys, args):
    code = main(args)
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


@pytest.mark.slow
def test_profile_measure_predict_with_synthetic_acceptance(tiny_shapes, tmp_path, capsys, monkeypatch):
    """The shape pair profiled and measured with synthetic acceptance; every number is labelled synthetic
    (CLI JSON, the database rows, the dashboard) and `predict` answers the best N per batch size if
    acceptance were 0.5."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    out = _cli_json(capsys, [
        "profile", "--target", "shape:tiny-target", "--draft", "shape:tiny-draft", "--workload", "functions",
        "--synthetic-acceptance", "0.7", "--device", "cpu", "--max-prompts", "2", "--max-new-tokens", "12",
        "--n-max", "3", "--k-max", "4", "--repeats", "2", "--context-lens", "16", "--batch-sizes", "1,2",
        "--threads", "1", "--db", db, "--json"])
    assert out["acceptance_rates"] == {"kind": "synthetic", "rates": [0.7],
                                 "label": "synthetic acceptance α = 0.7 (given, not measured)"}
    assert out["drafts"][0]["best"] and all(b["label"] == "predicted, synthetic acceptance" for b in out["drafts"][0]["best"])
    run = out["run_id"]
    database = open_database(db)
    assert get_run(database, run).settings.synthetic_acceptance == (0.7,)
    m = _cli_json(capsys, ["measure", "--run", str(run), "-N", "2", "--max-prompts", "2", "--repeats", "1",
                           "--threads", "1", "--db", db, "--json"])
    assert m["acceptance_rates"] == "synthetic" and m["label"] == "measured, synthetic acceptance"
    assert m["predicted_tokens_per_s"] > 0 and m["speedup"]["predicted"] > 0
    stored = [r for r in list_measured(database, run) if r.config.get("num_speculative_tokens") == 2]
    assert stored and stored[0].config["acceptance_rates"] == "synthetic" and stored[0].config["synthetic_acceptance"] == [0.7]
    p = _cli_json(capsys, ["predict", "--run", str(run), "--synthetic-acceptance", "0.5", "--batch-sizes", "1,2",
                           "--db", db, "--json"])
    assert p["acceptance_rates"] == "synthetic" and p["label"].startswith("predicted, synthetic acceptance α = 0.5")
    assert [r["batch_size"] for r in p["per_batch_size"]] == [1, 2] and all(r["best_n"] for r in p["per_batch_size"])
    assert all(0 <= r["num_speculative_tokens"] <= 3 and r["source"] in ("synthetic", "baseline") for r in p["per_batch_size"])
    assert main(["predict", "--run", str(run), "-N", "2", "--threshold", "0.3", "--db", db]) == 2
    assert "θ must be 0" in capsys.readouterr().err
    from specdec_tune.dashboard.overview import run_label
    from tests.dashboard.test_app import render

    assert run_label(get_run(database, run)).endswith("(completed, synthetic acceptance)")
    for page in ("profile", "why"):
        at = render(monkeypatch, page, db, None)
        assert any("Synthetic acceptance α = 0.7 (given, not measured)" in w.value for w in at.warning), page
