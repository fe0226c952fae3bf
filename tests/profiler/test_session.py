"""The profiler on tiny random models: micro-benchmarks, hooked overhead, acceptance traces, the greedy
cycle simulation against the real engine, and interrupted / failed runs (telemetry: test_telemetry.py)."""
from __future__ import annotations

import json

import pytest
import torch

from specdec_tune.db import get_run, list_runs, load_timings, load_traces, open_database
from specdec_tune.engine import CycleStats, DecodeConfig, LoadedModel
from specdec_tune.profiler import acceptance as acc
from specdec_tune.profiler import microbench as mb
from specdec_tune.profiler.overhead import ForwardRecorder
from specdec_tune.profiler.runs import DraftSpec, decode_once
from specdec_tune.profiler import decode_passes
from specdec_tune.profiler.session import ProfileSession, ProfileSettings
from specdec_tune.tuner.model import (
    PromptInfo,
    SpecConfig,
    build_run_profile,
    fit_overhead,
    load_run_profile,
    position_traces,
    predict_config,
    simulate_prompt,
)
from tests.support.tiny import tiny_llama

VOCAB = 48


def _loaded(model: torch.nn.Module, name: str) -> LoadedModel:
    return LoadedModel(name=name, source=name, model=model, tokenizer=None, device=torch.device("cpu"), dtype=torch.float64)


@pytest.fixture(scope="module")
def pair():
    """A sharp target and a draft that is the target with a perturbed head: partial agreement."""
    target = tiny_llama(vocab=VOCAB, layers=2, seed=0, sharpness=4.0)
    draft = tiny_llama(vocab=VOCAB, layers=2, seed=0, sharpness=4.0)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(3)
        draft.lm_head.weight.add_(0.5 * torch.randn(draft.lm_head.weight.shape, generator=gen, dtype=torch.float64))
    prompts = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 14, 6)]
    return _loaded(target, "target"), _loaded(draft, "draft"), prompts


def test_cached_forward_timing_rows():
    model = tiny_llama(vocab=VOCAB, layers=1)
    ctx = mb.context_tokens(None, 12, VOCAB, torch.device("cpu"))
    samples = mb.time_cached_forward(model, ctx, 3, batch_size=2, warmup=2, repeats=4)
    assert len(samples.samples) == 4 and len(samples.warmup) == 2
    assert all(s > 0 for s in samples.samples) and samples.p10 <= samples.median <= samples.p90
    rows = mb.ForwardTiming("verify", 3, 2, 12, samples).rows()
    assert [r.warmup for r in rows] == [True, True, False, False, False, False]
    assert {(r.kind, r.k, r.batch_size, r.context_len) for r in rows} == {("verify", 3, 2, 12)}


def test_interleaved_cases_share_one_cache_and_roll_back():
    """Every case starts at its own context length; the timed forward computes what the loop would."""
    model = tiny_llama(vocab=VOCAB, layers=1)
    src = torch.arange(VOCAB)
    cases = mb.cached_cases(model, "draft_step", [(5, 1), (20, 1), (9, 4)], source=src, draft="d")
    seen = []
    with torch.inference_mode():
        for case in cases:
            case.setup()
            seen.append(case.fn().shape[1])
    assert seen == [1, 1, 4]
    # the case at context 9 with 4 new tokens equals a fresh forward over those 13 tokens
    ctx = mb.context_tokens(src, 20, VOCAB, torch.device("cpu"))
    cases[2].setup()
    with torch.inference_mode():
        got = cases[2].fn()[0]
        new = ctx[torch.arange(4) % 20]
        want = model(input_ids=torch.cat([ctx[:9], new])[None]).logits[0, -4:]
    assert torch.allclose(got, want, atol=1e-9)
    timings = mb.run_interleaved(cases, warmup=1, repeats=3)
    assert [(t.kind, t.context_len, t.k, t.draft, len(t.samples.samples)) for t in timings] == [
        ("draft_step", 5, 1, "d", 3), ("draft_step", 20, 1, "d", 3), ("draft_step", 9, 4, "d", 3)]
    # real prompt tokens are repeated to the asked length
    src = torch.tensor([5, 6, 7])
    assert mb.context_tokens(src, 7, VOCAB, torch.device("cpu")).tolist() == [5, 6, 7, 5, 6, 7, 5]


