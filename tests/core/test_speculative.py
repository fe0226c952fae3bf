"""The speculative configuration is one record (core/speculative.py): every room holds it, plain decoding
has one value, old stored forms read back, and the decode loop takes its strategies as objects."""
from __future__ import annotations

from dataclasses import fields, replace

import pytest
import torch

from specdec_tune.core.errors import InputError
from specdec_tune.core.limits import MAX_SPECULATIVE_TOKENS
from specdec_tune.core.speculative import FIELD_NAMES, NGRAM, PLAIN, SpeculativeConfig
from specdec_tune.engine import DecodeConfig, GreedyVerifier, LoadBudget, SamplingVerifier, ScheduleBudget
from specdec_tune.engine import choose_budget, choose_verifier, speculative
from specdec_tune.engine.drafters import NgramDrafter
from specdec_tune.engine.verifiers import SyntheticVerifier
from specdec_tune.profiler import ArmSpec, MeasureSpec
from specdec_tune.tuner.model import Candidate, SpecConfig, Trace, replay_reach, spec_config
from tests.support.stub_models import Bigram

# The keys a stored Candidate dict has always had, in order (study user attributes, reports, the dashboard).
CANDIDATE_KEYS = ["drafter", "num_speculative_tokens", "threshold", "threshold_rule", "schedule", "ngram_max",
                  "ngram_min", "threshold_kind", "threshold_step", "acceptance", "epsilon", "tree", "staged"]


@pytest.mark.parametrize("holder", [DecodeConfig, SpecConfig, MeasureSpec, ArmSpec])
def test_every_room_holds_the_record_and_repeats_none_of_its_fields(holder):
    own = {f.name for f in fields(holder)}
    assert "spec" in own and not own & FIELD_NAMES, own & FIELD_NAMES


def test_the_tuners_candidate_is_the_record():
    assert Candidate is SpeculativeConfig
    c = Candidate("d", 4, 0.3, "hf", "heuristic")
    assert spec_config(c, "sampling", 8).spec == c


@pytest.mark.parametrize("spelling", [SpeculativeConfig("none", 0), SpeculativeConfig("ngram", 0, threshold=0.3),
                                      SpeculativeConfig(None, 0, schedule="heuristic"),
                                      SpeculativeConfig("d", 0, acceptance="opt", epsilon=0.1)])
def test_plain_decoding_has_one_value(spelling):
    assert spelling == PLAIN and spelling.is_plain and spelling.drafter == "none"
    assert spelling.label() == "plain decoding"
    assert SpecConfig(0, threshold=0.5).spec == PLAIN


