"""The pure verify step on hand-built distributions that force acceptance and rejection."""
from __future__ import annotations

import torch

from specdec_tune.engine import verify_greedy, verify_sampling


def onehot(i: int, v: int = 5) -> torch.Tensor:
    t = torch.zeros(v, dtype=torch.float64)
    t[i] = 1.0
    return t


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_accepts_matching_prefix_and_recovers():
    target = torch.stack([onehot(2), onehot(3), onehot(0), onehot(4)])  # argmaxes 2, 3, 0, 4
    r = verify_greedy(torch.tensor([2, 3, 1]), target)
    assert (r.num_accepted, r.next_token) == (2, 0)


def test_greedy_all_accepted_gives_bonus():
    target = torch.stack([onehot(1), onehot(1), onehot(4)])
    r = verify_greedy(torch.tensor([1, 1]), target)
    assert (r.num_accepted, r.next_token) == (2, 4)


def test_greedy_empty_draft_is_a_plain_step():
    r = verify_greedy(torch.empty(0, dtype=torch.long), onehot(3)[None])
    assert (r.num_accepted, r.next_token) == (0, 3)


def test_sampling_forced_accept_when_p_equals_q():
    p = torch.tensor([[0.1, 0.6, 0.3, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2], [0, 0, 0, 0, 1.0]], dtype=torch.float64)
    for seed in range(20):
        r = verify_sampling(torch.tensor([1, 3]), p[:2], p, gen(seed))
        assert r.num_accepted == 2 and r.next_token == 4  # bonus from the last row (point mass)


def test_sampling_forced_reject_and_residual():
    # q puts its mass on token 0 where p has none: always rejected; residual max(p - q, 0) = p here.
    q = torch.stack([onehot(0)])
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0], [0.2] * 5], dtype=torch.float64)
    for seed in range(20):
        r = verify_sampling(torch.tensor([0]), q, p, gen(seed))
        assert (r.num_accepted, r.next_token) == (0, 2)


def test_sampling_residual_excludes_overproposed_tokens():
    # p = (.5, .5), q = (.9, .1): rejection of token 0 must resample from norm(max(p-q,0)) = token 1 only.
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.9, 0.1]], dtype=torch.float64)
    seen = {verify_sampling(torch.tensor([0]), q, p, gen(s)) for s in range(200)}
    rejected = [r for r in seen if r.num_accepted == 0]
    assert rejected and all(r.next_token == 1 for r in rejected)
    # acceptance rate of token 0 is p/q = 5/9
    acc = sum(verify_sampling(torch.tensor([0]), q, p, gen(s)).num_accepted for s in range(3000)) / 3000
    assert abs(acc - 5 / 9) < 0.03


def test_sampling_point_mass_drafter():
    # n-gram drafter: q = one-hot, accept with probability p(x); on rejection x itself is excluded.
    p = torch.tensor([[0.25, 0.75, 0, 0, 0], [1.0, 0, 0, 0, 0]], dtype=torch.float64)
    results = [verify_sampling(torch.tensor([1]), None, p, gen(s)) for s in range(2000)]
    acc = sum(r.num_accepted for r in results) / len(results)
    assert abs(acc - 0.75) < 0.03
    assert all(r.next_token == 0 for r in results)  # recovered -> token 0, bonus -> token 0
