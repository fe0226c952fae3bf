"""The model's records: what a profile knows (:class:`ModelProfile`), one configuration
(:class:`SpecConfig`) and its prediction (:class:`Prediction`). Private half of :mod:`tuner.model`."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from specdec_tune.core.errors import InputError
from specdec_tune.core.schedules import AdaptiveThreshold, check_threshold_kind
from specdec_tune.tuner.model._replay import Trace


def _check_time(what: str, value: float, allow_zero: bool) -> None:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        kind = "non-negative" if allow_zero else "positive"
        raise InputError(f"{what}={value!r} must be a finite {kind} number of seconds")


@dataclass(frozen=True)
class ModelProfile:
    """Everything the model needs about one (target, draft, hardware, workload).

    Attributes:
        draft_step_s: batch size B -> T_s(B), seconds of one draft forward producing one token, at the
            workload's typical context. Empty means a free drafter (n-gram lookup).
        verify_s: B -> {k -> T_v(B, k)}, seconds of one target forward over k new tokens, k = 1..K_max.
            T_v(B, 1) is the autoregressive step; T_ar = verify_s[1][1].
        traces: greedy cycles recorded with θ = 0 and N = N_max.
        cycle_overhead_s: engine time per speculative cycle that is neither a draft nor a target forward.
        ar_overhead_s: engine time per token of the plain decoding loop besides the target forward.
        sampling_acceptance: 1 - E[TV(p, q)] from a teacher-forced pass (sampling mode).
        sampling_traces: cycles recorded in sampling mode; preferred over ``sampling_acceptance``.
        name: the draft's name.
        teacher_forced: per target-sampled generation, (1 - TV, the draft's top probability) per position
            (``SpecConfig.acceptance_source='tv'``; :func:`tuner.model._tv.tv_stats`).
        synthetic_acceptance: given conditional rates α_1, α_2, ... (the last repeats) that replace the
            greedy traces: synthetic acceptance, for model shapes with random weights. Predictions
            from them carry ``source="synthetic"``.
        draft_warmup_s: at B = 1, the excess of a cycle's 2nd, 3rd, ... draft forward over T_s(1) (the
            forwards of a cycle warm up one after another; measured in the loop, the last value holds
            for later forwards): a cycle of F forwards drafts for F·T_s + Σ_{j=2..F} excess_j
            (:func:`tuner.model._throughput.draft_seconds`). Empty: every forward costs T_s.
        lookup: the greedy traces are n-gram lookup cycles: a cycle cut to N goes on along its matched
            stretch (:func:`tuner.model._replay.lookup_cycles`), not stops.
    """

    draft_step_s: Mapping[int, float]
    verify_s: Mapping[int, Mapping[int, float]]
    traces: Sequence[Trace] = ()
    cycle_overhead_s: float = 0.0
    ar_overhead_s: float = 0.0
    sampling_acceptance: float | None = None
    sampling_traces: Sequence[Trace] | None = None
    name: str = ""
    teacher_forced: Sequence[tuple[Sequence[float], Sequence[float]]] = ()
    synthetic_acceptance: tuple[float, ...] | None = None
    draft_warmup_s: tuple[float, ...] = ()
    lookup: bool = False

    def __post_init__(self) -> None:
        if any(not math.isfinite(e) for e in self.draft_warmup_s):
            raise InputError(f"draft_warmup_s={self.draft_warmup_s!r} must be finite seconds")
        for b, t in self.draft_step_s.items():
            _check_time(f"draft_step_s[{b}]", t, allow_zero=True)
        if not self.verify_s:
            raise InputError("verify_s is empty; the profile needs at least T_v(B, 1) for one batch size")
        for b, curve in self.verify_s.items():
            if b < 1:
                raise InputError(f"verify_s batch size {b!r} must be >= 1")
            if 1 not in curve:
                raise InputError(f"verify_s[{b}] lacks k=1 (the autoregressive step time)")
            for k, t in curve.items():
                _check_time(f"verify_s[{b}][{k}]", t, allow_zero=False)
        _check_time("cycle_overhead_s", self.cycle_overhead_s, allow_zero=True)
        _check_time("ar_overhead_s", self.ar_overhead_s, allow_zero=True)
        a = self.sampling_acceptance
        if a is not None and not 0.0 <= a <= 1.0:
            raise InputError(f"sampling_acceptance={a!r} must lie in [0, 1]")
        rates = self.synthetic_acceptance
        if rates is not None and (not rates or any(not 0.0 <= r <= 1.0 for r in rates)):
            raise InputError(f"synthetic_acceptance={rates!r} must be rates in [0, 1]")


@dataclass(frozen=True)
class SpecConfig:
    """One speculative decoding configuration.

    Attributes:
        num_speculative_tokens: N >= 0, the most tokens drafted per cycle; 0 means plain decoding.
        threshold: θ in [0, 1); drafting stops at the first token whose draft confidence is below θ.
        schedule: 'constant' (N every cycle) or 'heuristic' (N_cur += 2 after a fully accepted
            draft, else N_cur -= 1, kept in 1..N).
        batch_size: B >= 1 sequences decoded together.
        mode: 'greedy' or 'sampling'.
        threshold_rule: 'before' (the engine's default: the position whose top draft probability is
            below θ is not drafted) or 'hf' (transformers' rule: that token is proposed, then drafting
            stops); see ``specdec_tune.core.schedules.threshold_cut``.
        threshold_kind: 'per-token', 'cumulative' (the drafted prefix's probability times the top
            probability is compared with θ) or 'adaptive' (θ is the start of a level that moves by
            ``threshold_step`` after each cycle); ``specdec_tune.core.schedules``.
        threshold_step: the adaptive kind's step.
        acceptance: 'exact', 'opt' (Decoding-OPT) or 'uno' (Decoding-UNO), sampling only; the two
            lossy rules share their speed (``engine.lossy``).
        epsilon: their over-acceptance ε.
        acceptance_source: sampling mode's acceptance: 'traces' (recorded sampling cycles), 'tv' (the
            teacher-forced 1 - TV per position) or 'auto' (traces when recorded, else a mean 1 - TV).
    """

    num_speculative_tokens: int
    threshold: float = 0.0
    schedule: Literal["constant", "heuristic"] = "constant"
    batch_size: int = 1
    mode: Literal["greedy", "sampling"] = "greedy"
    threshold_rule: Literal["before", "hf"] = "before"
    threshold_kind: Literal["per-token", "cumulative", "adaptive"] = "per-token"
    threshold_step: float = 0.05
    acceptance: Literal["exact", "opt", "uno"] = "exact"
    epsilon: float = 0.0
    acceptance_source: Literal["auto", "traces", "tv"] = "auto"

    def __post_init__(self) -> None:
        n = self.num_speculative_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"num_speculative_tokens={n!r} must be an int >= 0")
        if not (isinstance(self.threshold, (int, float)) and 0.0 <= self.threshold < 1.0):
            raise InputError(f"threshold={self.threshold!r} must lie in [0, 1)")
        if self.schedule not in ("constant", "heuristic"):
            raise InputError(f"schedule={self.schedule!r} must be 'constant' or 'heuristic'")
        b = self.batch_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InputError(f"batch_size={b!r} must be an int >= 1")
        if self.mode not in ("greedy", "sampling"):
            raise InputError(f"mode={self.mode!r} must be 'greedy' or 'sampling'")
        if self.threshold_rule not in ("before", "hf"):
            raise InputError(f"threshold_rule={self.threshold_rule!r} must be 'before' or 'hf'")
        try:
            check_threshold_kind(self.threshold_kind, self.threshold_rule)
            if self.threshold_kind == "adaptive":
                AdaptiveThreshold(self.threshold, self.threshold_step)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if self.acceptance not in ("exact", "opt", "uno") or not 0.0 <= self.epsilon <= 1.0 \
                or (self.acceptance == "exact" and self.epsilon != 0):
            raise InputError(f"acceptance={self.acceptance!r} with epsilon={self.epsilon!r}: valid are exact (epsilon 0), "
                             "opt and uno (epsilon in [0, 1])")
        if self.acceptance != "exact" and self.mode != "sampling":
            raise InputError(f"acceptance={self.acceptance!r} is a sampling rule; mode must be 'sampling'")
        if self.acceptance_source not in ("auto", "traces", "tv"):
            raise InputError(f"acceptance_source={self.acceptance_source!r} must be auto, traces or tv")
        if self.threshold_kind == "adaptive" and self.schedule != "constant":
            raise InputError("the adaptive threshold kind is modelled with the constant schedule only, "
                             f"got schedule={self.schedule!r}")

    @property
    def adaptive(self) -> AdaptiveThreshold | None:
        """The adaptive kind's lattice (``None`` for the other kinds)."""
        if self.threshold_kind != "adaptive":
            return None
        return AdaptiveThreshold(self.threshold, self.threshold_step)


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for one configuration (all per-cycle numbers are expectations).

    Attributes:
        tokens_per_s: total tokens per second over the B sequences, B·E[τ] / E[T_cycle].
        speedup: tokens_per_s ÷ baseline_tokens_per_s (plain decoding at the same B).
        baseline_tokens_per_s: B / (T_v(B, 1) + ar_overhead_s).
        expected_tokens_per_cycle: E[τ] per sequence (accepted + 1; vLLM's mean acceptance length).
        expected_draft_length: E[L], tokens proposed per cycle.
        expected_draft_forwards: E[F], draft forwards per cycle.
        cycle_time_s: E[T_cycle] in seconds.
        acceptance_per_position: conditional α_i implied for this configuration, ``[N]`` (NaN where no
            cycle reaches position i, e.g. a high θ cuts every draft before it).
        source: 'traces', 'sampling_traces', 'tv' (constant α = 1 - E[TV]) or 'baseline' (N = 0).
        label: always 'predicted', to tell it apart from measured numbers wherever both are shown.
    """

    tokens_per_s: float
    speedup: float
    baseline_tokens_per_s: float
    expected_tokens_per_cycle: float
    expected_draft_length: float
    expected_draft_forwards: float
    cycle_time_s: float
    acceptance_per_position: tuple[float, ...] = field(default=())  # [N]
    source: str = "traces"
    label: str = "predicted"
