"""Speculative sampling is exact: the first generated tokens follow the target's distribution.

Exact with a draft-confidence threshold θ too, because the stop decision is taken from the draft
distribution *before* a token is drawn (stop when the top probability is below θ), and with every
threshold kind (cumulative: the drafted prefix's probability times the top probability; adaptive: θ
moved between cycles by the verdicts). Each variant
(θ in {0, 0.3, 0.6}; N = 1 with two tokens so that a bonus token is observed) has shown power: the
same statistic rejects a verifier with a classic bug (resampling from p instead of the residual
max(p - q, 0)), a verifier that draws the bonus token from the wrong position, and the drafter's old
rule (sample a token, then drop it when q(token) < θ), kept here as a negative control.

p-values measured when this test was written (seed 1234, 1500 samples, ``pytest -s`` prints them):
see the report printed by :func:`test_speculative_sampling_matches_target_distribution`.
"""
from __future__ import annotations

import pytest
import torch
from scipy import stats

from specdec_tune.engine import DecodeConfig, ModelDrafter, SamplingVerifier, speculative
from specdec_tune.engine.drafters import probs_from_logits
from specdec_tune.engine.types import Draft, VerifyResult
from tests.support.stub_models import Bigram, constant

VOCAB = 6
TEMP = 1.0
SAMPLES = 1500


def target_joint(target, prompt) -> torch.Tensor:
    """Exact P(x1, x2 | prompt) of the target at temperature TEMP, ``[V, V]``."""
    with torch.no_grad():
        p1 = torch.softmax(target(prompt[None]).logits[0, -1] / TEMP, -1)
        p2 = torch.stack([torch.softmax(target(torch.cat([prompt, torch.tensor([x])])[None]).logits[0, -1] / TEMP, -1)
                          for x in range(VOCAB)])
    return p1[:, None] * p2


def wrong_verify(draft_tokens, draft_probs, target_probs, generator) -> VerifyResult:
    """Bug on purpose: after a rejection, sample from p (not from the residual)."""
    n = draft_tokens.shape[0]
    if n == 0:
        return VerifyResult(0, int(torch.multinomial(target_probs[0], 1, generator=generator)))
    idx = torch.arange(n)
    ratio = target_probs[idx, draft_tokens] / draft_probs[idx, draft_tokens]
    u = torch.rand(n, generator=generator, dtype=ratio.dtype)
    num = int((u < ratio).to(torch.int64).cumprod(0).sum())
    nxt = int(torch.multinomial(target_probs[num], 1, generator=generator))
    return VerifyResult(num, nxt)


def wrong_bonus_verify(draft_tokens, draft_probs, target_probs, generator) -> VerifyResult:
    """Bug on purpose: the bonus token is drawn from p at the last draft position, not after it."""
    from specdec_tune.engine.verify import verify_sampling

    res = verify_sampling(draft_tokens, draft_probs, target_probs, generator)
    n = draft_tokens.shape[0]
    if n and res.num_accepted == n:
        return VerifyResult(n, int(torch.multinomial(target_probs[n - 1], 1, generator=generator)))
    return res


class OldRuleDrafter(ModelDrafter):
    """The drafter's old, inexact threshold rule: sample x ~ q, then drop it when q(x) < θ.

    With a threshold kind it keeps that kind's number and θ but decides *after* the draw: cumulative,
    drop x when the prefix's probability times q(x) is below θ; adaptive, the moving θ (``observe``
    moves it as the real drafter's does). The negative control of every kind's exactness test.
    """

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        self._base_len = context.shape[0]
        logits = self._forward(context[self.cache.get_seq_length():])
        tokens, rows, confs = [], [], []
        theta, prefix = self.current_threshold, 1.0
        for i in range(max_tokens):
            q = probs_from_logits(logits, self.temperature)
            tok = torch.multinomial(q, 1, generator=self.generator)[0]
            score = prefix * float(q[tok]) if self.threshold_kind == "cumulative" else float(q[tok])
            if score < theta:
                break
            prefix *= float(q[tok])
            tokens.append(tok)
            rows.append(q)
            confs.append(q[tok])
            if i + 1 < max_tokens:
                logits = self._forward(tok[None])
        self._proposed = len(tokens)
        if not tokens:
            return Draft(torch.empty(0, dtype=torch.long), None, torch.empty(0))
        return Draft(torch.stack(tokens), torch.stack(rows), torch.stack(confs).float())


def sample_pairs(target, draft, prompt, *, n: int, theta: float, verify_fn=None, drafter_cls=ModelDrafter,
                 kind: str = "per-token", step: float = 0.05) -> torch.Tensor:
    """Counts of the first two emitted tokens over SAMPLES runs, ``[V, V]``."""
    counts = torch.zeros(VOCAB, VOCAB)
    gen = torch.Generator().manual_seed(1234)
    cfg = DecodeConfig(max_new_tokens=2, num_speculative_tokens=n, temperature=TEMP, threshold=theta,
                       threshold_kind=kind, threshold_step=step)
    with torch.no_grad():
        for _ in range(SAMPLES):
            drafter = drafter_cls(draft, 32, temperature=TEMP, threshold=theta, generator=gen, threshold_kind=kind,
                                  threshold_step=step)
            verifier = None if verify_fn is None else SamplingVerifier(TEMP, verify_fn)
            out = speculative(target, drafter, prompt, cfg, gen, verifier=verifier).token_ids
            counts[out[0], out[1]] += 1
    return counts


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = (probs * counts.sum()).flatten().double()
    observed = counts.flatten().double()
    # Pool cells with small expectation into one so the chi-square approximation holds.
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    return float(stats.chisquare(obs[keep].numpy(), exp[keep].numpy() * obs[keep].sum().item() / exp[keep].sum().item()).pvalue)


