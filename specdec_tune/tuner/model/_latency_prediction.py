"""Per-request latency predicted: the TPOT and TTFT *distribution* over requests, not only a mean.

A request's TPOT is its decode window over its tokens after the first (``specdec_tune.core.latency``):

    TTFT_r = prefill_r + set-up + T_1           TPOT_r = Σ_{j ≥ 2} T_j / (n_r - 1)

with T_j = F_j·T_s(B) + T_v(B, L_j + 1) + o_c the j-th cycle's time (the per-cycle time of the
throughput model, docs/architecture.md, The throughput model) and the cycles' (L, A, F) from the
replayed acceptance:

- greedy with a model draft: each profiled prompt's cycles simulated exactly (:mod:`._greedy_sim`), so
  each prompt's TPOT is its own; where acceptance is low (a hard prompt) TPOT is high: the spread
  across requests comes from the prompts, which is what a p90 or p99 SLO sees;
- otherwise (n-gram lookup, sampling): each prompt's own recorded cycles replayed i.i.d.
  (:func:`predict` on that prompt's traces), K_r = n_r / E[τ_r] cycles, TPOT_r = (K_r - 1)·E[T_r] / (n_r - 1).

Plain decoding: TPOT = T_ar + the per-token loop overhead, TTFT = prefill + one step.

A prompt the profile did not run is one more request of the same population: its TTFT uses its own
length (the fitted prefill line) and the profiled prompts' mean first cycle; its TPOT is drawn from
the profiled prompts' TPOTs (each equally likely), so the predicted distribution of a held-out set
is the profiled population's. A request of one token has no TPOT (NaN here, left out of its quantiles), as
measured. Pure Python.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from specdec_tune.core.errors import InputError
from specdec_tune.core.latency import Slo, quantile
from specdec_tune.tuner.model._prefill import prefill_fits, prompt_prefill
from specdec_tune.tuner.model._predict import PromptSpec, _check_specs, context_cost, context_slope, plain_step_s
from specdec_tune.tuner.model._predict import replay_width, simulate_config, timed_cycles
from specdec_tune.tuner.model._suffix_predict import simulates_suffix
from specdec_tune.tuner.model._profile import RunProfile
from specdec_tune.tuner.model._replay import replay_reach
from specdec_tune.tuner.model._throughput import SpecConfig, Trace, predict


@dataclass(frozen=True)
class LatencyPrediction:
    """Predicted per-request latency of one configuration (seconds; every number predicted).

    Attributes:
        ttft_s: ``[requests]`` TTFT of each request.
        tpot_s: ``[requests]`` TPOT of each request (a held-out prompt contributes every profiled
            prompt's TPOT once, so its distribution is the population's).
        tokens: ``[requests]`` output tokens of each entry of ``tpot_s`` (goodput weights).
        source: ``simulation``, ``replay`` or ``baseline``.
    """

    ttft_s: tuple[float, ...]
    tpot_s: tuple[float, ...]
    tokens: tuple[float, ...]
    source: str
    label: str = "predicted"

    def tpot(self, q: float) -> float:
        """The ``q`` quantile (0..1) of TPOT over the requests that have one (NaN: none has)."""
        return quantile([t for t in self.tpot_s if not math.isnan(t)], q)

    def ttft(self, q: float) -> float:
        return quantile(self.ttft_s, q)

    def attainment(self, slo: Slo) -> float:
        """Token-weighted share of requests meeting ``slo`` (1 without a bound). TTFT and TPOT are
        predicted per request where both are known; a held-out prompt's TTFT pairs with each TPOT."""
        if not slo.active:
            return 1.0
        ttft_ok = sum(slo.meets(t, None) for t in self.ttft_s) / len(self.ttft_s)
        tpot_ok = sum(w for t, w in zip(self.tpot_s, self.tokens) if slo.meets(None, t)) / sum(self.tokens)
        return ttft_ok * tpot_ok  # independent: which prompt is long and which is hard are unrelated

    def scaled(self, factor: float) -> LatencyPrediction:
        """On a machine ``factor`` times as fast (``at_machine_speed``): every time divided by it."""
        if factor == 1.0:
            return self
        return replace(self, ttft_s=tuple(t / factor for t in self.ttft_s), tpot_s=tuple(t / factor for t in self.tpot_s))

    def summary(self) -> dict[str, float]:
        return {"ttft_p50_s": self.ttft(0.5), "tpot_p50_s": self.tpot(0.5), "tpot_p90_s": self.tpot(0.9),
                "tpot_p99_s": self.tpot(0.99)}


@dataclass(frozen=True)
class _Request:
    first_s: float  # the first cycle (or step): TTFT besides the prefill
    tpot_s: float
    tokens: int
    prompt_tokens: int = 0
    tpot_slope_s: float = 0.0  # d TPOT / d prompt tokens: the same cycles with a longer context
    first_slope_s: float = 0.0  # d first cycle / d prompt tokens


def _simulated(rp: RunProfile, config: SpecConfig, i: int) -> _Request:
    """Prompt ``i``'s cycles simulated exactly (greedy, model draft), each at its own context length."""
    b, n_tokens, prompt = config.batch_size, rp.prompts[i].new_tokens, rp.prompts[i].prompt_tokens
    cycles = simulate_config(rp, config, i)
    if not cycles:
        raise InputError(f"run {rp.run.id}: no greedy traces for prompt {i} of draft {rp.draft!r}")
    times, slopes = timed_cycles(rp, cycles, b, prompt, config.spec.threshold > 0)
    per = max(n_tokens - 1, 1)
    return _Request(times[0], sum(times[1:]) / per, n_tokens, prompt, sum(slopes[1:]) / per, slopes[0])


