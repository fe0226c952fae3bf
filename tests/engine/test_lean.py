"""The lean decoder forward computes what the HF forward computes, on every supported family."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specdec_tune.engine import DecodeConfig, autoregressive, build_drafter, lean_kernels, speculative
from specdec_tune.engine.kvcache import make_cache
from specdec_tune.engine.lean import LeanCausalLM, hf_model, lean_unsupported, wrap_forward
from specdec_tune.profiler.overhead import ForwardRecorder
from tests.support.tiny import tiny_llama

_SMALL = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)


def _mistral() -> torch.nn.Module:
    torch.manual_seed(3)
    return MistralForCausalLM(MistralConfig(**_SMALL, sliding_window=None)).double().eval()


def _qwen2() -> torch.nn.Module:  # q/k/v projections with biases
    torch.manual_seed(4)
    model = Qwen2ForCausalLM(Qwen2Config(**_SMALL, use_sliding_window=False)).double().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.3)
            layer.self_attn.k_proj.bias.normal_(0, 0.3)
    return model


MODELS = {
    "llama-gqa": lambda: tiny_llama(vocab=48, layers=3, seed=5),
    "llama-mha-linear-rope": lambda: _llama_linear_rope(),
    "mistral": _mistral,
    "qwen2-bias": _qwen2,
}


def _llama_linear_rope() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(6)
    cfg = LlamaConfig(**{**_SMALL, "num_key_value_heads": 4}, rope_scaling={"rope_type": "linear", "factor": 2.0})
    return LlamaForCausalLM(cfg).double().eval()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lean_logits_equal_hf_full_forward(name: str) -> None:
    """Prefill, one token, a block of 4, a rollback, a block of 3: every position's logits match a
    cache-free HF forward over the whole sequence (and batch rows stay independent)."""
    model = MODELS[name]()
    assert lean_unsupported(model) is None
    lean = wrap_forward(model, "lean")
    assert isinstance(lean, LeanCausalLM)
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(0, model.config.vocab_size, (2, 20), generator=gen)
    with torch.no_grad():
        full = model(input_ids=seq).logits  # [2, 20, V]
    cache = make_cache(lean, 32)
    steps = [(0, 7), (7, 8), (8, 12)]
    for a, b in steps:
        out = lean(input_ids=seq[:, a:b], past_key_values=cache, use_cache=True, logits_to_keep=b - a).logits
        torch.testing.assert_close(out, full[:, a:b], rtol=1e-9, atol=1e-9)
    cache.truncate(10)  # reject the last two positions and go on from there with other tokens
    other = seq.clone()
    other[:, 10:13] = torch.randint(0, model.config.vocab_size, (2, 3), generator=gen)
    with torch.no_grad():
        full_other = model(input_ids=other[:, :13]).logits
    out = lean(input_ids=other[:, 10:13], past_key_values=cache, use_cache=True, logits_to_keep=2).logits
    torch.testing.assert_close(out, full_other[:, 11:13], rtol=1e-9, atol=1e-9)
    assert cache.get_seq_length() == 13


def test_lean_speculative_equals_hf_autoregressive() -> None:
    """Greedy speculative decoding through the lean forward gives the HF-forward baseline's tokens."""
    target, draft = tiny_llama(vocab=48, layers=3, seed=7, sharpness=3.0), tiny_llama(vocab=48, layers=3, seed=7, sharpness=3.0)
    with torch.no_grad():  # a perturbed copy of the target: it agrees often, not always
        torch.manual_seed(8)
        for p in draft.model.layers[2].parameters():
            p.add_(torch.randn_like(p) * 0.3)
    prompt = torch.randint(0, 48, (9,), generator=torch.Generator().manual_seed(1))
    config = DecodeConfig(max_new_tokens=30, num_speculative_tokens=4)
    with torch.inference_mode():
        ref = autoregressive(target, prompt, config).token_ids
        lean_t, lean_d = wrap_forward(target), wrap_forward(draft)
        assert autoregressive(lean_t, prompt, config).token_ids == ref
        out = speculative(lean_t, build_drafter(lean_d, max_len=64), prompt, config)
    assert out.token_ids == ref
    accepted = sum(c.accepted for c in out.cycles)
    assert 0 < accepted < sum(c.drafted for c in out.cycles)  # drafts were both accepted and rejected