def test_recorder_splits_cycles_into_forwards_and_overhead(pair):
    target, draft, prompts = pair
    recorder = ForwardRecorder("cpu")
    config = DecodeConfig(max_new_tokens=12, num_speculative_tokens=3)
    with recorder.attach(target.model, draft.model):
        recorder.begin()
        result = decode_once(target, DraftSpec("model", draft), prompts[0], config, on_cycle=recorder.on_cycle)
        timeline = recorder.finish()
    target_fw = [f for f in timeline.forwards if f.role == "target"]
    draft_fw = [f for f in timeline.forwards if f.role == "draft"]
    assert len(target_fw) == len(result.cycles) + 1  # prefill + one verify per cycle
    assert [f.tokens for f in target_fw[1:]] == [c.drafted + 1 for c in result.cycles]
    assert len(draft_fw) == sum(c.draft_forwards for c in result.cycles)
    assert target_fw[0].tokens == prompts[0].numel() - 1 and target_fw[0].context_len == 0
    cycles = timeline.cycle_overheads()
    assert len(cycles) == len(result.cycles) - 1
    for c in cycles:
        assert 0 < c.forward_s < c.wall_s and 0 < c.share < 1
    total = sum(c.wall_s for c in cycles) + timeline.first_cycle_s() + timeline.tail_s()
    total += sum(f.seconds for f in timeline.forwards if f.start < timeline.cycle_ends[0])
    assert total == pytest.approx(timeline.wall_s, rel=1e-6)
    # hooks are gone after the block
    assert not target.model._forward_hooks and not draft.model._forward_pre_hooks


def test_recorder_on_a_gpu_marks_with_events_and_waits_once(pair, monkeypatch):
    """On CUDA the hooks record events without synchronising (the loop keeps its host/GPU overlap) and
    finish() waits once and reads them: the same timeline as with clocks. A fake event (perf_counter at
    record) stands in for CUDA's here; a synchronising recorder would fail the count."""
    import time

    from specdec_tune.profiler import overhead

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = None

        def record(self) -> None:
            self.t = time.perf_counter()

        def elapsed_time(self, other: FakeEvent) -> float:
            return (other.t - self.t) * 1e3

    syncs = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(overhead, "synchronize", lambda device: syncs.append(device))
    target, draft, prompts = pair
    recorder = ForwardRecorder("cuda")
    config = DecodeConfig(max_new_tokens=12, num_speculative_tokens=3)
    with recorder.attach(target.model, draft.model):
        recorder.begin()
        result = decode_once(target, DraftSpec("model", draft), prompts[0], config, on_cycle=recorder.on_cycle)
        assert syncs == []  # nothing waited inside the loop
        timeline = recorder.finish()
    assert len(syncs) == 1 and timeline.start == 0.0
    target_fw = [f for f in timeline.forwards if f.role == "target"]
    assert [f.tokens for f in target_fw[1:]] == [c.drafted + 1 for c in result.cycles]
    assert all(isinstance(e, float) for e in timeline.cycle_ends) and timeline.cycle_ends == sorted(timeline.cycle_ends)
    for c in timeline.cycle_overheads():
        assert 0 < c.forward_s < c.wall_s


