"""Suffix decoding's serving histories inside the profiler's passes (profiler/suffix_history.py, runs.py): a timed
region that runs again (profiler.clean) must not leave its earlier attempt's response in the history, or the kept
attempt drafts from its own output."""
from __future__ import annotations

from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.engine import DecodeConfig
from specdec_tune.profiler.runs import DraftSpec, new_pass, rerunnable

PROMPT, RESPONSE = [1, 2, 3], [4, 5, 6, 7]


def _spec_and_config():
    spec = DraftSpec("suffix")  # its history: policy "order"
    return spec, DecodeConfig(16, SpeculativeConfig("suffix", 4))


def test_a_rerun_region_keeps_one_response_in_the_history():
    spec, config = _spec_and_config()

    def decode():  # what a suffix decode leaves behind: its response in the global tree
        spec.history.cache(config).add_finished(PROMPT, RESPONSE)

    once = rerunnable(spec, config, decode)
    once()
    once()  # the region ran again: the first attempt's response is forgotten first
    cache = spec.history.cache(config)
    assert cache.cached_requests == 1
    req = cache.start_request([9, 4, 5])
    assert cache.speculate(req, [9, 4, 5], 4, 1.0, 0.1).tokens == (6, 7)  # the kept response still drafts
    # power: the same two calls without rerunnable leave both attempts' responses behind
    new_pass(spec)
    decode()
    decode()
    assert spec.history.cache(config).cached_requests == 2


def test_other_drafters_run_as_they_are():
    calls = []
    fn = rerunnable(DraftSpec("ngram"), DecodeConfig(16, SpeculativeConfig("ngram", 4)), lambda: calls.append(1))
    fn()
    fn()
    assert calls == [1, 1]
