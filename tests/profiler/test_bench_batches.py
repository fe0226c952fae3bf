"""``bench --batch-sizes`` (issue 38, part 2): our plain and speculative engine at B > 1, each batch timed,
the speedup's CI over batches, and every row's greedy output judged against its prompt decoded alone by the
consistency rule (float32: identical; bfloat16: identical or parted at a near-tie)."""
from __future__ import annotations

import json

import pytest

from specdec_tune.cli import main
from specdec_tune.engine import batch_decode, load_model
from specdec_tune.profiler import encode_prompt, run_bench_batches

PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "return a + b"]


def _bench(dirs, dtype="float32", batch_sizes=(2,)):
    target = load_model(dirs["target"], "cpu", dtype=dtype)
    draft = load_model(dirs["draft"], "cpu", dtype=dtype)
    ids = [encode_prompt(target, p) for p in PROMPTS]
    return run_bench_batches(target, draft, ids, batch_sizes, num_speculative_tokens=3, max_new_tokens=10, repeats=1)


def test_batches_are_timed_and_every_row_is_judged_against_its_prompt_alone(tiny_model_dirs):
    (b,) = _bench(tiny_model_dirs)
    j = b.to_json()
    assert j["batches"] == [[0, 1], [2, 3]] and j["ci_unit"] == "batch"  # the partial rest (prompt 4) is not decoded
    assert all(r > 0 for r in j["tokens_per_s"].values()) and j["speedup_ci95"] is not None
    lo, hi = j["speedup_ci95"]
    assert lo <= j["speedup"] <= hi
    assert {i for i, _ in b.consistency} == {0, 1, 2, 3} and j["consistency"]["verdict"] == "identical"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_batch_that_verifies_against_the_wrong_row_is_caught(tiny_model_dirs, monkeypatch, dtype):
    real = batch_decode.verify_rows

    def mixed_up(verifiers, draft, logits, generator):
        return real(verifiers, draft, logits.roll(1, dims=0), generator)

    monkeypatch.setattr(batch_decode, "verify_rows", mixed_up)
    (b,) = _bench(tiny_model_dirs, dtype)
    j = b.to_json()
    assert j["consistency"]["verdict"] == "differ" and j["consistency"]["prompts_parted"]
    assert all(c.status != "differ" for (_, m), c in b.consistency.items() if m == "ours_baseline")


def test_bfloat16_batches_keep_the_reduced_precision_rule(tiny_model_dirs):
    (b,) = _bench(tiny_model_dirs, dtype="bfloat16")
    assert {c.dtype for c in b.consistency.values()} == {"bfloat16"}
    assert b.to_json()["consistency"]["verdict"] in ("identical", "near-tie"), b.consistency


@pytest.mark.slow
def test_bench_batch_sizes_prints_a_row_per_batch_size(tiny_model_dirs, tmp_path, capsys):
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    args = ["bench", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"], "-N", "2",
            "--workload", str(workload), "--max-prompts", "4", "--max-new-tokens", "8", "--compare", "none",
            "--device", "cpu", "--batch-sizes", "1,2"]
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["per_batch_size"]
    assert [r["batch_size"] for r in rows] == [2] and rows[0]["batches"] == [[0, 1], [2, 3]]
    assert main([*args[:-1], "4,8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "needs at least 8 prompts" in err and len(err.splitlines()) == 1