def test_unsupported_models_fall_back_to_hf_with_a_reason() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=64)).eval()
    assert "gpt2" in lean_unsupported(gpt2)
    assert wrap_forward(gpt2, "auto") is gpt2
    with pytest.raises(ValueError, match="cannot run this model: model type 'gpt2'"):
        wrap_forward(gpt2, "lean")
    sliding = MistralForCausalLM(MistralConfig(**_SMALL, sliding_window=16))
    assert "sliding" in lean_unsupported(sliding)
    with pytest.raises(ValueError, match="forward must be one of"):
        wrap_forward(sliding, "fast")


def test_wrapper_passes_through_attributes_calls_and_hooks() -> None:
    model = tiny_llama(vocab=48, layers=2, seed=9)
    lean = wrap_forward(model)
    assert hf_model(lean) is model and hf_model(model) is model
    assert wrap_forward(lean, "hf") is model
    assert lean.config is model.config and lean.generation_config is model.generation_config
    assert sum(p.numel() for p in lean.parameters()) == sum(p.numel() for p in model.parameters())
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():  # no preallocated cache: the HF forward answers, same logits
        torch.testing.assert_close(lean(input_ids=ids).logits, model(input_ids=ids).logits)
    recorder = ForwardRecorder()
    with recorder.attach(lean):
        recorder.begin()
        with torch.inference_mode():
            autoregressive(lean, ids[0], DecodeConfig(max_new_tokens=5))
        timeline = recorder.finish()
    assert [f.tokens for f in timeline.forwards] == [4, 1, 1, 1, 1]
    assert [f.context_len for f in timeline.forwards] == [0, 4, 5, 6, 7]


def test_lean_follows_weight_edits_in_place() -> None:
    """The wrapper holds the model's Parameter objects, so it never runs stale weights."""
    model = tiny_llama(vocab=48, layers=2, seed=10)
    lean = wrap_forward(model)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(2.0)
        ref = model(input_ids=ids).logits
    out = lean(input_ids=ids, past_key_values=make_cache(lean, 8), use_cache=True).logits
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kernels", [True, False], ids=["fused-kernels", "eager-ops"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_packed_multi_token_forward_matches_hf_in_float32(name: str, kernels: bool) -> None:
    """On a CPU in float32 a forward of several tokens runs on oneDNN-packed, concatenated q/k/v and
    gate/up weights (biases, GQA included); its logits match HF's to float32 rounding, and a weight
    edited in place is seen by the next forward (the packed copy is rebuilt, not stale). Both with
    the fused kernels and with the eager operators they replace."""
    model = MODELS[name]().float()
    lean = wrap_forward(model, "lean")
    lean.use_kernels = kernels
    if kernels and lean_kernels.kernels() is None:
        pytest.skip(f"the fused kernels are unavailable: {lean_kernels.unavailable()}")
    if not lean.packing:
        pytest.skip("this torch build has no oneDNN linear packing")
    seq = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))

    def check() -> None:
        with torch.no_grad():
            full = model(input_ids=seq).logits
        cache = make_cache(lean, 16)
        out = lean(input_ids=seq[:, :7], past_key_values=cache, use_cache=True, logits_to_keep=7).logits
        out2 = lean(input_ids=seq[:, 7:12], past_key_values=cache, use_cache=True, logits_to_keep=5).logits
        torch.testing.assert_close(torch.cat([out, out2], 1), full, rtol=1e-4, atol=1e-4)

    check()
    assert lean._packed is not None  # the multi-token forwards used the packed weights
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(3.0)
        model.model.layers[-1].self_attn.q_proj.weight.add_(0.5)
    check()


