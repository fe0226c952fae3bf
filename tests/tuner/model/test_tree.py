"""The tree model: greedy tree cycles simulated from recorded ranks equal the engine's cycles; the
sampling recursion, the draft-width line, the search space, the capability table and the exports."""
from __future__ import annotations

import pytest
import torch

from specdec_tune.engine import DecodeConfig, autoregressive
from specdec_tune.engine.tree_decode import tree_speculative
from specdec_tune.engine.tree_draft import TreeDrafter
from specdec_tune.core.errors import InputError, SpecdecError
from specdec_tune.profiler.tree_profile import rank_rows
from specdec_tune.core.trees import chains_shape, parse_tree
from specdec_tune.tuner.model import Candidate, TreeData, TuningResult, expected_tau, simulate_tree
from specdec_tune.tuner.model._tree import _static_depth
from specdec_tune.tuner.search import server_search_space, shape_candidate
from specdec_tune.tuner.servers import SERVERS, expressible, project, render_exports
from tests.engine.test_tree import VOCAB, noisy_pair  # noqa: F401  (the fixture)

STATIC = ["chains:2", "topk:2-2", "sequoia:8", "topk:3-1-2"]


def _engine_and_ranks(pair, tree: str, seed: int, depth: int = 4, new: int = 40):
    target, draft = pair
    prompt = torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(seed))
    config = DecodeConfig(max_new_tokens=new, num_speculative_tokens=depth)
    a = (0.6, 0.2, 0.1, 0.05)
    with torch.no_grad():
        result = tree_speculative(target, TreeDrafter(draft, 128, parse_tree(tree), rank_accept=a), prompt, config)
        out = autoregressive(target, prompt, config).token_ids
    seq = torch.cat([prompt, torch.tensor(out)])
    ranks = rank_rows(draft, [seq], [prompt.shape[0]])[0]
    return result, ranks, a


@pytest.mark.parametrize("tree", [t if t == "sequoia:8" else pytest.param(t, marks=pytest.mark.slow) for t in STATIC])
def test_greedy_tree_simulation_reproduces_the_engine_cycle_by_cycle(noisy_pair, tree):
    """From the teacher-forced ranks alone, every cycle's accepted count and node count equal the
    engine's; a simulation reading the rank one position late does not (the comparison has power)."""
    for seed in range(3):
        result, ranks, a = _engine_and_ranks(noisy_pair, tree, seed)
        sim = simulate_tree(ranks["ranks"], ranks["top"], result.new_tokens, 40, 4, parse_tree(tree), a)
        assert [(c.nodes, c.accepted) for c in sim] == [(c.drafted, c.accepted) for c in result.cycles], seed
    shifted = simulate_tree([0] + ranks["ranks"], ranks["top"], result.new_tokens, 40, 4, parse_tree(tree), a)
    assert [c.accepted for c in shifted] != [c.accepted for c in result.cycles]


def test_static_depth_follows_the_recorded_ranks():
    shape = chains_shape(2, 3)  # root children ranks 0, 1; each continues with rank 0
    assert _static_depth(shape, [1, 0, 0, 5], 0) == 3
    assert _static_depth(shape, [1, 1, 0], 0) == 1
    assert _static_depth(shape, [2, 0], 0) == 0
    assert _static_depth(shape, [0, 0, 0, 0], 2) == 2  # stops at the end of the output


def test_expected_tau_recursion_by_hand():
    """Two i.i.d. siblings at the root, chains below: E[τ] = 1 + Σ_m P(m) (1 + b), with P(1) = β1 and
    P(2) = (1 - β1) β2, and one node below each accepted with β1 of the next position."""
    betas = [[0.5, 0.4], [0.8, 0.3]]
    tau = expected_tau(chains_shape(2, 2), lambda pos: betas[pos] if pos < len(betas) else (), 0)
    assert tau == pytest.approx(1 + 0.5 * (1 + 0.8) + 0.5 * 0.4 * (1 + 0.8))


