"""A profile run's stored settings read typed (db.RunSettings): old rows, the documented defaults, bad rows."""
from __future__ import annotations

import json

import pytest

from specdec_tune.core.errors import StorageError
from specdec_tune.db import RunSettings, create_run, get_or_create_hardware, get_or_create_model, get_run
from specdec_tune.db import open_database

# The settings JSON of the profiler's first version (profiler/session.py in commit 03942a8): no forward, split,
# CUDA graphs, thread choice, draft forwards, workload prompt lengths, synthetic acceptance, fronts or trees;
# overhead_ns and overhead_prompts had other defaults then.
FIRST_VERSION = {
    "device": "cpu", "dtype": "float32", "temperature": 0.0, "batch_sizes": [1], "k_max": 17, "n_max": 16,
    "repeats": 20, "warmup": 3, "prefill_repeats": 3, "context_lens": [128, 256, 315, 512], "max_prompts": 16,
    "max_new_tokens": 64, "overhead_ns": [1, 4], "overhead_prompts": 4, "seed": 0, "target": "mini-target",
    "drafts": ["mini-draft-1l", "ngram"], "workload": "functions", "prompt_ids": ["functions-000", "functions-001"],
    "prompt_tokens": [165, 133], "typical_context": 315, "ks": list(range(1, 18)), "threads": 2,
    "throughput": "end to end: new tokens / wall seconds of whole decode calls, prefill included",
}


def test_first_version_settings_read_with_the_documented_defaults():
    s = RunSettings.from_json(FIRST_VERSION)
    # stored values are read, typed (JSON lists become tuples), and win over today's profile defaults
    assert (s.n_max, s.k_max, s.max_new_tokens, s.typical_context, s.threads) == (16, 17, 64, 315, 2)
    assert s.overhead_ns == (1, 4) and s.overhead_prompts == 4 and s.prompt_tokens == (165, 133)
    assert s.drafts == ("mini-draft-1l", "ngram") and s.max_prompt_tokens == 165
    # keys written later take the defaults that say what such a run did
    assert s.forward == "hf" and s.split == "all" and s.cuda_graphs == "auto" and s.cuda_graphs_used is None
    assert s.lean_kernels is None and s.draft_forwards == {} and s.workload_prompt_tokens is None
    assert s.thread_choice is None and s.synthetic_acceptance is None and s.front_prompts == 0 and not s.trees
    # a key this version has no field for is kept, and written back unchanged
    assert s.model_extra == {"ks": list(range(1, 18))}
    assert s.to_json() == {**RunSettings().to_json(), **FIRST_VERSION}


def test_empty_and_null_settings_read_as_defaults():
    assert RunSettings.from_json(None) == RunSettings.from_json({}) == RunSettings()
    s = RunSettings.from_json({"typical_context": None, "n_max": None, "threads": None, "prompt_ids": None})
    assert (s.typical_context, s.n_max, s.threads, s.prompt_ids) == (0, 16, None, ())
    assert RunSettings().max_prompt_tokens == 0


def test_nested_values_are_typed():
    s = RunSettings.from_json({"workload_prompt_tokens": [["a", "7"], ["b", 9]], "synthetic_acceptance": [1, 0.5],
                               "draft_forwards": {"d": "lean"}})
    assert s.workload_prompt_tokens == (("a", 7), ("b", 9)) and s.synthetic_acceptance == (1.0, 0.5)
    assert s.draft_forwards == {"d": "lean"}


def test_a_bad_stored_value_names_the_run(tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    hw = get_or_create_hardware(db, {"device": "cpu", "device_name": "cpu"})
    target = get_or_create_model(db, {"name": "t"})
    run = create_run(db, target_model_id=target, hardware_id=hw, settings={"n_max": "many"})
    with pytest.raises(StorageError, match=rf"profile run {run}: stored setting 'n_max' is not valid"):
        get_run(db, run)


def test_settings_round_trip_through_the_database(tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    hw = get_or_create_hardware(db, {"device": "cpu", "device_name": "cpu"})
    target = get_or_create_model(db, {"name": "t"})
    written = RunSettings.from_json({**FIRST_VERSION, "forward": "lean", "synthetic_acceptance": [0.7]})
    run = create_run(db, target_model_id=target, hardware_id=hw, settings=written)
    read = get_run(db, run).settings
    assert read == written and json.loads(json.dumps(read.to_json())) == written.to_json()


def test_every_profile_setting_has_a_typed_home():
    """The profiler stores what it was asked through run_settings, which refuses a key RunSettings has no
    field for (it would be stored, and read back, untyped)."""
    from specdec_tune.profiler import ProfileSettings
    from specdec_tune.profiler.settings import run_settings

    asked = ProfileSettings(n_max=8, k_max=9, overhead_ns=(1, 2), synthetic_acceptance=(0.5,), label="x")
    stored = run_settings(asked, device="cpu", typical_context=100)
    assert (stored.n_max, stored.k_max, stored.overhead_ns, stored.synthetic_acceptance) == (8, 9, (1, 2), (0.5,))
    assert stored.device == "cpu" and stored.typical_context == 100 and stored.model_extra == {}
    with pytest.raises(ValueError, match="no field for ks"):
        run_settings(asked, ks=[1, 2])
