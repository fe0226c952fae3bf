"""Suffix decoding's trees and speculation rule (core/suffix.py) on cases worked by hand, and the suffix
fields of the speculative configuration (core/speculative.py)."""
from __future__ import annotations

import pytest

from specdec_tune.core.errors import InputError
from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.core.suffix import SuffixTree

SEQ = [1, 2, 3, 1, 2, 4, 1, 2, 3]  # "2" occurs 3 times: followed by 3 (twice) and 4 (once)


def test_counts_give_the_draft_and_its_probabilities():
    t = SuffixTree(8)
    t.extend(0, SEQ)
    # Match "2" (cap 1·1 = 1 token): 3 with 2/3. Match "1 2" (cap 2): 3 (2/3), then "1 2 3" occurs twice,
    # once at the end (no continuation), once followed by 1: 2/3 · 1/2. Score 1.0 beats 0.67: the longer match.
    d = t.speculate([5, 1, 2], 5, 1.0, 0.1)
    assert d.tokens == (3, 1) and d.parents == (-1, 0) and d.match_len == 2
    assert d.probs == pytest.approx((2 / 3, 1 / 3)) and d.score == pytest.approx(1.0)


def test_match_length_caps_the_draft_and_min_prob_cuts_it():
    t = SuffixTree(8)
    t.extend(0, SEQ)
    assert t.speculate([3, 1, 2], 5, 2.0, 0.1).tokens == (3, 1, 2, 4)  # α = 2: up to 2·2 tokens
    assert t.speculate([3, 1, 2], 5, 0.5, 0.1).tokens == (3,)  # α = 0.5: floor(0.5·2) = 1
    assert t.speculate([3, 1, 2], 5, 2.0, 0.5).tokens == (3,)  # 1/3 < 0.5 stops after the first token
    assert t.speculate([3, 1, 2], 5, 0.0, 0.1).tokens == ()  # α = 0 drafts nothing
    assert t.speculate([7, 7], 5, 1.0, 0.0).tokens == ()  # no match


def test_tree_mode_keeps_every_branch_above_min_prob():
    t = SuffixTree(8)
    t.extend(0, SEQ)
    d = t.speculate([3, 1, 2], 5, 2.0, 0.1, tree=True)
    assert set(zip(d.tokens, d.parents)) >= {(3, -1), (4, -1)}  # both continuations of "1 2"
    assert d.score == pytest.approx(sum(d.probs))


def test_ties_keep_the_earlier_child_first():
    # "1" is followed by 1 then by 0 (one each): the child created first stays first (arctic's sibling order).
    t = SuffixTree(4)
    t.extend(0, [1, 1, 0])
    assert t.speculate([0, 1], 6, 3.0, 0.0).tokens == (1, 0)


def test_depth_bounds_the_tree():
    deep, shallow = SuffixTree(8), SuffixTree(3)
    for t in (deep, shallow):
        t.extend(0, [5, 6, 7, 8, 5, 6, 7])
    # Matching "5 6" (α = 1: up to 2 tokens): 7, then 8 (1/2) in a deep tree; depth 3 leaves one level.
    assert deep.speculate([8, 5, 6], 5, 1.0, 0.0).tokens == (7, 8)
    assert shallow.speculate([8, 5, 6], 5, 1.0, 0.0).tokens == (7,)


def test_remove_undoes_extend():
    a, b = SuffixTree(5), SuffixTree(5)
    a.extend(0, [1, 2, 3, 1, 2])
    a.extend(1, [2, 3, 9, 2, 3, 9])
    a.remove(1)
    b.extend(0, [1, 2, 3, 1, 2])
    for pattern in ([1, 2], [2, 3], [9, 2, 3], [3, 1, 2]):
        assert a.speculate(pattern, 4, 2.0, 0.0) == b.speculate(pattern, 4, 2.0, 0.0)
    assert a.total == b.total == 5


def test_configuration_checks_the_suffix_fields():
    with pytest.raises(InputError, match="suffix_max_tree_depth"):
        SpeculativeConfig("suffix", 4, suffix_max_tree_depth=0)
    with pytest.raises(InputError, match="suffix_min_token_prob"):
        SpeculativeConfig("suffix", 4, suffix_min_token_prob=1.5)
    with pytest.raises(InputError, match="no θ"):
        SpeculativeConfig("suffix", 4, threshold=0.3)
    with pytest.raises(InputError, match="needs drafter"):
        SpeculativeConfig("mini-draft-1l", 4, tree="suffix")
    spec = SpeculativeConfig("suffix", 6, suffix_max_spec_factor=2.0)
    assert SpeculativeConfig.from_dict(spec.to_dict()) == spec
    assert "suffix_max_tree_depth" not in SpeculativeConfig("mini-draft-1l", 4).to_dict()  # stored forms unchanged