def test_width_line_ignores_an_outlier():
    from dataclasses import dataclass

    from specdec_tune.tuner.model import width_time

    @dataclass
    class _Model:
        draft_step_s: dict
        verify_s: dict

    @dataclass
    class _RP:
        model: _Model
        draft_step_raw_s: dict

    rp = _RP(_Model({1: 2e-3}, {1: {1: 1e-2}}), {1: 1e-3})
    data = TreeData(ranks=(), width_raw_s={2: 1.1e-3, 3: 9e-3, 4: 1.3e-3, 5: 1.4e-3, 6: 1.5e-3})  # w = 3 loaded
    assert width_time(rp, data, 3) == pytest.approx(2e-3 * 1.2, rel=0.05)  # the line, not the 9 ms sample
    assert width_time(rp, data, 1) == pytest.approx(2e-3)


# --------------------------------------------------------------------------- space, table, exports


def test_space_holds_trees_where_the_server_runs_them():
    drafts = ["mini-draft-1l", "mini-draft-2l"]
    kwargs = dict(shapes=("chains:2", "sequoia:8", "eagle:2:6"), max_nodes=8,
                  staged_pairs=(("mini-draft-2l", "ngram"), ("mini-draft-2l", "mini-draft-1l")))
    anyspace = server_search_space("any", drafts, 6, True, **kwargs)
    trees = [c for c in anyspace.candidates() if c.tree]
    assert {c.tree for c in trees} == {"chains:2", "sequoia:8", "eagle:2:6"}
    assert all(parse_tree(c.tree).nodes(c.num_speculative_tokens) <= 8 for c in trees)
    assert not any(c.tree == "chains:2" and c.num_speculative_tokens > 4 for c in trees)  # 2 × N > 8 nodes
    assert {(c.drafter, c.staged) for c in anyspace.candidates() if c.staged} == set(kwargs["staged_pairs"])
    sglang = server_search_space("sglang", drafts, 6, True, **kwargs)
    assert sglang.shapes == ("eagle:2:6",) and sglang.staged_pairs == ()
    for server in ("vllm", "trtllm", "llamacpp", "hf"):
        space = server_search_space(server, drafts, 6, True, **kwargs)
        assert space.shapes == () and space.staged_pairs == () and not any(c.tree or c.staged for c in space.candidates())


def test_capability_table_refuses_and_projects_trees():
    tree = Candidate("mini-draft-2l", 4, tree="sequoia:8")
    assert "one chain" in expressible(SERVERS["vllm"], tree)
    assert "only eagle" in expressible(SERVERS["sglang"], tree)
    assert expressible(SERVERS["sglang"], Candidate("mini-draft-2l", 4, tree="eagle:2:6")) is None
    assert "staged" in expressible(SERVERS["sglang"], Candidate("mini-draft-2l", 4, staged="ngram"))
    assert project(SERVERS["vllm"], tree) == Candidate("mini-draft-2l", 4)
    assert shape_candidate("d", 3, "staged:ngram") == Candidate("d", 3, staged="ngram")


def _result(c: Candidate, **extra) -> TuningResult:
    return TuningResult(candidate=c, server="any", target="mini-target", workload="functions", **extra)


def test_sglang_exports_the_dynamic_tree_and_other_servers_the_best_chain():
    c = Candidate("mini-draft-2l", 5, tree="eagle:3:10")
    chain = Candidate("mini-draft-2l", 4)
    files = render_exports(_result(c, best_per_server={s: {**chain.to_dict(), "predicted_tokens_per_s": 1.0}
                                                        for s in ("vllm", "trtllm", "llamacpp", "hf")}), ["all"])
    flags = dict(files["sglang"])["sglang/flags.txt"]
    assert "--speculative-eagle-topk\n3" in flags or "--speculative-eagle-topk 3" in flags
    assert "11" in flags and "STANDALONE" in flags  # 10 nodes + the root
    readme = dict(files["readme"])["README.md"]
    assert "one chain" in readme and "N=4" in readme  # the substitution is said, with the chain written
    with pytest.raises(InputError, match="one chain"):
        render_exports(_result(Candidate("mini-draft-2l", 4, tree="chains:2")), ["vllm"])


# --------------------------------------------------------------------------- profile --trees -> predictions


