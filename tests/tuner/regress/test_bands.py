"""``regress`` checks an exported schedule's bands on a later build (issue 38, part 3): a benchmark with
``batch_sizes`` runs each band's N on the batched engine at that batch size, against the same batches decoded
plainly, and a later build whose batches decode other tokens fails the correctness cell of that band."""
from __future__ import annotations

import json

from specdec_tune.cli import main
from specdec_tune.engine import batch_decode

SCHEDULE = [[1, 1, 3], [2, 64, 2]]  # vLLM's ranges: N = 3 at B = 1, N = 2 from B = 2 on


def _files(tmp_path, target: str, draft: str) -> str:
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(
        ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)"])))
    (tmp_path / "tuned" / "vllm").mkdir(parents=True)
    (tmp_path / "tuned" / "vllm" / "speculative_config.json").write_text(json.dumps({
        "method": "draft_model", "model": draft, "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": SCHEDULE}))
    suite = tmp_path / "s.toml"
    suite.write_text(f"""name = "bands"
threads = 1
[[benchmark]]
name = "bands"
target = "{target}"
workload = "{workload}"
prompts = 4
max_new_tokens = 12
repeats = 1
export = "{tmp_path / 'tuned'}"
batch_sizes = [2]
""")
    return str(suite)


def _regress(suite: str, db: str, capsys) -> tuple[int, dict]:
    code = main(["regress", "--suite", suite, "--db", db, "--json"])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_regress_checks_each_band_of_an_exported_schedule(tmp_path, capsys, tiny_model_dirs, monkeypatch):
    suite = _files(tmp_path, tiny_model_dirs["target"], tiny_model_dirs["draft"])
    db = f"sqlite:///{tmp_path / 'r.db'}"
    code, report = _regress(suite, db, capsys)
    assert code == 3  # the first run is the baseline
    cells = {(c["benchmark"], c["metric"]): c for c in report["cells"]}
    assert cells[("bands@B=2", "correctness")]["verdict"] == "ok" and cells[("bands", "correctness")]["verdict"] == "ok"
    assert cells[("bands@B=2", "correctness")]["details"]["prompts"] == 2  # two batches of two prompts

    def mixed_up(verifiers, draft, logits, generator):  # a later build whose batches verify against the wrong row
        return real(verifiers, draft, logits.roll(1, dims=0), generator)

    real = batch_decode.verify_rows
    monkeypatch.setattr(batch_decode, "verify_rows", mixed_up)
    code, report = _regress(suite, db, capsys)
    cells = {(c["benchmark"], c["metric"]): c for c in report["cells"]}
    assert code == 1 and cells[("bands@B=2", "correctness")]["verdict"] == "fail"
    assert cells[("bands", "correctness")]["verdict"] == "ok"  # B = 1 runs the one-sequence engine, untouched
