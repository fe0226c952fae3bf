"""`specdec-tune bench` on tiny saved models: the four methods agree and the JSON contract holds."""
from __future__ import annotations

import json

import pytest

from specdec_tune.cli import main


def test_bench_json(tiny_model_dirs, tmp_path, capsys):
    prompts = tmp_path / "w.jsonl"
    prompts.write_text('{"id": "1", "prompt": "def add(a, b):"}\n{"id": "2", "prompt": "class Point:\\n"}\n')
    code = main(["bench", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"], "-N", "3",
                 "--workload", str(prompts), "--max-new-tokens", "10", "--device", "cpu", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    res = json.loads(out)
    assert res["outputs_identical"] is True and res["mismatches"] == []
    assert set(res["tokens_per_s"]) == {"hf_generate", "hf_assisted", "ours_baseline", "ours_speculative"}
    assert all(v > 0 for v in res["tokens_per_s"].values())
    assert res["new_tokens"]["hf_generate"] == res["new_tokens"]["ours_speculative"] > 0
    r = res["ratios"]["ours_speculative/hf_assisted"]
    assert abs(r - res["tokens_per_s"]["ours_speculative"] / res["tokens_per_s"]["hf_assisted"]) < 1e-9
    assert res["forward"] == {"target": "lean", "draft": "lean"}


@pytest.mark.slow
def test_bench_hf_forward_gives_the_same_outputs(tiny_model_dirs, tmp_path, capsys):
    prompts = tmp_path / "w.jsonl"
    prompts.write_text('{"id": "1", "prompt": "for i in range(10):"}\n')
    code = main(["bench", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"], "-N", "2",
                 "--workload", str(prompts), "--max-new-tokens", "12", "--device", "cpu", "--forward", "hf", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert code == 0 and res["forward"] == {"target": "hf", "draft": "hf"} and res["outputs_identical"] is True


def test_forward_lean_refuses_a_model_it_cannot_run(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.support.tiny import CORPUS, tiny_tokenizer

    tok = tiny_tokenizer(CORPUS, vocab=280)
    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, n_positions=64)).save_pretrained(folder)
    tok.save_pretrained(folder)
    code = main(["generate", "--target", str(folder), "--prompt", "def f():", "--max-new-tokens", "3",
                 "--device", "cpu", "--forward", "lean"])
    err = capsys.readouterr().err
    assert code == 2 and "--forward lean cannot run" in err and "gpt2" in err
    code = main(["generate", "--target", str(folder), "--prompt", "def f():", "--max-new-tokens", "3",
                 "--device", "cpu", "--forward", "auto", "--json"])  # auto: HF's forward runs it
    assert code == 0 and json.loads(capsys.readouterr().out)["new_tokens"] == 3


def test_bench_rejects_bad_n(tiny_model_dirs, capsys):
    code = main(["bench", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"], "-N", "0"])
    assert code == 2 and "--num-speculative-tokens" in capsys.readouterr().err


def test_bench_hides_only_the_warning_transformers_raises_against_its_own_assisted_generation():
    import logging

    from specdec_tune.profiler.bench import configure_assistant
    from tests.support.tiny import tiny_llama

    class _Draft:  # what configure_assistant reads of a LoadedModel
        hf = tiny_llama(seed=1)

    class _Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    configure_assistant(_Draft(), 3)
    hf_log = logging.getLogger("transformers.generation.utils")  # transformers' loggers do not propagate
    kept = _Kept()
    hf_log.addHandler(kept)
    try:
        hf_log.warning("Passing `generation_config` together with generation-related arguments=({'use_cache'}) ...")
        hf_log.warning("some other transformers warning")
    finally:
        hf_log.removeHandler(kept)
    assert kept.messages == ["some other transformers warning"]