def test_a_drafter_none_with_tokens_to_draft_is_refused():
    with pytest.raises(InputError, match="plain decoding"):
        SpeculativeConfig("none", 3)
    with pytest.raises(InputError, match="plain decoding"):
        replace(PLAIN, num_speculative_tokens=3)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1}, f"0..{MAX_SPECULATIVE_TOKENS}, got 65"),
    ({"num_speculative_tokens": -1}, "got -1"),
    ({"num_speculative_tokens": True}, "got True"),
    ({"threshold": 1.0}, "threshold must lie in [0, 1)"),
    ({"schedule": "wild"}, "'wild'"),
    ({"threshold": 0.3, "threshold_rule": "hf", "threshold_kind": "cumulative"}, "needs threshold_rule 'before'"),
    ({"threshold": 0.3, "threshold_kind": "adaptive", "threshold_step": 0.0}, "threshold_step"),
    ({"acceptance": "opt", "epsilon": 1.5}, "epsilon"),
    ({"acceptance": "exact", "epsilon": 0.1}, "epsilon must be 0"),
    ({"drafter": NGRAM, "ngram_min": 4, "ngram_max": 3}, "ngram_min <= ngram_max"),
])
def test_the_record_validates_once_for_every_room(kwargs, words):
    with pytest.raises(InputError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        SpeculativeConfig(**{"drafter": "d", "num_speculative_tokens": 4, **kwargs})
    with pytest.raises(ValueError):  # the engine's record reports it as before: a ValueError
        DecodeConfig(8, **{"num_speculative_tokens": 4, **kwargs})


def test_the_engine_record_drafts_at_least_one_token_and_keeps_its_own_rules():
    with pytest.raises(ValueError, match="1..64, got 0"):
        DecodeConfig(8, PLAIN)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        DecodeConfig(8, acceptance="opt", epsilon=0.1)
    with pytest.raises(TypeError, match="threshhold"):
        DecodeConfig(8, threshhold=0.3)
    cfg = DecodeConfig(8, num_speculative_tokens=3, threshold=0.2)
    assert cfg.spec == SpeculativeConfig(None, 3, 0.2) and cfg.room == 8 + 3 + 2
    assert replace(cfg, num_speculative_tokens=5).spec.num_speculative_tokens == 5


def test_to_dict_writes_the_keys_stored_candidates_have():
    c = Candidate("mini-draft-1l", 6, 0.35, "before", "heuristic", tree="", staged="ngram")
    assert list(c.to_dict()) == CANDIDATE_KEYS
    assert Candidate.from_dict(c.to_dict()) == c


@pytest.mark.parametrize(("stored", "read"), [
    # a Candidate stored before threshold kinds, lossy acceptance, trees and staged drafting existed
    ({"drafter": "d", "num_speculative_tokens": 5, "threshold": 0.3, "threshold_rule": "hf", "schedule": "constant",
      "ngram_max": 3, "ngram_min": 1}, SpeculativeConfig("d", 5, 0.3, "hf")),
    # a regression benchmark (the drafter under "draft") with the keys of its other settings
    ({"draft": "ngram", "num_speculative_tokens": 5, "threshold": 0.0, "schedule": "constant", "temperature": 0.0,
      "prompts": 12, "backend": "engine"}, SpeculativeConfig(NGRAM, 5)),
    # a report's None for a step that does not apply
    ({"drafter": "d", "num_speculative_tokens": 2, "threshold_kind": "per-token", "threshold_step": None},
     SpeculativeConfig("d", 2)),
    # plain decoding in its old spellings
    ({"drafter": "none", "num_speculative_tokens": 4, "threshold": 0.2}, PLAIN),
    ({"draft": "d", "num_speculative_tokens": 0, "schedule": "heuristic"}, PLAIN),
])
def test_from_dict_reads_every_stored_form(stored, read):
    assert SpeculativeConfig.from_dict(stored) == read


def test_a_measured_row_keeps_its_keys_and_their_order():
    assert list(PLAIN.to_row().items()) == [
        ("num_speculative_tokens", 0), ("threshold", 0.0), ("schedule", "constant"), ("threshold_rule", "before"),
        ("threshold_kind", "per-token"), ("threshold_step", 0.05), ("acceptance", "exact"), ("epsilon", 0.0)]
    row = SpeculativeConfig("d", 3, tree="chains:2").to_row()
    assert list(row)[-1] == "tree" and "staged" not in row and "drafter" not in row
    assert SpeculativeConfig.from_dict(row) == SpeculativeConfig(None, 3, tree="chains:2")


@pytest.mark.parametrize(("c", "label"), [
    (Candidate("mini-draft-1l", 4, 0.3), "mini-draft-1l N=4 θ=0.3"),
    (Candidate("d", 4, 0.3, "hf", "heuristic"), "d N=4 θ=0.3 (hf rule) heuristic"),
    (Candidate(NGRAM, 5, ngram_max=4, ngram_min=2), "ngram N=5 ngram 2..4"),
    (Candidate("d", 4, 0.2, threshold_kind="adaptive", threshold_step=0.1), "d N=4 adaptive θ from 0.2 step 0.1"),
    (Candidate("d", 3, acceptance="opt", epsilon=0.05, staged="ngram"), "d N=3 OPT ε=0.05 staged by ngram"),
])
def test_labels_are_unchanged(c, label):
    assert c.label() == label


def test_the_largest_n_the_traces_can_replay_is_their_longest_draft():
    traces = [Trace((0.9, 0.8), 1), Trace((0.9,) * 5, 5), Trace((), 0)]
    assert replay_reach(traces) == 5 and replay_reach([]) == 0
    from specdec_tune.core.limits import MAX_SEARCHED_TOKENS
    from specdec_tune.db import RunSettings

    assert RunSettings.model_validate({"n_max": 8}).n_max == 8
    assert RunSettings.model_validate({}).n_max == MAX_SEARCHED_TOKENS  # a run that did not store it: the default


def test_the_verifier_and_the_budget_are_chosen_before_the_loop():
    prompt = torch.tensor([1, 2, 3])
    assert type(choose_verifier(DecodeConfig(8), prompt)) is GreedyVerifier
    assert type(choose_verifier(DecodeConfig(8, synthetic_acceptance=(0.5,)), prompt)) is SyntheticVerifier
    assert type(choose_verifier(DecodeConfig(8, temperature=1.0, acceptance="opt", epsilon=0.1), prompt)) \
        is SamplingVerifier
    assert type(choose_budget(SpeculativeConfig(num_speculative_tokens=4))) is ScheduleBudget
    assert type(choose_budget(SpeculativeConfig(num_speculative_tokens=4), lambda i: 2)) is LoadBudget
    heuristic = ScheduleBudget("heuristic", 4)
    seen = []
    for drafted, accepted in ((4, 4), (4, 1), (3, 0), (2, 2), (0, 0)):
        seen.append(heuristic.limit(len(seen)))
        heuristic.observe(drafted, accepted)
    assert seen == [4, 4, 3, 2, 4]


def test_the_loop_runs_whatever_verifier_and_budget_it_is_handed():
    """A planted verifier sees every cycle and a server's N of 0 makes a plain step, through the same loop."""
    vocab = 6
    table = torch.full((vocab, vocab), -9.0)
    for t in range(vocab):
        table[t, (t + 1) % vocab] = 0.0  # the target continues 0 1 2 3 4 5 0 1 ...
    target = Bigram(table)
    calls = []

    class Counting(GreedyVerifier):
        def __call__(self, draft, logits, generator):
            calls.append(draft.length)
            return super().__call__(draft, logits, generator)

    prompt = torch.tensor([0, 1, 2, 0, 1, 2])
    cfg = DecodeConfig(12, num_speculative_tokens=3)
    base = speculative(target, NgramDrafter(), prompt, cfg)
    out = speculative(target, NgramDrafter(), prompt, cfg, verifier=Counting(),
                      budget=LoadBudget(ScheduleBudget("constant", 3), lambda i: 0 if i % 2 else 3))
    assert out.token_ids == base.token_ids == [3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert len(calls) == len(out.cycles) and all(calls[i] == 0 for i in range(1, len(calls), 2))