@pytest.mark.slow
def test_profile_with_trees_stores_tree_data_and_the_evaluator_predicts_trees(tiny_model_dirs, tmp_path):
    """A tiny ``profile --trees`` (greedy and sampling) stores ranks, sibling acceptance, draft widths and
    the staged pass; the evaluator then predicts trees and staged drafting, and refuses what it cannot."""
    import json
    from dataclasses import replace

    from specdec_tune.db import load_timings, load_tree_traces, open_database
    from specdec_tune.profiler.session import ProfileSession
    from specdec_tune.tuner.model import Evaluator, load_tree_data
    from tests.profiler.test_session import TINY

    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": t}) for i, t in
                              enumerate(["def add(a, b):", "class Point:", "for i in range(3):", "x = 1"])) + "\n")
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    settings = replace(TINY, trees=True, temperature=1.0, k_max=9)
    draft = tiny_model_dirs["draft"]
    run_id = ProfileSession(db, tiny_model_dirs["target"], [draft, "ngram"], str(path), settings).run().run_id
    kinds = {r.kind for r in load_tree_traces(db, run_id, draft)}
    assert kinds == {"ranks", "siblings", "staged", "overhead"}
    assert {r.k for r in load_timings(db, run_id, kind="draft_width")} == set(range(2, 9))
    data = load_tree_data(db, run_id, draft)
    assert len(data.ranks) == 2 and all(len(r) >= 1 for r in data.ranks)
    assert sum(data.rank_accept) <= 1 + 1e-9 and set(data.staged) == {"ngram"}
    assert data.staged["ngram"].cycles and data.overhead and {d for d, *_ in data.overhead} == {0, 1}
    assert data.width_in_loop_s and min(data.width_in_loop_s) >= 1
    sampled = load_tree_data(db, run_id, draft, "sampling")  # the timed passes of the sampling mode
    assert sampled.overhead and sampled.overhead != data.overhead and sampled.staged["ngram"] != data.staged["ngram"]
    assert all(0 <= b <= 1 for prompt in data.iid for row in prompt for b in row)
    for mode in ("greedy", "sampling"):
        ev = Evaluator(db, run_id, mode)
        chain = ev.score(Candidate(draft, 3))
        for c in (Candidate(draft, 3, tree="chains:2"), Candidate(draft, 2, tree="sequoia:4"),
                  Candidate(draft, 3, staged="ngram")):
            s = ev.score(c)
            assert s.predicted_tokens_per_s > 0 and s.expected_tokens_per_cycle >= 1, c
        assert ev.score(Candidate(draft, 3, tree="chains:2")).expected_tokens_per_cycle >= \
            chain.expected_tokens_per_cycle - 1e-9 or mode == "sampling"
        with pytest.raises(InputError, match="k <= 9"):
            ev.score(Candidate(draft, 4, tree="chains:3"))  # 12 nodes: beyond the measured T_v(k)
        with pytest.raises(SpecdecError, match="mini-draft-9l"):
            ev.score(Candidate(draft, 3, staged="mini-draft-9l"))


@pytest.mark.parametrize("trees,needle", [("bogus:3", "tree 'bogus:3' is not valid"), ("sequoia:0", "is not valid"),
                                          ("chain", "is a chain")])
def test_tune_refuses_a_bad_tree_in_one_line(tmp_path, trees, needle):
    from tests.conftest import cli_stderr

    code, err = cli_stderr(["tune", "--target", "mini-target", "--drafts", "mini-draft-1l", "--workload", "functions",
                            "--trees", trees, "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "x.db").exists() or (tmp_path / "x.db").stat().st_size < 200_000


def test_tune_measures_the_best_chain_beside_trees():
    """When trees and staged drafters fill the top predictions, the best predicted chain is measured too:
    a tree wins only by measuring faster than it."""
    from specdec_tune.tuner.model import Scored
    from specdec_tune.tuner.search._tune import _distinct_top

    def scored(c: Candidate, tps: float) -> Scored:
        return Scored(c, tps, tps / 50, 3.0, "test")

    ranked = [scored(Candidate("d", 5, tree="sequoia:8"), 110), scored(Candidate("d", 4, staged="ngram"), 109),
              scored(Candidate("d", 6, tree="chains:2"), 108), scored(Candidate("d", 4), 107),
              scored(Candidate("none", 0), 50)]
    top = _distinct_top(ranked, 3)
    assert [s.candidate for s in top] == [ranked[0].candidate, ranked[1].candidate, Candidate("d", 4)]
    assert [s.candidate for s in _distinct_top(ranked, 1)] == [ranked[0].candidate, Candidate("d", 4)]
    chains_first = [ranked[3], *ranked[:3]]
    assert [s.candidate for s in _distinct_top(chains_first, 2)] == [Candidate("d", 4), ranked[0].candidate]