# Draft rows by design: row 0 (the prompt's last token) is over-confident (top 0.62, above both θ, so
# the old rule's drop of a sampled low-q token shows); the rows reached at position 2 have top
# probabilities below 0.3, between 0.3 and 0.6 and above 0.6, so θ cuts at varied positions.
DRAFT_ROWS = [
    [0.05, 0.02, 0.62, 0.08, 0.03, 0.20],
    [0.20, 0.28, 0.05, 0.05, 0.25, 0.17],
    [0.90, 0.04, 0.03, 0.01, 0.01, 0.01],
    [0.10, 0.45, 0.10, 0.10, 0.20, 0.05],
    [0.02, 0.35, 0.40, 0.03, 0.15, 0.05],
    [0.02, 0.30, 0.05, 0.01, 0.12, 0.50],
]


@pytest.fixture(scope="module")
def pair():
    """Bigram target and draft (``tests.support.stub_models``): the engine's whole loop at microseconds a forward."""
    g = torch.Generator().manual_seed(7)
    target = Bigram(torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64) * 1.2)
    draft = Bigram(torch.tensor(DRAFT_ROWS, dtype=torch.float64).log())
    prompt = torch.tensor([3, 1, 0])
    return target, draft, prompt, target_joint(target, prompt)


# (N, θ): N = 2 drafts both tokens; N = 1 with two tokens observes the bonus token after an accepted draft.
VARIANTS = [(2, 0.0), *(pytest.param(n, t, marks=pytest.mark.slow) for n, t in [(2, 0.3), (2, 0.6), (1, 0.0), (1, 0.3)])]


@pytest.mark.parametrize("n,theta", VARIANTS)
def test_speculative_sampling_matches_target_distribution(pair, n, theta):
    target, draft, prompt, probs = pair
    good = chi2_pvalue(sample_pairs(target, draft, prompt, n=n, theta=theta), probs)
    controls = {"wrong verifier": dict(verify_fn=wrong_verify)}
    if n == 1:
        controls["wrong bonus"] = dict(verify_fn=wrong_bonus_verify)
    if theta > 0:
        controls["old drafter rule"] = dict(drafter_cls=OldRuleDrafter)
    bad = {k: chi2_pvalue(sample_pairs(target, draft, prompt, n=n, theta=theta, **kw), probs) for k, kw in controls.items()}
    print(f"\nN={n} θ={theta}: exact p={good:.3g}; " + "; ".join(f"{k} p={v:.3g}" for k, v in bad.items()))
    assert good > 1e-3, f"exact sampler rejected (p = {good:.2e})"
    for k, v in bad.items():
        assert v < 1e-6, f"{k} not detected (p = {v:.2e}): the test has no power"


# (kind, N, θ, step): the cumulative kind at N = 2 cuts position 2 on q(x_1)·top_2 (rows reached at
# position 2 have top probabilities 0.28..0.90, and q(x_1) spans 0.02..0.62); N = 1 with two tokens
# runs a second cycle after a rejection, where the adaptive θ has moved from 0.3 to 0.6.
KIND_VARIANTS = [("cumulative", 2, 0.3, 0.05), ("cumulative", 2, 0.15, 0.05), ("cumulative", 1, 0.3, 0.05),
                 ("adaptive", 1, 0.3, 0.3), ("adaptive", 2, 0.3, 0.3)]


@pytest.mark.slow
@pytest.mark.parametrize("kind,n,theta,step", KIND_VARIANTS)
def test_threshold_kinds_keep_sampling_exact(pair, kind, n, theta, step):
    """Every threshold kind decides before the token is drawn, so the first two emitted tokens follow the
    target's joint distribution; the same kind deciding after the draw (OldRuleDrafter) and a wrong
    verifier are rejected by the same statistic (the test's power)."""
    target, draft, prompt, probs = pair
    good = chi2_pvalue(sample_pairs(target, draft, prompt, n=n, theta=theta, kind=kind, step=step), probs)
    controls = {"wrong verifier": dict(verify_fn=wrong_verify), "decided after the draw": dict(drafter_cls=OldRuleDrafter)}
    bad = {k: chi2_pvalue(sample_pairs(target, draft, prompt, n=n, theta=theta, kind=kind, step=step, **kw), probs)
           for k, kw in controls.items()}
    print(f"\n{kind} N={n} θ={theta} step={step}: exact p={good:.3g}; " + "; ".join(f"{k} p={v:.3g}" for k, v in bad.items()))
    assert good > 1e-3, f"exact sampler rejected (p = {good:.2e})"
    for k, v in bad.items():
        assert v < 1e-6, f"{k} not detected (p = {v:.2e}): the test has no power"


