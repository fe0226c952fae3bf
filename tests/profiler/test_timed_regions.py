"""Timed regions are clean, and the tool proves it (issue 37, item 1; DIAGNOSIS §5 F1 and F9), on the CPU.

The CUDA-graph runner run eagerly (``GraphRunner(lean, capture=False)``) does on a CPU the bookkeeping it
does on a GPU: slots per cache, one "graph" (its static inputs) per (slot, width, logits kept). Attached in
place of ``engine.cuda_graphs.attach``, a real ``profile`` and ``measure`` run through it, and spies that
count every graph and slot the runner makes (independent of the runner's own counters) prove that none is
made inside a timed region: the profile's decode passes, ``measure``'s timed decodes.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

import specdec_tune.engine.cuda_graphs as cg
from specdec_tune.core.limits import slot_length
from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.db import get_run, open_database

LENGTHS = (100, 300, 600)  # prompts in three slot classes (256, 512, 1024 positions at 16 new tokens)


class Spy:
    """Counts graphs and slots the runner makes, and where each cache was bound (slot length)."""

    def __init__(self, monkeypatch) -> None:
        self.made = 0
        self.slots = 0
        self.binds: list[tuple[int, int, int]] = []  # (cache max_len, slot length, batch)
        make, bind, slot_init = cg.GraphRunner._make, cg.GraphRunner._bind, cg._Slot.__init__

        def spy_make(runner, *args, **kwargs):
            self.made += 1
            return make(runner, *args, **kwargs)

        def spy_bind(runner, cache, batch):
            slot = bind(runner, cache, batch)
            if slot is not None:
                self.binds.append((cache.max_len, slot.length, batch))
            return slot

        def spy_slot(slot, *args, **kwargs):
            self.slots += 1
            slot_init(slot, *args, **kwargs)

        monkeypatch.setattr(cg.GraphRunner, "_make", spy_make)
        monkeypatch.setattr(cg.GraphRunner, "_bind", spy_bind)
        monkeypatch.setattr(cg._Slot, "__init__", spy_slot)
        monkeypatch.setattr(cg, "attach", lambda lean, mode="auto": setattr(lean, "cuda_graph_runner",
                                                                            cg.GraphRunner(lean, capture=False)))

    def state(self) -> tuple[int, int]:
        return self.made, self.slots

    def watch(self, monkeypatch, module, name: str, moved: list) -> None:
        """Wrap ``module.name`` (a timed region) and note every call during which a graph or slot was made."""
        inner = getattr(module, name)

        def wrapped(*args, **kwargs):
            before = self.state()
            out = inner(*args, **kwargs)
            if self.state() != before:
                moved.append((name, before, self.state()))
            return out

        monkeypatch.setattr(module, name, wrapped)


def _workload(tmp_path, tokenizer_dir: str) -> str:
    """Three prompts of LENGTHS tokens (code text cut to length with the models' own tokenizer)."""
    from transformers import AutoTokenizer

    from tests.support.tiny import CORPUS

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tok(CORPUS * 40).input_ids
    lines = []
    for i, n in enumerate(LENGTHS):
        text = tok.decode(ids[i * 7: i * 7 + n])
        lines.append({"id": f"p{n}", "prompt": text})
    path = tmp_path / "classes.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


@pytest.mark.slow
def test_no_graph_or_slot_is_made_inside_any_timed_region(tiny_model_dirs, tmp_path, monkeypatch):
    """F1 (R1, R2, R3) and F9 (R4). Before the fix: the 8-token warm-up leaves N = 10's verify width 11 to
    measure's first timed pass (R1), the draft's catch-up (2, 1) is made the first time a cycle is fully
    accepted (R2), and measure binds every prompt to the longest one's 1024-position slot while the profile
    binds each its own (R4)."""
    from specdec_tune.profiler import MeasureSpec, ProfileSettings, measure_configs
    from specdec_tune.profiler import decode_passes, measure
    from specdec_tune.profiler.session import ProfileSession

    spy = Spy(monkeypatch)
    moved: list = []
    for name in ("_baseline_prompt", "_draft_passes"):
        spy.watch(monkeypatch, decode_passes, name, moved)
    try:
        from specdec_tune.profiler import measure_passes as timed_module
    except ImportError:  # the code before the fix timed its decodes in profiler.measure
        timed_module = measure
    spy.watch(monkeypatch, timed_module, "measure_prompt", moved)

    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    settings = ProfileSettings(device="cpu", repeats=2, warmup=1, k_max=9, n_max=8, max_prompts=3, max_new_tokens=16,
                               context_lens=(128,), overhead_ns=(2,), overhead_prompts=1, split="all", front_prompts=0,
                               threads=1)
    workload = _workload(tmp_path, tiny_model_dirs["target"])
    run_id = ProfileSession(db, tiny_model_dirs["target"], [tiny_model_dirs["draft"]], workload, settings).run().run_id
    profile_binds = len(spy.binds)
    assert not moved, f"graphs or slots made inside the profile's timed decodes: {moved}"
    got = measure_configs(db, run_id, [MeasureSpec(SpeculativeConfig(None, n)) for n in (2, 10)]
                          + [MeasureSpec(SpeculativeConfig("none", 0))], repeats=2)
    assert not moved, f"graphs or slots made inside measure's timed decodes: {moved}"

    # F9: a cache takes a slot of its own length class, in the profile and in measure alike
    assert all(length == slot_length(max_len) for max_len, length, _ in spy.binds)
    measured = Counter(length for _, length, _ in spy.binds[profile_binds:])
    assert set(measured) == {256, 512, 1024}  # each prompt its own class, not the longest one's

    # the tool's own check agrees with the spies, and says so in what it stores
    run = get_run(db, run_id)
    assert run.settings.timed_regions["regions"] > 0 and run.settings.timed_regions["reruns"] == 0
    assert set(run.settings.timed_regions["watched"]) == {"target", tiny_model_dirs["draft"]}
    assert run.settings.draft_cuda_graphs == {tiny_model_dirs["draft"]: "on"}  # stored after the run
    assert set(run.settings.graph_counters) == {"target", tiny_model_dirs["draft"]}
    for m in got:
        assert m.timed_regions["reruns"] == 0 and m.timed_regions["unclean"] == 0
        assert m.timed_regions["regions"] == len(LENGTHS) * 2
        assert m.cuda_graphs["drafts"] == {tiny_model_dirs["draft"]: "on"}
        assert "full untimed pass" in m.timed_regions["warm_up"]["kind"]


def test_measure_makes_every_graph_before_it_times(tiny_model_dirs, tmp_path, monkeypatch):
    """The fast check of F1 on ``measure``'s passes alone, with every draft accepted (synthetic acceptance 1):
    every cycle drafts N and the next one starts with the draft's catch-up. Before the fix this failed on
    R1 (N = 10: the 8-token warm-up never verified 11 tokens) and R2 (the catch-up (2, 1) made while timed)."""
    from specdec_tune.engine import DecodeConfig, load_model
    from specdec_tune.profiler import measure
    from specdec_tune.profiler.measure_records import MeasureSpec
    from specdec_tune.profiler.runs import DraftSpec, encode_prompt
    from specdec_tune.profiler.settings import Progress

    spy = Spy(monkeypatch)
    moved: list = []
    try:
        from specdec_tune.profiler import measure_passes as timed_module
    except ImportError:  # before the fix
        timed_module = measure
    spy.watch(monkeypatch, timed_module, "measure_prompt", moved)
    target = load_model(tiny_model_dirs["target"], "cpu", "float32", "lean")
    draft = load_model(tiny_model_dirs["draft"], "cpu", "float32", "lean")
    assert target.model.cuda_graph_runner is not None and draft.model.cuda_graph_runner is not None
    workload = [json.loads(line) for line in open(_workload(tmp_path, tiny_model_dirs["target"]))]
    ids = [encode_prompt(target, p["prompt"]) for p in workload]
    cases = []
    for n in (2, 10):
        spec = SpeculativeConfig(None, n)
        decode = DecodeConfig(16, spec, synthetic_acceptance=(1.0,))
        cases.append(measure._Case("d", MeasureSpec(spec), DraftSpec("model", draft), decode, [[] for _ in ids],
                                   [[] for _ in ids], arrivals=[[] for _ in ids]))
    run = getattr(timed_module, "run_cases", None) or getattr(timed_module, "_run_cases")
    run(target, cases, [p["id"] for p in workload], ids, 1, 0, Progress())
    assert not moved, f"graphs or slots made inside measure's timed decodes: {moved}"
    keys = {k for s in draft.model.cuda_graph_runner.slots for k in s.graphs}
    assert (2, 1) in keys and (11, 11) in {k for s in target.model.cuda_graph_runner.slots for k in s.graphs}
    assert all(len(t) == 1 for case in cases for t in case.times)


@pytest.mark.slow
def test_bench_and_regress_warm_every_prompt_and_report_clean_timed_decodes(tiny_model_dirs, tmp_path, monkeypatch):
    """``bench`` and ``regress`` (suite runs) check their timed decodes too, say so, and warm up so that
    nothing needs a re-run: ``regress`` used to warm up on its first prompt only (R1 for the others)."""
    from specdec_tune.engine import load_model
    from specdec_tune.profiler import OURS, ArmSpec, measure_arms, run_bench
    from specdec_tune.profiler.runs import encode_prompt

    spy = Spy(monkeypatch)
    workload = _workload(tmp_path, tiny_model_dirs["target"])
    target = load_model(tiny_model_dirs["target"], "cpu", "float32", "lean")
    draft = load_model(tiny_model_dirs["draft"], "cpu", "float32", "lean")
    ids = [encode_prompt(target, json.loads(line)["prompt"]) for line in open(workload)][:2]
    result = run_bench(target, draft, ids, num_speculative_tokens=3, max_new_tokens=8, methods=OURS)
    report = result.to_json()["timed_regions"]
    assert (report["regions"], report["reruns"], report["unclean"]) == (4, 0, 0)
    assert set(report["watched"]) == {"target", "draft"}

    arm = ArmSpec(key="a", target=tiny_model_dirs["target"], spec=SpeculativeConfig(tiny_model_dirs["draft"], 3),
                  workload=workload, prompts=2, max_new_tokens=8, repeats=1, forward="lean")
    before = spy.made
    samples = measure_arms([arm])["a"]
    assert spy.made > before  # the arm's own models made their graphs (in the warm-up)
    assert [(s.regions, s.reruns, s.unclean, s.graphs_watched) for s in samples] == [(2, 0, 0, True)] * 2
