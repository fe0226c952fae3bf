"""``specdec-tune regress`` end to end on tiny models: planted slowdown and acceptance drop, A/A, exit codes."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch

from specdec_tune.cli import main
from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.profiler.suite_runs import ArmSpec, measure_arms
from specdec_tune.tuner.regress import FLAGGED, Rules, compare_benchmark, decide

PROMPTS = [
    "def add(a, b):", "class Point:", "for i in range(10):", "def __init__(self, x, y):",
    "print(i, i * i)", "return a + b", "self.x = x", "self.y = y",
]


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("regress") / "tiny.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return str(path)


@pytest.fixture(scope="module")
def perturbed_draft(tiny_model_dirs, tmp_path_factory):
    """The target with noisy weights: a draft that agrees with the target often, not always."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("perturbed")
    model = LlamaForCausalLM.from_pretrained(tiny_model_dirs["target"])
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.6 * p.std())
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dirs["target"]).save_pretrained(folder)
    return str(folder)


@pytest.fixture(autouse=True)
def _one_thread():
    yield
    torch.set_num_threads(1)  # a suite may set another thread count


def _suite(path, workload, target, draft, *, threads=1, delay=0.0, name="tiny"):
    path.write_text(f"""
name = "{name}"
threads = {threads}
[rules]
min_samples = 6
min_reached = 10
[[benchmark]]
name = "b1"
target = "{target}"
draft = "{draft}"
workload = "{workload}"
prompts = 8
max_new_tokens = 24
num_speculative_tokens = 4
repeats = 3
draft_delay_ms = {delay}
""")
    return str(path)


def _run(capsys, suite, db, *extra):
    code = main(["regress", "--suite", suite, "--db", db, "--json", *extra])
    out = capsys.readouterr()
    return code, json.loads(out.out.strip().splitlines()[-1]), out.err


def _cells(report, verdicts=FLAGGED):
    return {c["metric"]: c for c in report["cells"] if c["verdict"] in verdicts}


@pytest.mark.slow
def test_no_baseline_then_planted_draft_slowdown_is_a_time_regression(tmp_path, capsys, tiny_model_dirs, workload):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    t = tiny_model_dirs["target"]
    base = _suite(tmp_path / "base.toml", workload, t, t)
    slow = _suite(tmp_path / "slow.toml", workload, t, t, delay=10.0)
    code, report, _ = _run(capsys, base, db)
    assert code == 3 and report["verdict"] == "baseline"
    assert "no baseline" in report["notes"][0] and "becomes the baseline" in report["notes"][0]
    code, report, _ = _run(capsys, slow, db)
    assert code == 0 and report["verdict"] == "suspicious" and report["baseline_id"] == 1  # one run: not yet
    assert set(_cells(report)) >= {"tokens_per_s", "latency"}
    junit = tmp_path / "junit.xml"
    code, report, _ = _run(capsys, slow, db, "--junit", str(junit), "--report-md", str(tmp_path / "r.md"))
    assert code == 1 and report["verdict"] == "regression"
    flagged = _cells(report, ("regression",))
    assert "tokens_per_s" in flagged and not any(m.startswith("acceptance") for m in flagged)
    assert "the draft got slower" in report["explanations"]["b1"]
    assert "draft_delay_ms" in " ".join(report["changes"])
    cases = ET.parse(junit).getroot().findall(".//testcase")
    by_name = {c.get("name"): c for c in cases}
    assert {"correctness", "tokens_per_s", "latency", "acceptance@1"} <= set(by_name)
    props = {p.get("name"): p.get("value") for p in by_name["tokens_per_s"].find("properties")}
    assert float(props["effect_size"]) < 0.95 and float(props["p_value"]) < 0.01 and props["ci_low"]
    assert by_name["tokens_per_s"].find("failure") is not None
    assert "slower because" in (tmp_path / "r.md").read_text()


@pytest.mark.slow
def test_planted_acceptance_drop_is_explained_as_acceptance(tmp_path, capsys, tiny_model_dirs, workload, perturbed_draft):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    t = tiny_model_dirs["target"]
    assert _run(capsys, _suite(tmp_path / "a.toml", workload, t, t), db)[0] == 3
    worse = _suite(tmp_path / "b.toml", workload, t, perturbed_draft)
    assert _run(capsys, worse, db)[0] == 0
    code, report, _ = _run(capsys, worse, db)
    assert code == 1
    flagged = _cells(report, ("regression",))
    assert any(m.startswith("acceptance@") for m in flagged)
    assert "acceptance fell at position" in report["explanations"]["b1"]
    assert "draft_identity" in " ".join(report["changes"])  # the draft's weights changed
    assert _cells(report, ("ok",)).get("correctness")  # outputs still equal plain decoding's


