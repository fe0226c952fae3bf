"""Suffix decoding in the model: the simulation on stored sequences (tuner/model/_suffix_sim.py) is the engine's
loop cycle for cycle, under each serving-history policy the profiler runs (profiler/suffix_history.py)."""
from __future__ import annotations

import pytest
import torch

from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.engine import DecodeConfig, build_drafter, speculative
from specdec_tune.profiler.suffix_history import SuffixHistory
from specdec_tune.tuner.model._suffix_sim import simulate_suffix
from tests.support.stub_models import Bigram

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