def test_summarize_counts_conditional_and_unconditional():
    cycles = [
        CycleStats(3, 3, 4, (0.95, 0.85, 0.15), (True, True, True)),
        CycleStats(3, 1, 2, (0.9, 0.5, 0.05), (True, False, False)),
        CycleStats(3, 0, 1, (0.35, 0.2, 0.1), (False, False, False)),
        CycleStats(2, 2, 3, (0.99, 0.6), (True, True)),
    ]
    s = acc.summarize(cycles, 3)
    assert s.attempts == [4, 3, 1] and s.accepts == [3, 2, 1]
    assert s.alpha == [0.75, pytest.approx(2 / 3), 1.0] and s.beta == [0.75, 0.5, 0.25]
    assert s.mean_tokens_per_cycle() == pytest.approx(1 + 6 / 4)
    bins = s.confidence_bins
    assert sum(bins["drafted"]) == 8 and sum(bins["accepted"]) == 6
    assert bins["drafted"][9] == 3 and bins["accepted"][9] == 3  # 0.95, 0.9, 0.99
    assert bins["drafted"][3] == 1 and bins["accepted"][3] == 0  # 0.35, rejected


def test_teacher_forced_agreement(pair):
    target, draft, prompts = pair
    same = acc.teacher_forced(target.model, target.model, prompts, temperature=1.0)
    assert same.tokens == sum(p.numel() - 1 for p in prompts)
    assert same.greedy_agreement == 1.0 and same.one_minus_tv == pytest.approx(1.0)
    other = acc.teacher_forced(target.model, draft.model, prompts, temperature=1.0)
    assert 0 < other.one_minus_tv < 1 and 0 <= other.greedy_agreement < 1
    with pytest.raises(ValueError):
        acc.teacher_forced(target.model, draft.model, prompts, temperature=0.0)


@pytest.mark.parametrize("draft_kind", ["perturbed", pytest.param("identical", marks=pytest.mark.slow)])
def test_greedy_simulation_reproduces_the_engine(pair, draft_kind):
    """Cycles replayed from θ = 0, N_max traces equal the engine's cycles for other N, θ, schedules."""
    target, draft, prompts = pair
    if draft_kind == "identical":  # every cycle fully accepted: exercises the bonus continuations
        draft = _loaded(target.model, "same")
    n_max, max_new = 6, 20
    record = DecodeConfig(max_new_tokens=max_new, num_speculative_tokens=n_max)
    traces = acc.record_traces(target, DraftSpec("model", draft), prompts, record)
    rows = acc.trace_rows(traces)
    conts = acc.bonus_continuations(draft.model, traces, prompts)
    if draft_kind == "identical":
        assert conts and all(ok for *_, ok in conts)
    for n, theta, schedule, rule in [(1, 0.0, "constant", "before"), (3, 0.0, "constant", "before"),
                                     (4, 0.5, "constant", "before"), (6, 0.9, "constant", "before"),
                                     (5, 0.0, "heuristic", "before"), (4, 0.6, "heuristic", "before"),
                                     (4, 0.5, "constant", "hf"), (5, 0.6, "heuristic", "hf")]:
        config = DecodeConfig(max_new_tokens=max_new, num_speculative_tokens=n, threshold=theta, schedule=schedule,
                              threshold_rule=rule)
        for i, ids in enumerate(prompts):
            real = decode_once(target, DraftSpec("model", draft), ids, config)
            mine = [r for r in rows if r.prompt_index == i]
            pos = position_traces(mine, {c: (conf, ok) for p, c, conf, ok in conts if p == i}, cap=n_max)
            sim = simulate_prompt(pos, real.new_tokens, max_new, n, theta, schedule, threshold_rule=rule)
            assert sim == [(c.drafted, c.accepted, c.draft_forwards) for c in real.cycles], (n, theta, schedule, rule, i)


def _positions_per_prompt(rows, conts, prompts: int, cap: int):
    """Each prompt's greedy roll-outs from recorded trace rows and bonus continuations."""
    return [position_traces([r for r in rows if r.prompt_index == i],
                            {c: (conf, ok) for p, c, conf, ok in conts if p == i}, cap=cap) for i in range(prompts)]


