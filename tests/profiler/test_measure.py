"""``measure`` interleaves configurations prompt by prompt (a slow stretch of a shared machine lands on
all of them alike); with an energy meter each configuration's turn is a whole pass, read once."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec_tune.profiler import measure as measure_mod
from specdec_tune.profiler.settings import Progress


class _Meter:
    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> float:
        self.reads += 1
        return float(self.reads)


def _run(monkeypatch, configs: int, prompts: int, repeats: int, meter=None):
    order: list[tuple[str, int]] = []
    probes = iter(range(1000))

    def fake_measure(target, spec, x, decode, *, prompt_id, seed):
        order.append((spec, int(x[0])))
        return SimpleNamespace(seconds=0.01, new_tokens=4, latency=None, result=None)

    monkeypatch.setattr(measure_mod, "measure_prompt", fake_measure)
    monkeypatch.setattr(measure_mod, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(measure_mod, "MachineProbe", lambda device: SimpleNamespace(run=lambda: float(next(probes))))
    ids = [torch.tensor([i]) for i in range(prompts)]
    cases = [measure_mod._Case(f"c{c}", None, f"c{c}", None, [[] for _ in ids], [[] for _ in ids],
                               arrivals=[[] for _ in ids]) for c in range(configs)]
    target = SimpleNamespace(device=torch.device("cpu"))
    measure_mod._run_cases(target, cases, [f"p{i}" for i in range(prompts)], ids, repeats, 0, Progress(), meter)
    return order, cases


def test_configurations_take_turns_prompt_by_prompt(monkeypatch):
    order, cases = _run(monkeypatch, configs=3, prompts=5, repeats=2)
    assert len(order) == 3 * 5 * 2
    rounds = [order[i:i + 3] for i in range(0, len(order), 3)]
    for j, chunk in enumerate(rounds):  # every configuration decodes prompt i before any decodes prompt i + 1
        assert {p for _, p in chunk} == {j % 5} and sorted(c for c, _ in chunk) == ["c0", "c1", "c2"]
    firsts = [chunk[0][0] for chunk in rounds]
    assert set(firsts) == {"c0", "c1", "c2"}  # the order rotates: no configuration always goes first
    for case in cases:
        assert all(len(t) == 2 for t in case.times)
        assert case.probes == cases[0].probes and len(case.probes) == 2 * 3  # shared: after prompts 2, 4 and 5
        assert case.joules == []


def test_with_an_energy_meter_each_turn_is_a_whole_pass(monkeypatch):
    meter = _Meter()
    order, cases = _run(monkeypatch, configs=2, prompts=4, repeats=3, meter=meter)
    passes = [order[i:i + 4] for i in range(0, len(order), 4)]
    for chunk in passes:
        assert len({c for c, _ in chunk}) == 1 and [p for _, p in chunk] == [0, 1, 2, 3]
    assert [chunk[0][0] for chunk in passes] == ["c0", "c1", "c1", "c0", "c0", "c1"]
    for case in cases:
        assert case.joules == [pytest.approx(1.0)] * 3  # one read before and one after its pass
        assert len(case.probes) == 3
