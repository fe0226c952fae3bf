"""The prompt split (specdec_tune/core/splits.py): tune and holdout halves that are deterministic,
disjoint and cover the workload in its order; explicit ranges; bad splits refused."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("name", ["functions", "docstrings", "tables"])
def test_split_is_deterministic_disjoint_and_covers_the_workload(name):
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.core.splits import split_prompts

    prompts = load_workload(name)
    tune, hold = split_prompts(prompts, "tune"), split_prompts(prompts, "holdout")
    assert [p.id for p in tune] == [p.id for p in split_prompts(load_workload(name), "tune")]  # deterministic
    assert not {p.id for p in tune} & {p.id for p in hold}
    assert sorted(p.id for p in tune + hold) == sorted(p.id for p in prompts)
    assert len(tune) == len(hold) == 20 and split_prompts(prompts, "all") == prompts
    assert [p.id for p in tune] == [p.id for p in prompts if prompts.index(p) % 2 == 0]  # workload order kept
    assert split_prompts(prompts, "5:9") == prompts[5:9]


@pytest.mark.parametrize("bad", ["50:10", "bogus", "", "1:1", "a:b", "0:41", ":3"])
def test_bad_split_is_an_input_error(bad):
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.core.errors import InputError
    from specdec_tune.core.splits import split_prompts

    with pytest.raises(InputError, match="split"):
        split_prompts(load_workload("functions"), bad)