@pytest.mark.slow
def test_greedy_simulation_reproduces_threshold_kinds(pair):
    """The cumulative and adaptive kinds replayed from θ = 0, N_max traces equal the engine's cycles one
    by one; replayed as per-token (what a model blind to the kind would do) they do not."""
    target, draft, prompts = pair
    # Recorded at N_max = 12 for N <= 6: a roll-out from inside a recorded cycle then covers the budget
    # (past it the simulation can only estimate the draft's unknown confidences).
    n_max, max_new = 12, 20
    traces = acc.record_traces(target, DraftSpec("model", draft), prompts,
                               DecodeConfig(max_new_tokens=max_new, num_speculative_tokens=n_max))
    positions = _positions_per_prompt(acc.trace_rows(traces), acc.bonus_continuations(draft.model, traces, prompts),
                                      len(prompts), n_max)
    blind = 0
    for n, theta, kind, step in [(4, 0.3, "cumulative", 0.05), (6, 0.5, "cumulative", 0.05),
                                 (4, 0.3, "adaptive", 0.1), (6, 0.6, "adaptive", 0.2), (5, 0.0, "adaptive", 0.3)]:
        config = DecodeConfig(max_new_tokens=max_new, num_speculative_tokens=n, threshold=theta, threshold_kind=kind,
                              threshold_step=step)
        for i, (ids, pos) in enumerate(zip(prompts, positions)):
            real = decode_once(target, DraftSpec("model", draft), ids, config)
            want = [(c.drafted, c.accepted, c.draft_forwards) for c in real.cycles]
            assert simulate_prompt(pos, real.new_tokens, max_new, n, theta, kind=kind, step=step) == want, (n, theta, kind, i)
            blind += simulate_prompt(pos, real.new_tokens, max_new, n, theta) != want
    assert blind > 0  # the kinds matter on these prompts: the comparison has power


def test_fit_overhead_separates_cycle_and_forward_costs():
    import random

    rng = random.Random(0)
    samples = [(f, 0.002 + 0.0001 * f + rng.uniform(-1e-5, 1e-5)) for f in (1, 4, 16) for _ in range(200)]
    samples += [(f, 0.05) for f in (1, 4, 16)]  # one stall per group: trimmed away
    fit = fit_overhead(samples)
    assert fit.intercept_s == pytest.approx(0.002, abs=2e-5)
    assert fit.per_forward_s == pytest.approx(0.0001, abs=2e-6)
    assert fit.cycles == 603
    # a regular tail is kept: expected cost, not the median
    tail = [(4, 0.001)] * 90 + [(4, 0.002)] * 10
    assert fit_overhead(tail).intercept_s == pytest.approx((90 * 0.001 + 9 * 0.002) / 99)  # top 1% dropped
    assert fit_overhead([(16, 0.003), (16, 0.004), (16, 0.005)]).per_forward_s == 0.0
    assert fit_overhead([]).cycles == 0


@pytest.fixture()
def workload(tmp_path):
    path = tmp_path / "w.jsonl"
    lines = [{"id": f"p{i}", "prompt": text} for i, text in enumerate(["def add(a, b):", "class Point:", "for i in range(10):"])]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


TINY = ProfileSettings(device="cpu", repeats=2, warmup=1, k_max=3, n_max=4, max_prompts=2, max_new_tokens=8,
                       context_lens=(8, 16), prefill_repeats=1, overhead_prompts=1, overhead_ns=(1,))