def _kernel_steps(lean: LeanCausalLM, model: torch.nn.Module, seq: torch.Tensor) -> None:
    """Prefill, one token, one token, a block of 4, a rollback and a block of 3 (batch rows at once):
    every position's float32 logits match a cache-free HF forward to float32 rounding."""
    with torch.no_grad():
        full = model(input_ids=seq).logits
    cache = make_cache(lean, 24)
    for a, b in [(0, 6), (6, 7), (7, 8), (8, 12)]:
        out = lean(input_ids=seq[:, a:b], past_key_values=cache, use_cache=True, logits_to_keep=b - a).logits
        torch.testing.assert_close(out, full[:, a:b], rtol=1e-4, atol=1e-4)
    cache.truncate(10)
    out = lean(input_ids=seq[:, 10:13], past_key_values=cache, use_cache=True, logits_to_keep=3).logits
    torch.testing.assert_close(out, full[:, 10:13], rtol=1e-4, atol=1e-4)


def _kernels_or_skip():
    kern = lean_kernels.kernels()
    if kern is None:
        pytest.skip(f"the fused kernels are unavailable: {lean_kernels.unavailable()}")
    return kern


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "own-weights"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_kernels_match_hf_in_float32(name: str, packing: bool) -> None:
    """The fused CPU kernels (RMSNorm, residual add, RoPE + cache write, one-query attention, SiLU
    gate) compute HF's function: on every family, one-token steps and blocks, on the packed weights
    and on the model's own."""
    _kernels_or_skip()
    model = MODELS[name]().float()
    lean = wrap_forward(model, "lean")
    lean.packing = packing and lean.packing
    seq = torch.randint(0, model.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(2))
    _kernel_steps(lean, model, seq)


class _Wrong:
    """The real kernels with one of them deliberately wrong."""

    def __init__(self, kern, name: str, fn) -> None:
        self._kern, self._name, self._fn = kern, name, fn

    def __getattr__(self, attr: str):
        return self._fn if attr == self._name else getattr(self._kern, attr)


@pytest.mark.parametrize("wrong", ["attention-misses-own-key", "rope-swaps-cos-sin", "norm-eps"])
def test_fused_kernel_comparison_has_power(wrong: str, monkeypatch) -> None:
    """The comparison above fails for kernels that are slightly wrong."""
    kern = _kernels_or_skip()
    bad = {
        "attention-misses-own-key": ("attention", lambda q, kb, vb, start, scale: kern.attention(q, kb, vb, start - 1, scale)),
        "rope-swaps-cos-sin": ("rope_cache", lambda q, k, v, c, s, kb, vb, pos: kern.rope_cache(q, k, v, s, c, kb, vb, pos)),
        "norm-eps": ("rms_norm", lambda x, w, eps: kern.rms_norm(x, w, eps + 0.1)),
    }[wrong]
    monkeypatch.setattr(lean_kernels, "kernels", lambda: _Wrong(kern, *bad))
    model = MODELS["llama-gqa"]().float()
    lean = wrap_forward(model, "lean")
    seq = torch.randint(0, model.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(2))
    with pytest.raises(AssertionError):
        _kernel_steps(lean, model, seq)


def test_fused_kernels_build_where_a_compiler_exists() -> None:
    """On a machine with a C++ compiler (this project's CI) the kernels build, so the fast path is
    the one the benchmarks and the tests above run."""
    import os
    import shutil

    if os.environ.get(lean_kernels.ENV, "1") == "0":
        pytest.skip(f"disabled by {lean_kernels.ENV}=0")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler on this machine")
    assert lean_kernels.kernels() is not None, lean_kernels.unavailable()


# --- where the kernels are built, and what a build says -------------------------------------------


