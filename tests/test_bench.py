"""`specdec-tune bench` on tiny saved models: the four methods agree and the JSON contract holds."""
from __future__ import annotations

import json

from specdec_tune.tuner.cli import main


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


def test_bench_rejects_bad_n(tiny_model_dirs, capsys):
    code = main(["bench", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"], "-N", "0"])
    assert code == 2 and "--num-speculative-tokens" in capsys.readouterr().err