def test_profile_session_stores_everything_and_predicts(tiny_model_dirs, workload, tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    session = ProfileSession(db, tiny_model_dirs["target"], [tiny_model_dirs["draft"], "ngram"], workload, TINY)
    result = session.run()
    run = get_run(db, result.run_id)
    assert run.status == "completed" and [d.name for d in run.drafts] == [tiny_model_dirs["draft"], "ngram"]
    assert run.target.tokenizer_hash and run.hardware.device == "cpu" and run.workload.prompt_count == 3
    kinds = {r.kind for r in load_timings(db, result.run_id)}
    assert kinds == {"verify", "draft_step", "prefill", "autoregressive", "overhead", "machine_probe", "verify_context",
                     "first_cycle", "hooked_call", "bare_call", "hooked_call_threshold", "bare_call_threshold"}
    # the thread count chosen (stored and returned) and the machine's speed while profiling
    assert run.settings.thread_choice["threads"] == run.settings.threads == result.threads["threads"] >= 1
    assert result.threads["source"] in ("calibrated", "calibrated, lowered to the idle CPUs")
    probes = [r.seconds for r in load_timings(db, result.run_id, kind="machine_probe")]
    assert len(probes) >= 4 * 3 and load_run_profile(db, result.run_id).machine_probe_s > 0
    verify = {r.k for r in load_timings(db, result.run_id, kind="verify")}
    assert verify == {1, 2, 3}
    traces = load_traces(db, result.run_id, tiny_model_dirs["draft"], "greedy")
    assert traces and all(len(t.confidences) <= 4 for t in traces)
    rp = load_run_profile(db, result.run_id)
    assert [p.new_tokens for p in rp.prompts] == [8, 8] or all(1 <= p.new_tokens <= 8 for p in rp.prompts)
    p = predict_config(rp, SpecConfig(3))
    assert p.source == "simulation" and p.tokens_per_s > 0 and 1 <= p.expected_tokens_per_cycle <= 4
    ngram = predict_config(load_run_profile(db, result.run_id, "ngram"), SpecConfig(2))
    assert ngram.source == "traces" and ngram.tokens_per_s > 0


@pytest.mark.slow
def test_interrupted_profile_keeps_its_samples_and_earlier_runs(tiny_model_dirs, workload, tmp_path, monkeypatch):
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    settings = ProfileSettings(**{**TINY.__dict__, "max_prompts": 1})
    first = ProfileSession(db, tiny_model_dirs["target"], ["ngram"], workload, settings).run()

    calls = []
    real = decode_passes._baseline_prompt

    def stop_at_second_prompt(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(decode_passes, "_baseline_prompt", stop_at_second_prompt)
    settings = ProfileSettings(**{**TINY.__dict__, "max_prompts": 2})
    session = ProfileSession(db, tiny_model_dirs["target"], [tiny_model_dirs["draft"]], workload, settings)
    with pytest.raises(KeyboardInterrupt):
        session.run()
    run = get_run(db, session.run_id)
    assert run.status == "interrupted" and run.finished_at is not None
    assert load_timings(db, session.run_id, kind="verify") and load_timings(db, session.run_id, kind="draft_step")
    # the first prompt's decoding passes were stored before the interrupt, the second's never ran
    traces = load_traces(db, session.run_id, tiny_model_dirs["draft"], "greedy")
    assert traces and {t.prompt_index for t in traces} == {0}
    assert load_timings(db, session.run_id, kind="autoregressive")
    assert get_run(db, first.run_id).status == "completed"
    assert len(load_timings(db, first.run_id)) > 0

    def boom(self):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(ProfileSession, "decode_passes", boom)
    settings = ProfileSettings(**{**TINY.__dict__, "max_prompts": 1})
    failed = ProfileSession(db, tiny_model_dirs["target"], ["ngram"], workload, settings)
    with pytest.raises(RuntimeError):
        failed.run()
    statuses = {r.id: r.status for r in list_runs(db)}
    assert statuses == {first.run_id: "completed", session.run_id: "interrupted", failed.run_id: "failed"}


def test_build_profile_without_timings_is_refused(tiny_model_dirs, workload, tmp_path, monkeypatch):
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")

    def stop(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(ProfileSession, "bench_forwards", stop)
    session = ProfileSession(db, tiny_model_dirs["target"], ["ngram"], workload, TINY)
    with pytest.raises(KeyboardInterrupt):
        session.run()
    run = get_run(db, session.run_id)
    with pytest.raises(Exception, match="no verify timings"):
        build_run_profile(run, "ngram", [], [], prompts=[PromptInfo(5, 8)])


# --------------------------------------------------------------------------- held-out predictions


def test_held_out_prediction_uses_no_held_out_timing(tiny_model_dirs, workload, tmp_path):
    from specdec_tune.tuner.model import PromptSpec, predict_prompts, split_specs

    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    draft = tiny_model_dirs["draft"]
    run_id = ProfileSession(db, tiny_model_dirs["target"], [draft], workload, TINY).run().run_id
    settings = get_run(db, run_id).settings
    assert settings.split == "tune" and settings.prompt_ids == ("p0", "p2")  # p1 is held out
    lengths = list(settings.prompt_tokens)
    # Nothing of the held-out prompt is in the run: traces of profiled prompts only, prefills at their lengths.
    assert {t.prompt_index for t in load_traces(db, run_id, draft, "greedy")} <= {0, 1}
    prefills = {(r.draft, r.k) for r in load_timings(db, run_id, kind="prefill")}
    assert prefills == {(None, n - 1) for n in lengths} | {(draft, n) for n in lengths}
    rp = load_run_profile(db, run_id, draft)
    config = SpecConfig(3)
    short, long = (predict_prompts(rp, config, [(n, None)]) for n in (min(lengths), 3 * max(lengths)))
    assert not short.in_sample and short.source.startswith("simulation pooled") and short.new_tokens == 8
    assert short.tokens_per_s > 0 and long.seconds >= short.seconds  # prefill: a line in the length, slope >= 0
    pooled = predict_prompts(rp, config, [(n, 8) for n in lengths])
    exact = predict_prompts(rp, config, [PromptSpec(n, None, i) for i, n in enumerate(lengths)])
    assert exact.in_sample and exact.tokens_per_s == pytest.approx(predict_config(rp, config).tokens_per_s)
    # Pooled over the same prompts with their output lengths, the cycles are the same ones.
    if all(p.new_tokens == 8 for p in rp.prompts):
        assert pooled.expected_tokens_per_cycle == pytest.approx(exact.expected_tokens_per_cycle)
    plain = predict_prompts(rp, SpecConfig(0), [(n, None) for n in lengths])
    assert plain.source == "baseline" and plain.tokens_per_s > 0
    # Every workload prompt's length is stored, so any split can be predicted without a tokenizer.
    stored = settings.workload_prompt_tokens
    assert [pid for pid, _ in stored] == ["p0", "p1", "p2"] and [stored[0][1], stored[2][1]] == lengths
    (held,) = split_specs(rp, "holdout")
    assert held == PromptSpec(stored[1][1], None, None)
    tune = predict_prompts(rp, config, split_specs(rp, "tune"))
    assert tune.in_sample and tune.tokens_per_s == pytest.approx(exact.tokens_per_s)
    assert not predict_prompts(rp, config, split_specs(rp, "all")).in_sample


def test_single_profiled_prompt_pooled_equals_exact(tiny_model_dirs, workload, tmp_path):
    """With one profiled prompt the pool is that prompt and the prefill line is its prefill: a held-out
    prompt of the same length and output length must be predicted exactly as the profiled one."""
    from specdec_tune.tuner.model import predict_prompts

    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    settings = ProfileSettings(**{**TINY.__dict__, "max_prompts": 1})
    run_id = ProfileSession(db, tiny_model_dirs["target"], [tiny_model_dirs["draft"]], workload, settings).run().run_id
    rp = load_run_profile(db, run_id)
    (info,) = rp.prompts
    for config in (SpecConfig(1), SpecConfig(4, 0.3), SpecConfig(3, schedule="heuristic")):
        exact = predict_config(rp, config)
        pooled = predict_prompts(rp, config, [(info.prompt_tokens, info.new_tokens)])
        assert not pooled.in_sample and exact.in_sample
        assert pooled.tokens_per_s == pytest.approx(exact.tokens_per_s, rel=1e-9)
        assert pooled.expected_tokens_per_cycle == pytest.approx(exact.expected_tokens_per_cycle, rel=1e-9)