def _prompt_model(rp: RunProfile, i: int):
    """The draft's model profile restricted to prompt ``i``'s recorded cycles (all of them where it has none)."""
    def own(traces: Sequence[Trace] | None, prompts: Sequence[int | None]) -> Sequence[Trace] | None:
        if not traces or len(prompts) != len(traces):
            return traces
        mine = tuple(t for t, p in zip(traces, prompts) if p == i)
        return mine or traces

    return replace(rp.model, traces=own(rp.model.traces, rp.trace_prompts) or (),
                   sampling_traces=own(rp.model.sampling_traces, rp.sampling_trace_prompts))


def _replayed(rp: RunProfile, config: SpecConfig, i: int) -> _Request:
    """Prompt ``i``'s own cycles replayed i.i.d. (n-gram lookup, sampling). Where the prompt's longest
    recorded draft is shorter than N (lookup found no longer match), N is cut to it: the replay of a
    longer N would cut there anyway."""
    model = _prompt_model(rp, i)
    traces = model.sampling_traces if config.mode == "sampling" and model.sampling_traces else model.traces
    longest = replay_reach(traces)
    if 0 < longest < config.spec.num_speculative_tokens:
        config = replace(config, num_speculative_tokens=longest)
    p = predict(model, config)
    n_tokens, prompt = rp.prompts[i].new_tokens, rp.prompts[i].prompt_tokens
    cycles = max(n_tokens / p.expected_tokens_per_cycle, 1.0)
    k = replay_width(config, p.expected_tokens_per_cycle)
    slope = context_slope(rp, k, config.batch_size)
    cycle = p.cycle_time_s + context_cost(rp, k, prompt + n_tokens / 2, config.batch_size)
    per = max(n_tokens - 1, 1)
    return _Request(cycle, (cycles - 1.0) * cycle / per, n_tokens, prompt, (cycles - 1.0) * slope / per, slope)


def _plain(rp: RunProfile, b: int, i: int) -> _Request:
    n_tokens, prompt = rp.prompts[i].new_tokens, rp.prompts[i].prompt_tokens
    step = plain_step_s(rp, b, prompt, n_tokens)
    slope = context_slope(rp, 1, b)
    # the prefill gives the first token's logits: it costs a pick, no forward (_predict.plain_seconds)
    return _Request(rp.model.ar_overhead_s, step, n_tokens, prompt, 0.0, slope)


def _requests(rp: RunProfile, config: SpecConfig) -> tuple[list[_Request], str]:
    """Every profiled prompt's predicted first cycle and TPOT."""
    if not rp.prompts:
        raise InputError(f"run {rp.run.id} has no profiled prompts")
    count = range(len(rp.prompts))
    if config.spec.num_speculative_tokens == 0:
        return [_plain(rp, config.batch_size, i) for i in count], "baseline"
    if rp.draft is None:
        raise InputError("a draft is needed to predict speculative decoding")
    if config.mode == "greedy" and (rp.positions is not None or simulates_suffix(rp, config)):
        return [_simulated(rp, config, i) for i in count], "simulation"
    return [_replayed(rp, config, i) for i in count], "replay"


def _prefill_s(rp: RunProfile, config: SpecConfig, spec: PromptSpec, fits) -> float:
    """Prefill and set-up before the first cycle, as the end-to-end prediction counts them (:mod:`._predict`)."""
    b = config.batch_size
    target, draft = prompt_prefill(rp, spec.profiled_index, spec.prompt_tokens, fits)
    if config.spec.num_speculative_tokens == 0:
        return target * b + rp.plain_setup_s
    raw_step = rp.first_draft_step_s.get(b, 0.0)  # the draft's first forward is its prefill
    return (target + draft - raw_step) * b + rp.sequence_s(config.spec.threshold > 0) - rp.cycle_overhead_s


def predict_latency(rp: RunProfile, config: SpecConfig, specs: Sequence[PromptSpec]) -> LatencyPrediction:
    """Predict every request's TTFT and TPOT for ``config`` on ``specs`` (module docstring).

    Raises:
        InputError: empty or invalid prompts, or a configuration the profile cannot predict.
    """
    specs = _check_specs(rp, specs)
    requests, source = _requests(rp, config)
    fits = prefill_fits(rp)
    ttft, tpot, tokens = [], [], []
    for s in specs:
        if s.profiled_index is not None:
            r = requests[s.profiled_index]
            ttft.append(_prefill_s(rp, config, s, fits) + r.first_s)
            tpot.append(r.tpot_s if r.tokens >= 2 else math.nan)  # TPOT needs 2 tokens (specdec_tune.core.latency)
            tokens.append(float(r.tokens))
        else:  # the profiled population, each request moved to this prompt's length
            shift = [s.prompt_tokens - r.prompt_tokens for r in requests]
            ttft.append(_prefill_s(rp, config, s, fits)
                        + statistics.fmean(r.first_s + r.first_slope_s * d for r, d in zip(requests, shift)))
            tpot += [r.tpot_s + r.tpot_slope_s * d if r.tokens >= 2 and s.new_tokens >= 2 else math.nan
                     for r, d in zip(requests, shift)]
            tokens += [float(s.new_tokens) / len(requests)] * len(requests)
    return LatencyPrediction(tuple(ttft), tuple(tpot), tuple(tokens), source)