@pytest.mark.slow
def test_different_fingerprint_gives_no_speed_verdict(tmp_path, capsys, tiny_model_dirs, workload, monkeypatch):
    import specdec_tune.tuner.regress._run as regress

    db = f"sqlite:///{tmp_path / 'r.db'}"
    t = tiny_model_dirs["target"]
    suite = _suite(tmp_path / "a.toml", workload, t, t)
    assert _run(capsys, suite, db)[0] == 3
    real = regress.environment_fingerprint
    monkeypatch.setattr(regress, "environment_fingerprint", lambda *a: dict(real(*a), device_name="Other CPU"))
    code, report, _ = _run(capsys, _suite(tmp_path / "b.toml", workload, t, t, delay=10.0), db)
    assert code == 3 and report["verdict"] == "baseline"
    speed = [c for c in report["cells"] if c["metric"] in ("tokens_per_s", "latency")]
    assert speed and all(c["verdict"] == "no_verdict" for c in speed)  # the delay goes unjudged
    assert "device_name:" in speed[0]["details"]["reason"] and "'Other CPU'" in speed[0]["details"]["reason"]
    assert any("no speed verdict" in n and "Other CPU" in n for n in report["notes"])
    assert _cells(report, ("ok",)).get("correctness")  # correctness is still checked
    assert main(["regress", "--suite", suite, "--db", db]) == 0
    assert "Run 3, baseline run 2" in capsys.readouterr().out  # the new environment's baseline


@pytest.mark.slow
def test_ten_aa_comparisons_raise_no_false_alarm(tiny_model_dirs, workload):
    """Measure once, then ten consecutive A/A comparisons of runs drawn from that pool (exchangeable
    by construction: the null hypothesis itself) through the full rule, persistence included."""
    import random

    t = tiny_model_dirs["target"]
    arm = ArmSpec(key="a", target=t, spec=SpeculativeConfig(t, 4), workload=workload, prompts=8, max_new_tokens=24,
                  repeats=12)
    pool = [s.to_json() for s in measure_arms([arm])["a"]]

    def run(k: int) -> list[dict]:
        rng = random.Random(k)
        out = []
        for s in pool:
            pick = rng.sample(range(len(s["seconds"])), 3)
            out.append(dict(s, seconds=[s["seconds"][i] for i in pick], draft_seconds=[s["draft_seconds"][i] for i in pick],
                            plain_seconds=[s["plain_seconds"][i] for i in pick],
                            probe_seconds=[s["probe_seconds"][i] for i in pick]))
        return out

    runs = [run(k) for k in range(11)]
    config = {"num_speculative_tokens": 4, "draft": t}

    def alarms(rules: Rules) -> int:
        history: dict = {}
        count = 0
        for i in range(10):
            cells = decide(compare_benchmark("b1", runs[i], runs[i + 1], config, rules), rules, history)
            assert {"speedup", "tokens_per_s", "latency", "acceptance@1"} <= {
                c.metric for c in cells if c.verdict != "no_verdict"}
            flagged = {(c.benchmark, c.metric) for c in cells if c.verdict in FLAGGED}
            history = {k: history.get(k, 0) + 1 for k in flagged}
            count += len(flagged)
        return count

    assert alarms(Rules(min_samples=6, min_reached=10)) == 0
    # Power of this test: a rule without the effect-size floor and the multiple-testing control
    # flags noise on the very same samples, so the assertion above can fail.
    assert alarms(Rules(min_samples=6, min_reached=10, min_drop=0.0, q=1.0)) > 0


def test_broken_suite_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbenchmark:\n  - name: a\n    target: t\n    workload: w\n    num_speculative_tokens: 4\n"
                   "    repeats: -1\n")
    assert main(["regress", "--suite", str(bad), "--db", f"sqlite:///{tmp_path / 'r.db'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad}:7: benchmark[0].repeats" in err
    toml = tmp_path / "bad.toml"
    toml.write_text('name = "x"\n[[benchmark]]\nname = "a"\ntarget = "t"\nworkload = "w"\nbogus = 1\n'
                    "num_speculative_tokens = 4\n")
    assert main(["regress", "--suite", str(toml)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{toml}:6: benchmark[0].bogus" in err
    toml.write_text('name = "x"\n[[benchmark]\n')
    assert main(["regress", "--suite", str(toml)]) == 2
    assert f"{toml}:2: TOML syntax error" in capsys.readouterr().err


@pytest.mark.slow
def test_calibrate_stores_the_noise_floor_used_next_to_verdicts(tmp_path, capsys, tiny_model_dirs, workload):
    from specdec_tune.db import open_database
    from specdec_tune.db import latest_calibration, metric_trend

    db = f"sqlite:///{tmp_path / 'r.db'}"
    t = tiny_model_dirs["target"]
    suite = _suite(tmp_path / "a.toml", workload, t, t)
    code, report, _ = _run(capsys, suite, db, "--calibrate", "--rounds", "2")
    assert code == 0 and report["kind"] == "calibration"
    rows = {(r["benchmark"], r["metric"]): r for r in report["calibration"]}
    assert rows[("b1", "tokens_per_s")]["runs"] == 2 and rows[("b1", "tokens_per_s")]["mdc"] > 0
    stored = latest_calibration(open_database(db), "tiny")
    assert {c.metric for c in stored} >= {"tokens_per_s", "latency"}
    _run(capsys, suite, db)
    code, report, _ = _run(capsys, suite, db)
    speed = [c for c in report["cells"] if c["metric"] == "tokens_per_s"][0]
    assert speed["details"]["mdc_source"] == "calibration"
    calibrated = [c for c in stored if c.metric == "tokens_per_s"][0].mdc
    assert speed["min_detectable_change"] == pytest.approx(calibrated)
    trend = metric_trend(open_database(db), "tiny", "b1", "tokens_per_s")
    assert [r.id for r, _ in trend] == [2, 3]  # the trend page's query: suite runs, oldest first
