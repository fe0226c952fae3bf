"""``measure`` interleaves configurations prompt by prompt (a slow stretch of a shared machine lands on
all of them alike), with an energy meter too: energy is read around separate metered passes."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec_tune.profiler import measure as measure_mod
from specdec_tune.profiler import measure_passes as passes
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
        order.append((spec.key, int(x[0])))
        return SimpleNamespace(seconds=0.01, new_tokens=4, latency=None, result=None)

    def fake_decode(target, spec, x, decode, seed=None):
        order.append((spec.key, -1 - int(x[0])))  # an untimed decode (warm-up or metered pass)
        return SimpleNamespace(token_ids=[1, 2, 3, 4])

    monkeypatch.setattr(passes, "measure_prompt", fake_measure)
    monkeypatch.setattr(passes, "decode_once", fake_decode)
    monkeypatch.setattr(passes, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(passes, "MachineProbe", lambda device: SimpleNamespace(run=lambda: float(next(probes))))
    ids = [torch.tensor([i]) for i in range(prompts)]
    config = SimpleNamespace(spec=SimpleNamespace(num_speculative_tokens=2, threshold=0.0))
    cases = [measure_mod._Case(f"c{c}", config, SimpleNamespace(model=None, inner=None, key=f"c{c}"), None,
                               [[] for _ in ids], [[] for _ in ids], arrivals=[[] for _ in ids])
             for c in range(configs)]
    target = SimpleNamespace(device=torch.device("cpu"), model=None)
    monkeypatch.setattr(passes, "_models", lambda target, cases: {})
    passes.run_cases(target, cases, [f"p{i}" for i in range(prompts)], ids, repeats, 0, Progress(), meter)
    return [o for o in order if o[1] >= 0], cases, [o for o in order if o[1] < 0]


def test_configurations_take_turns_prompt_by_prompt(monkeypatch):
    order, cases, untimed = _run(monkeypatch, configs=3, prompts=5, repeats=2)
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


def test_with_an_energy_meter_turns_stay_prompt_by_prompt_and_energy_has_passes_of_its_own(monkeypatch):
    """R8: an NVML meter used to make each turn a whole pass (coarser interleaving on every GPU); the timed
    passes now take turns prompt by prompt as without one, and each configuration's energy is read around
    ENERGY_PASSES untimed passes of its own."""
    meter = _Meter()
    order, cases, untimed = _run(monkeypatch, configs=2, prompts=4, repeats=3, meter=meter)
    rounds = [order[i:i + 2] for i in range(0, len(order), 2)]
    for j, chunk in enumerate(rounds):  # both decode prompt j before either decodes the next
        assert {p for _, p in chunk} == {j % 4} and sorted(c for c, _ in chunk) == ["c0", "c1"]
    metered = [untimed[i:i + 4] for i in range(0, len(untimed), 4)]
    assert len(metered) == passes.ENERGY_PASSES * 2
    for chunk in metered:  # a metered pass: one configuration over all prompts
        assert len({c for c, _ in chunk}) == 1 and [-1 - p for _, p in chunk] == [0, 1, 2, 3]
    for case in cases:
        assert case.joules == [pytest.approx(1.0)] * passes.ENERGY_PASSES  # one read before and one after its pass
        assert case.joule_tokens == [16.0] * passes.ENERGY_PASSES
        assert all(len(t) == 3 for t in case.times) and len(case.probes) == 3 * 4  # after every prompt
