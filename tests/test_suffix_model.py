"""Suffix decoding in the model: the simulation on stored sequences (tuner/model/_suffix_sim.py) is the engine's
loop cycle for cycle, under each serving-history policy the profiler runs (profiler/suffix_history.py);
the ``edits`` workload's layout keeps sessions inside one split."""
from __future__ import annotations

import json

import pytest
import torch

from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.core.splits import split_prompts
from specdec_tune.engine import DecodeConfig, build_drafter, speculative
from specdec_tune.engine.workloads import WORKLOADS_DIR, load_workload
from specdec_tune.profiler.suffix_history import SuffixHistory
from specdec_tune.tuner.model._suffix_sim import simulate_suffix
from tests.stub_models import Bigram

PROMPTS = [[3, 1, 0, 3, 1, 2, 3, 1], [0, 0, 5, 4, 0, 0, 5], [2, 3], [5, 4, 5, 4, 5], [1, 2, 1, 2], [4]]
MAX_NEW = 20


@pytest.fixture(scope="module")
def bigram():
    g = torch.Generator().manual_seed(5)
    return Bigram(torch.randn(6, 6, generator=g, dtype=torch.float64) * 2.0)


def engine_cycles(target, spec: SpeculativeConfig, history: SuffixHistory):
    """Every prompt decoded in order through the profiler's history; per prompt (output, [(L, A)])."""
    config = DecodeConfig(MAX_NEW, spec)
    out = []
    for prompt in PROMPTS:
        drafter = build_drafter(None, spec, max_len=0, suffix_cache=history.cache(config))
        res = speculative(target, drafter, torch.tensor(prompt), config)
        history.after_request(config)
        out.append((res.token_ids, [(c.drafted, c.accepted) for c in res.cycles]))
    return out


@pytest.mark.parametrize("policy", ["order", "warm", "cold"])
@pytest.mark.parametrize("fields", [dict(), dict(suffix_max_spec_factor=2.0, suffix_min_token_prob=0.0),
                                    dict(suffix_max_tree_depth=3, suffix_max_cached_requests=2, schedule="heuristic")])
def test_simulation_is_the_engine_loop(bigram, policy, fields):
    spec = SpeculativeConfig("suffix", 4, **fields)
    sequences = None
    if policy == "order":
        runs = engine_cycles(bigram, spec, SuffixHistory("order"))
    else:  # each prompt after every other one (warm), or after none (cold): leave-one-out, as the model pools
        order = engine_cycles(bigram, spec, SuffixHistory("order"))
        sequences = [(p, out) for p, (out, _) in zip(PROMPTS, order)]
        runs = []
        for i, prompt in enumerate(PROMPTS):
            others = [s for k, s in enumerate(sequences) if k != i]
            history = SuffixHistory("warm", warm=others) if policy == "warm" else SuffixHistory("cold")
            config = DecodeConfig(MAX_NEW, spec)
            res = speculative(bigram, build_drafter(None, spec, max_len=0, suffix_cache=history.cache(config)),
                              torch.tensor(prompt), config)
            runs.append((res.token_ids, [(c.drafted, c.accepted) for c in res.cycles]))
    sequences = sequences or [(p, out) for p, (out, _) in zip(PROMPTS, runs)]
    simulated = simulate_suffix(sequences, spec, MAX_NEW, policy)
    assert [[(c.proposed, c.accepted) for c in cycles] for cycles in simulated] == [cyc for _, cyc in runs]
    assert sum(a for _, cyc in runs for _, a in cyc) > 10  # the drafts were used


def test_history_policies_differ(bigram):
    """The global tree matters here: the same prompts accept more after earlier responses than cold."""
    spec = SpeculativeConfig("suffix", 4)
    accepted = {p: sum(a for _, cyc in engine_cycles(bigram, spec, SuffixHistory(p)) for _, a in cyc)
                for p in ("order", "cold")}
    assert accepted["order"] > accepted["cold"]


def test_new_pass_starts_the_history_again(bigram):
    spec = SpeculativeConfig("suffix", 4)
    history = SuffixHistory("order")
    first = engine_cycles(bigram, spec, history)
    again = engine_cycles(bigram, spec, history)  # the same requests again: the history remembers them
    history.new_pass()
    fresh = engine_cycles(bigram, spec, history)
    assert fresh == first != again


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
