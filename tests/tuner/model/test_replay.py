"""N-gram lookup's recorded cycles replayed at a smaller N: a cut cycle goes on along its matched
stretch (``tuner.model._replay.lookup_cycles``), and τ follows the engine's at that N."""
from __future__ import annotations

import random

import pytest

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import Trace
from specdec_tune.tuner.model._replay import lookup_cycles, replay


def _trace(proposed: int, accepted: int) -> Trace:
    return Trace(tuple([1.0] * proposed), accepted)


def test_a_long_match_becomes_several_cycles():
    got = [(len(t.confidences), t.num_accepted) for t in lookup_cycles([_trace(16, 10)], 3)]
    # 3 accepted + the bonus, 3 + the bonus, then 2 of 3 accepted: the 11 tokens of the stretch
    assert got == [(3, 3), (3, 3), (3, 2)]
    assert [(len(t.confidences), t.num_accepted) for t in lookup_cycles([_trace(5, 5)], 3)] == [(3, 3), (1, 1)]
    assert [(len(t.confidences), t.num_accepted) for t in lookup_cycles([_trace(16, 3)], 3)] == [(3, 3)]  # bonus wrong
    assert [(len(t.confidences), t.num_accepted) for t in lookup_cycles([_trace(16, 0), _trace(0, 0)], 3)] == \
        [(3, 0), (0, 0)]


def test_every_stretch_keeps_its_tokens_and_n_at_or_above_the_proposal_changes_nothing():
    rng = random.Random(7)
    traces = []
    for _ in range(400):
        proposed = rng.randint(0, 16)
        traces.append(Trace(tuple(rng.random() for _ in range(proposed)), rng.randint(0, proposed),
                            tuple(rng.random() for _ in range(proposed)), None))
    for n in (1, 2, 3, 6, 16):
        for t in traces:
            cycles = lookup_cycles([t], n)
            emitted = sum(c.num_accepted + 1 for c in cycles)
            if t.num_accepted < len(t.confidences):  # the stretch ends at a rejection: all of it is run
                assert emitted == t.num_accepted + 1  # a cut that drops the rest of the stretch fails
            else:  # the proposal ran out: what the lookup would draft past it was never recorded
                assert emitted <= t.num_accepted + 1
            assert all(len(c.confidences) <= n for c in cycles)
            start = 0
            for c in cycles:  # each cycle drafts the stretch's next positions; a full one's bonus is skipped
                assert c.confidences == t.confidences[start:start + len(c.confidences)]
                assert c.token_probs == t.token_probs[start:start + len(c.confidences)]
                start += len(c.confidences) + 1
            if n >= len(t.confidences):
                assert cycles == (t,)
    with pytest.raises(InputError):
        lookup_cycles(traces, 0)


@pytest.mark.slow
def test_tau_at_a_smaller_n_follows_the_engine():
    """Real n-gram decoding with the bundled target: cycles recorded at N = 16, replayed at N = 2 and 3,
    against the engine run at those N on the same 12 prompts (greedy: deterministic). Cutting each
    recorded cycle at N (the replay of a model draft's sampled cycles) misses the long matches (here
    τ 2.7 % and 2.6 % low); the lookup cycles must come within 1.5 %."""
    from specdec_tune.engine import DecodeConfig, load_model
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.runs import DraftSpec, decode_once, encode_prompt

    target = load_model("mini-target", "cpu", "float32", "lean")
    ids = [encode_prompt(target, p.prompt, p.id) for p in load_workload("functions")[:12]]
    runs: dict[int, list] = {16: [], 2: [], 3: []}
    for x in ids:
        for n, sink in runs.items():
            config = DecodeConfig(max_new_tokens=64, num_speculative_tokens=n, eos_token_id=target.eos_token_id)
            decode_once(target, DraftSpec("ngram"), x, config, on_cycle=sink.append)
    traces = [Trace(tuple(c.confidences), c.accepted) for c in runs[16]]
    for n in (2, 3):
        measured = sum(c.accepted + 1 for c in runs[n]) / len(runs[n])
        split = replay(lookup_cycles(traces, n), n).mean_tau
        cut = replay(traces, n).mean_tau
        print(f"tau at N={n}: engine {measured:.3f}, lookup cycles {split:.3f}, cut cycles {cut:.3f}")
        assert split == pytest.approx(measured, rel=0.015)
        assert abs(split - measured) < abs(cut - measured)
