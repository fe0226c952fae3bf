"""Suffix decoding's serving histories inside the profiler's passes (profiler/suffix_history.py, runs.py): a timed
region that runs again (profiler.clean) must not leave its earlier attempt's response in the history, or the kept
attempt drafts from its own output."""
from __future__ import annotations

import pytest

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


@pytest.mark.slow
def test_measuring_the_profiled_prompts_accepts_what_the_model_replays(tiny_model_dirs, tmp_path, capsys):
    """``measure --split tune`` on the prompts a run profiled: the history is the profile's order, so the
    measured tokens per cycle are the model's exact replay. Before the fix it was a ``warm`` history holding
    every profiled response, each prompt's own among them, and the drafts copied the answer."""
    import json

    from specdec_tune.cli import main

    prompts = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)"] * 2
    workload = tmp_path / "rep.jsonl"
    workload.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    flags = ["--device", "cpu", "--repeats", "2", "--k-max", "5", "--n-max", "4", "--max-new-tokens", "12",
             "--context-lens", "8,16"]
    assert main(["profile", "--target", tiny_model_dirs["target"], "--draft", "suffix", "--workload", str(workload),
                 "--split", "tune", "--max-prompts", "4", "--db", url, *flags]) == 0
    capsys.readouterr()
    assert main(["measure", "--run", "1", "--draft", "suffix", "-N", "4", "--split", "tune", "--repeats", "1",
                 "--db", url, "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["in_sample"] and got["prompts"] == 4
    assert got["mean_tokens_per_cycle"] == pytest.approx(got["predicted_tokens_per_cycle"], rel=1e-9)
