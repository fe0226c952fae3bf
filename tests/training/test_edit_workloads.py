"""The bundled ``edits`` workload (training/edit_workloads.py, engine/zoo/workloads/edits.jsonl): three-turn
sessions whose later turns carry the earlier turns and the target's answers, each session inside one split."""
from __future__ import annotations

import json

from specdec_tune.core.splits import split_prompts
from specdec_tune.engine.workloads import WORKLOADS_DIR, load_workload


def test_edits_sessions_stay_in_one_split():
    records = [json.loads(line) for line in (WORKLOADS_DIR / "edits.jsonl").read_text().splitlines() if line.strip()]
    prompts = load_workload("edits")
    assert [p.id for p in prompts] == [r["id"] for r in records] and len(records) >= 40
    tune = {r["session"] for r in split_prompts(records, "tune")}
    held = {r["session"] for r in split_prompts(records, "holdout")}
    assert tune and held and not tune & held
    by_session: dict[int, list[dict]] = {}
    for r in records:
        by_session.setdefault(r["session"], []).append(r)
    for turns in by_session.values():
        assert [t["turn"] for t in turns] == [1, 2, 3]
        # a later turn carries the earlier turn's prompt (and the target's answer to it)
        assert turns[1]["prompt"].startswith(turns[0]["prompt"]) and turns[2]["prompt"].startswith(turns[1]["prompt"])


def test_edit_workload_builder_pairs_sessions_and_feeds_answers():
    from specdec_tune.training.corpus import SourceFile
    from specdec_tune.training.edit_workloads import build_edit_workload

    body = "".join(f"    x{i} = a + {i}\n" for i in range(6))
    files = [SourceFile(f"m{k}.py", f"def f{k}(a, b):\n{body}    return x0\n") for k in range(5)]
    answers = []

    def answer(text: str) -> str:
        answers.append(text)
        return f"ANSWER{len(answers)}"

    records = build_edit_workload(files, lambda t: len(t.split()), answer, sessions=4, min_tokens=4, max_tokens=400)
    assert [(r["session"], r["turn"]) for r in records[:6]] == [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3)]
    assert len(records) == 12 and len(answers) == 8  # two answered turns per session
    first, second = records[0]["prompt"], records[2]["prompt"]
    assert "def f" in first and "_v2(a, b):\n" in first and first.endswith("    ")
    assert second.startswith(first) and "ANSWER" in second and "strict=False" in second
