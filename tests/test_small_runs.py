"""Small but legal settings end to end through the real CLI (issue 35, rows 3 and 5): every run either finishes
(exit 0), saying which statistic it could not compute and why, or is refused before it profiles (exit 2, one
`error:` line, no run stored)."""
from __future__ import annotations

import json

from specdec_tune.cli import main
from specdec_tune.db import list_measured, list_runs, open_database
from specdec_tune.latency import LatencySamples

PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
           "x = [i for i in range(3)]", "return a + b", "self.x = x"]


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def workload(folder, n: int) -> str:
    path = folder / f"w{n}.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(PROMPTS[:n])))
    return str(path)


def test_measure_where_some_requests_arrive_in_one_chunk(tiny_model_dirs, tmp_path, capsys):
    """Row 3: with --max-new-tokens 8 and N = 8 a request whose 8 tokens are all accepted arrives in one
    chunk and has no chunk gap; the gaps' bootstrap then drew resamples of such requests only and crashed
    (IndexError in latency._pooled_ci) after the whole measurement. Synthetic acceptance 0.9 makes some
    prompts arrive in one chunk and some in several, as the bundled mini models did."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    code, _, err = run(["profile", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"],
                        "--workload", workload(tmp_path, 8), "--db", url, "--device", "cpu", "--repeats", "1",
                        "--k-max", "9", "--n-max", "8", "--max-prompts", "2", "--max-new-tokens", "8",
                        "--context-lens", "8", "--synthetic-acceptance", "0.9"], capsys)
    assert code == 0, err
    code, out, err = run(["measure", "--run", "1", "-N", "8", "--split", "all", "--repeats", "1", "--db", url,
                          "--json"], capsys)
    assert code == 0, err
    db = open_database(url)
    row = next(m for m in list_measured(db, 1) if m.config.get("num_speculative_tokens") == 8 and m.latency)
    requests = LatencySamples.from_json(row.latency["requests"]).requests
    chunks = [len(r.tokens) for prompt in requests for r in prompt]
    assert min(chunks) == 1 and max(chunks) > 1, chunks  # the case of row 3: some requests have no chunk gap
    gaps = json.loads(out)["latency"]["measured"]["chunk_gap_s"]
    for entry in gaps.values():
        assert entry["value"] is not None and (entry["ci"] is not None or "prompt" in entry["why"]), entry
