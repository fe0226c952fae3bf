"""The throughput model's replay against the real engine (not against a copy of the engine's rules).

Traces are recorded by the engine at θ = 0, N = N_max (constant schedule); ``tuner.model.predict``
replays them for a heuristic schedule and a threshold; the engine then runs that configuration on
the same prompts and its measured E[τ] and E[L] must match the prediction. The cases are the ones
where a cycle drafts nothing (L = 0) often: n-gram lookup that finds no match, and sampling with a
threshold. How L = 0 moves N_cur (``specdec_tune.core.schedules``) then matters, and the test has power:
with the engine's old rule (shrink after L = 0) the same comparison fails.

The replay treats cycles as independent draws, which real decoding is not (a cycle's context depends
on the previous one), so agreement is within a tolerance, not exact. Measured when written:
n-gram: E[τ] off by 0.1 %, E[L] by 0.04 % with one rule; the old engine rule puts E[L] 53 % off
(tolerance 10 %). Sampling, θ = 0.5 (bigram models, ~2300 cycles, s.e. of E[τ] ≈ 1.2 %): E[τ] off by
1.6 % (E[L] 5.2 %) with one rule, 4.3 % (8.9 %) with the old one; the 3 % E[τ] tolerance separates
them, but only by about one standard error on each side: the strong evidence is the n-gram case.
Greedy with HF's threshold rule is checked exactly: the greedy simulation reproduces the engine's
cycles one by one.
"""
from __future__ import annotations

import pytest
import torch

import specdec_tune.engine.draft_budget as draft_budget
from specdec_tune.engine import DecodeConfig, ModelDrafter, NgramDrafter, speculative
from specdec_tune.tuner.model import ModelProfile, SpecConfig, Trace, predict
from tests.support.stub_models import Bigram
from tests.support.tiny import tiny_llama

VOCAB = 48
N_MAX = 6
VERIFY = {k: 0.02 + 0.001 * k for k in range(1, N_MAX + 2)}


def old_engine_rule(schedule: str, current: int, cap: int, drafted: int, accepted: int) -> int:
    """The engine's rule before ``specdec_tune.core.schedules``: a cycle that drafted nothing shrinks N."""
    if schedule == "constant":
        return cap
    return min(cap, current + 2) if drafted and accepted == drafted else max(1, current - 1)