def test_threshold_kinds_cut_differently(pair):
    """The kinds are different rules on the same draft: the cumulative kind stops where per-token does
    not, and the adaptive θ moves with the verdicts (up after a rejection, down after full acceptance)."""
    target, draft, prompt, _ = pair
    gen = torch.Generator().manual_seed(5)
    lengths = {}
    for kind in ("per-token", "cumulative"):
        lengths[kind] = sum(ModelDrafter(draft, 32, temperature=TEMP, threshold=0.3, generator=gen,
                                         threshold_kind=kind).propose(prompt, 4).length for _ in range(300))
    assert lengths["cumulative"] < 0.8 * lengths["per-token"], lengths
    d = ModelDrafter(draft, 32, temperature=TEMP, threshold=0.3, generator=gen, threshold_kind="adaptive",
                     threshold_step=0.3)
    seen = []
    for verdict in (0, 0, 0, "all", "all", "all", "all"):  # rejections push θ up to its bound, acceptance down
        d.cache.truncate(0)  # the same context again, from an empty cache
        draft_ = d.propose(prompt, 2)
        assert draft_.threshold == pytest.approx(d.current_threshold)
        seen.append(d.current_threshold)
        d.observe(draft_.length if verdict == "all" else min(verdict, max(draft_.length - 1, 0)))
    assert max(seen) == pytest.approx(0.9) and min(seen) == pytest.approx(0.0) and seen[0] == pytest.approx(0.3)


def first_token_counts(drafter_cls, theta: float, samples: int = 4000) -> int:
    """How often the first emitted token is 0 with q = (0.9, 0.1), p = (0.5, 0.5)."""
    target, draft = constant([0.5, 0.5]), constant([0.9, 0.1])
    gen = torch.Generator().manual_seed(99)
    cfg = DecodeConfig(max_new_tokens=1, num_speculative_tokens=1, temperature=TEMP, threshold=theta)
    zeros = 0
    for _ in range(samples):
        drafter = drafter_cls(draft, 8, temperature=TEMP, threshold=theta, generator=gen)
        zeros += speculative(target, drafter, torch.tensor([0]), cfg, gen).token_ids[0] == 0
    return zeros


@pytest.mark.slow
def test_threshold_decided_before_sampling_hand_built_case():
    """q = (0.9, 0.1), p = (0.5, 0.5), θ = 0.5: the old rule emits token 0 with probability
    0.9·(5/9) + 0.1·0.5 = 0.55; deciding from the top probability (0.9 >= θ: always draft) gives p."""
    samples = 4000
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):  # the decision reads the top probability, never the drawn token
        drafter = ModelDrafter(constant([0.9, 0.1]), 8, temperature=TEMP, threshold=0.5, generator=gen)
        d = drafter.propose(torch.tensor([0]), 1)
        assert d.length == 1 and float(d.confidence[0]) == pytest.approx(0.9)
    drafter = ModelDrafter(constant([0.9, 0.1]), 8, temperature=TEMP, threshold=0.95, generator=gen)
    assert drafter.propose(torch.tensor([0]), 1).length == 0
    new = first_token_counts(ModelDrafter, 0.5, samples)
    old = first_token_counts(OldRuleDrafter, 0.5, samples)
    p_new = stats.binomtest(new, samples, 0.5).pvalue
    p_old = stats.binomtest(old, samples, 0.5).pvalue
    print(f"\nhand-built case: new rule P(0)={new / samples:.4f} (p={p_new:.3g}); old rule P(0)={old / samples:.4f} (p={p_old:.3g})")
    assert p_new > 1e-3, f"new rule: P(first = 0) = {new / samples:.4f}, not 0.5"
    assert p_old < 1e-6 and abs(old / samples - 0.55) < 0.025, f"old rule: P(first = 0) = {old / samples:.4f}, not 0.55"


@pytest.mark.parametrize("theta", [0.0, 0.3])
def test_sampling_confidence_is_the_top_probability(pair, theta):
    """What traces record is what θ is compared with: the top draft probability per position (rule
    before), so the replay's cut at the first confidence below θ is the drafter's stop."""
    _, draft, prompt, _ = pair
    gen = torch.Generator().manual_seed(3)
    lower = 0
    for _ in range(50):
        d = ModelDrafter(draft, 32, temperature=TEMP, threshold=theta, generator=gen).propose(prompt, 4)
        top = d.probs.max(dim=-1).values.float()
        torch.testing.assert_close(d.confidence, top)
        lower += int((d.probs.gather(1, d.tokens[:, None])[:, 0].float() < top).sum())
        assert bool((d.confidence >= theta).all())
    assert lower > 0  # a drawn token's own probability often differs: the distinction matters
    hf = ModelDrafter(draft, 32, temperature=TEMP, threshold=0.3, generator=gen, threshold_rule="hf").propose(prompt, 4)
    torch.testing.assert_close(hf.confidence, hf.probs.gather(1, hf.tokens[:, None])[:, 0].float())