class _FakeBuilder:
    """Stands in for torch's extension builder: records each call, leaves the built library behind."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, name, sources, **kwargs):
        import types

        self.calls.append({"name": name, "sources": list(sources), **kwargs})
        Path(kwargs["build_directory"], f"{name}.so").write_bytes(b"")
        return types.ModuleType(name)


@pytest.fixture
def fake_builder(monkeypatch, tmp_path):
    import logging

    import torch.utils.cpp_extension

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(lean_kernels.ENV, raising=False)
    monkeypatch.setattr(lean_kernels, "_state", {})
    monkeypatch.setattr(logging.getLogger("specdec_tune"), "handlers", [])  # the CLI's, if a CLI test ran
    builder = _FakeBuilder()
    monkeypatch.setattr(torch.utils.cpp_extension, "load", builder)
    return builder


def _load_from(monkeypatch, source) -> None:
    """A fresh process's first use of the kernels, with ``source`` as engine/lean_kernels.cpp."""
    monkeypatch.setattr(lean_kernels, "SOURCE", source)
    monkeypatch.setattr(lean_kernels, "_state", {})
    assert lean_kernels.kernels() is not None, lean_kernels.unavailable()


def _building(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == lean_kernels.__name__ and "building" in r.getMessage()]


def test_kernels_build_once_in_the_user_cache_and_say_so_without_printing(fake_builder, monkeypatch, tmp_path, caplog,
                                                                             capsys):
    import logging

    caplog.set_level(logging.INFO, logger=lean_kernels.__name__)
    assert lean_kernels.kernels() is not None, lean_kernels.unavailable()
    (call,) = fake_builder.calls
    build = call["build_directory"]
    assert build.startswith(str(tmp_path / "cache" / "lean_kernels")), build
    assert torch.__version__.split("+")[0] in build and lean_kernels._cpu_tag() in build
    (source,) = call["sources"]
    assert source.startswith(build) and Path(source).read_bytes() == lean_kernels.SOURCE.read_bytes()
    assert len(_building(caplog)) == 1 and capsys.readouterr() == ("", "")  # logged for the CLI, never printed
    caplog.clear()
    _load_from(monkeypatch, lean_kernels.SOURCE)  # the next process loads what was built
    assert [c["build_directory"] for c in fake_builder.calls] == [build, build] and not _building(caplog)


def test_two_checkouts_share_one_build(fake_builder, monkeypatch, tmp_path, caplog):
    import logging
    import shutil

    caplog.set_level(logging.INFO, logger=lean_kernels.__name__)
    for checkout in ("a", "b", "a"):
        copy = tmp_path / checkout / "lean_kernels.cpp"
        copy.parent.mkdir(exist_ok=True)
        shutil.copyfile(lean_kernels.SOURCE, copy)
        _load_from(monkeypatch, copy)
    assert len({(c["build_directory"], tuple(c["sources"])) for c in fake_builder.calls}) == 1
    assert len(_building(caplog)) == 1


def test_a_new_source_torch_or_cpu_builds_apart(fake_builder, monkeypatch, tmp_path):
    edited = tmp_path / "lean_kernels.cpp"
    edited.write_bytes(lean_kernels.SOURCE.read_bytes() + b"\n// edited\n")
    _load_from(monkeypatch, lean_kernels.SOURCE)
    _load_from(monkeypatch, edited)
    monkeypatch.setattr(torch, "__version__", "9.9.9+cpu")
    _load_from(monkeypatch, edited)
    monkeypatch.setattr(lean_kernels, "_cpu_tag", lambda: "0123456789")
    _load_from(monkeypatch, edited)
    # another virtual environment: torch's include paths go into the build file, so it builds apart
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "other-venv" / "torch" / "__init__.py"))
    _load_from(monkeypatch, edited)
    assert len({c["build_directory"] for c in fake_builder.calls}) == 5


def test_a_cache_reached_through_a_symlink_builds_in_the_real_folder(fake_builder, monkeypatch, tmp_path):
    """The test session reaches the user's kernels through a symlink; torch's build file holds the
    folder's path, so a path through the link would rebuild the user's kernels on every switch."""
    _load_from(monkeypatch, lean_kernels.SOURCE)
    linked = tmp_path / "session"
    linked.mkdir()
    (linked / "lean_kernels").symlink_to(tmp_path / "cache" / "lean_kernels", target_is_directory=True)
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(linked))
    _load_from(monkeypatch, lean_kernels.SOURCE)
    first, second = (c["build_directory"] for c in fake_builder.calls)
    assert first == second and "session" not in second