def prompts(count: int, length: int = 12, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # A repeated motif so that prompt lookup finds matches now and then.
    return [torch.cat([torch.randint(0, VOCAB, (length,), generator=g)] * 2) for _ in range(count)]


def run(target, make_drafter, cfg: DecodeConfig, items, seed: int = 0):
    """Cycles of every prompt (the last, budget-cut, cycle of each dropped), and per-prompt results."""
    cycles = []
    with torch.no_grad():
        for i, ids in enumerate(items):
            gen = torch.Generator().manual_seed(seed + i)
            out = speculative(target, make_drafter(gen), ids, cfg, gen)
            cycles += out.cycles[:-1]
    return cycles


def measured(cycles) -> tuple[float, float]:
    return sum(c.accepted + 1 for c in cycles) / len(cycles), sum(c.drafted for c in cycles) / len(cycles)


def compare(target, make_drafter, items, theta: float, temperature: float, max_new: int,
            schedule: str = "heuristic", n: int = N_MAX, kind: str = "per-token", step: float = 0.05,
            model_kind: str | None = None, token_probs: bool = True) -> dict:
    """Engine-measured vs replay-predicted (E[τ], E[L]) for ``schedule`` at (N, θ) and a threshold kind.

    ``model_kind`` predicts with another kind than the engine ran, ``token_probs=False`` with the top
    probabilities in place of the drafted tokens' own (the negative controls)."""
    base = dict(max_new_tokens=max_new, temperature=temperature)
    # token_probs=False: multiply the top probabilities instead (what a replay without them would do)
    traces = [Trace(c.confidences, c.accepted, (c.token_probs if token_probs else c.confidences) if c.token_probs else None)
              for c in run(target, lambda g: make_drafter(g, 0.0), DecodeConfig(num_speculative_tokens=N_MAX, **base), items)]
    mode = "sampling" if temperature > 0 else "greedy"
    profile = ModelProfile({1: 0.001}, {1: VERIFY}, traces if mode == "greedy" else (),
                           sampling_traces=traces if mode == "sampling" else None)
    pred = predict(profile, SpecConfig(n, threshold=theta, schedule=schedule, mode=mode,
                                       threshold_kind=model_kind or kind, threshold_step=step))
    cfg = DecodeConfig(num_speculative_tokens=n, threshold=theta, schedule=schedule, threshold_kind=kind,
                       threshold_step=step, **base)
    cycles = run(target, lambda g: make_drafter(g, theta, kind, step), cfg, items, seed=1000)
    tau, length = measured(cycles)
    sd = (sum((c.drafted - length) ** 2 for c in cycles) / (len(cycles) - 1)) ** 0.5
    return {"tau": (tau, pred.expected_tokens_per_cycle), "L": (length, pred.expected_draft_length),
            "L=0": sum(c.drafted == 0 for c in cycles) / len(cycles), "cycles": len(cycles),
            "se_L": sd / len(cycles) ** 0.5}


def errors(result: dict) -> tuple[float, float]:
    return tuple(abs(got - want) / want for got, want in (result["tau"], result["L"]))


@pytest.fixture(scope="module")
def ngram_case():
    target = tiny_llama(VOCAB, layers=2, seed=0, sharpness=3.0)
    return target, (lambda g, theta, *kind: NgramDrafter(ngram_max=3, ngram_min=2)), prompts(16)


@pytest.fixture(scope="module")
def sampling_case():
    """Bigram target and draft (``tests.support.stub_models``): thousands of sampled cycles in seconds, so the
    sampling noise stays well below the gap between the two rules."""
    g = torch.Generator().manual_seed(11)
    # A random bigram target and a sharper, noisy copy as draft: top draft probabilities straddle θ,
    # so a quarter of the cycles draft nothing (L = 0).
    logits = torch.randn(12, 12, generator=g, dtype=torch.float64) * 2.5
    target = Bigram(logits)
    draft = Bigram(logits * 1.3 + torch.randn(12, 12, generator=g, dtype=torch.float64))
    items = [torch.randint(0, 12, (4,), generator=g) for _ in range(100)]
    def make(gen, theta, kind="per-token", step=0.05):
        return ModelDrafter(draft, 256, temperature=1.0, threshold=theta, generator=gen, threshold_kind=kind,
                            threshold_step=step)

    return target, make, items


THETA = 0.5


@pytest.mark.slow
def test_heuristic_replay_predicts_engine_ngram(ngram_case, monkeypatch):
    target, make, items = ngram_case
    res = compare(target, make, items, 0.0, 0.0, 48)
    print(f"\nngram: {res}")
    assert res["L=0"] > 0.2  # the case the rule is about
    e_tau, e_len = errors(res)
    assert e_tau < 0.05 and e_len < 0.10, res
    monkeypatch.setattr(draft_budget, "next_num_speculative", old_engine_rule)
    old = compare(target, make, items, 0.0, 0.0, 48)
    print(f"ngram, old engine rule: {old}")
    o_tau, o_len = errors(old)
    assert o_len > 0.10, f"the old rule passes too: the test has no power ({old})"


@pytest.mark.slow
def test_heuristic_replay_predicts_engine_sampling_threshold(sampling_case, monkeypatch):
    target, make, items = sampling_case
    res = compare(target, make, items, THETA, 1.0, 60)
    print(f"\nsampling θ={THETA}: {res}")
    assert res["L=0"] > 0.15
    e_tau, e_len = errors(res)
    assert e_tau < 0.03 and e_len < 0.08, res
    monkeypatch.setattr(draft_budget, "next_num_speculative", old_engine_rule)
    old = compare(target, make, items, THETA, 1.0, 60)
    print(f"sampling θ={THETA}, old engine rule: {old}")
    o_tau, o_len = errors(old)
    assert o_tau > 0.03, f"the old rule passes too: the test has no power ({old})"


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_constant_replay_predicts_engine_ngram(ngram_case, n):
    """n-gram τ is an i.i.d. replay of the N_max cycles, not exact (the cycle boundaries, hence the
    contexts looked up, differ with N); it must still agree with the engine within 5 %."""
    target, make, items = ngram_case
    res = compare(target, make, items, 0.0, 0.0, 48, schedule="constant", n=n)
    print(f"\nngram constant N={n}: {res}")
    e_tau, e_len = errors(res)
    assert e_tau < 0.05 and e_len < 0.10, res


@pytest.mark.slow
@pytest.mark.parametrize("kind,theta,step,control", [("cumulative", 0.3, 0.05, "no token probabilities"),
                                                     ("adaptive", 0.5, 0.1, "per-token model")])
def test_threshold_kind_replay_predicts_engine_sampling(sampling_case, kind, theta, step, control):
    """Sampling traces replayed under the cumulative kind (with the drafted tokens' probabilities they
    record) and the adaptive kind (a chain over θ's levels) predict the engine's E[τ] and E[L]; the
    replay without the tokens' probabilities, or blind to the adaptation, misses (the test's power)."""
    target, make, items = sampling_case
    res = compare(target, make, items, theta, 1.0, 60, schedule="constant", kind=kind, step=step)
    print(f"\nsampling {kind} θ={theta}: {res}")
    e_tau, e_len = errors(res)
    assert e_tau < 0.03 and e_len < 0.05, res
    wrong = dict(token_probs=False) if control == "no token probabilities" else dict(model_kind="per-token")
    bad = compare(target, make, items, theta, 1.0, 60, schedule="constant", kind=kind, step=step, **wrong)
    print(f"{control}: {bad}")
    b_tau, b_len = errors(bad)
    assert b_len > 0.10, f"{control} passes too: the test has no power ({bad})"
