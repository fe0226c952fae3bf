"""The model's records: what a profile knows (:class:`ModelProfile`), one configuration
(:class:`SpecConfig`) and its prediction (:class:`Prediction`). Private half of :mod:`tuner.model`."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from specdec_tune.core.errors import InputError
from specdec_tune.core.speculative import SpeculativeConfig, with_fields
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
        threshold_forward_s: what each draft forward of a cycle costs beyond θ = 0's terms when θ > 0 reads
            its confidence (the host waits for it: ``float(conf)``, plus its exp and logsumexp), fitted to the
            profile's θ > 0 pass (:mod:`tuner.model._threshold`); 0 where none ran.
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
    threshold_forward_s: float = 0.0

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


@dataclass(frozen=True, init=False)
class SpecConfig:
    """One configuration to predict: what to speculate, at a batch size, in a decoding mode.

    The speculative fields live in ``spec`` (:class:`~specdec_tune.core.speculative.SpeculativeConfig`,
    validated there; N = 0 is plain decoding). As a shorthand, N and θ may lead positionally and any other
    field of ``spec`` be given by name: ``SpecConfig(4, 0.3, schedule="heuristic", batch_size=8)``.

    Attributes:
        spec: what to speculate (the model reads N, θ and its rule and kind, the schedule, the acceptance).
        batch_size: B >= 1 sequences decoded together.
        mode: 'greedy' or 'sampling' (the lossy acceptances need sampling).
        acceptance_source: sampling mode's acceptance: 'traces' (recorded sampling cycles), 'tv' (the
            teacher-forced 1 - TV per position) or 'auto' (traces when recorded, else a mean 1 - TV).
    """

    spec: SpeculativeConfig
    batch_size: int
    mode: Literal["greedy", "sampling"]
    acceptance_source: Literal["auto", "traces", "tv"]

    def __init__(self, num_speculative_tokens: int | None = None, threshold: float | None = None, *,
                 spec: SpeculativeConfig | None = None, batch_size: int = 1, mode: str = "greedy",
                 acceptance_source: str = "auto", **speculative: Any) -> None:
        lead = {"num_speculative_tokens": num_speculative_tokens, "threshold": threshold}
        changes = {**{k: v for k, v in lead.items() if v is not None}, **speculative}
        values = {"spec": with_fields(spec, changes, "SpecConfig"), "batch_size": batch_size, "mode": mode,
                  "acceptance_source": acceptance_source}
        for name, value in values.items():
            object.__setattr__(self, name, value)  # frozen: set once, here
        self._check()

    def _check(self) -> None:
        b = self.batch_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InputError(f"batch_size={b!r} must be an int >= 1")
        if self.mode not in ("greedy", "sampling"):
            raise InputError(f"mode={self.mode!r} must be 'greedy' or 'sampling'")
        if self.spec.acceptance != "exact" and self.mode != "sampling":
            raise InputError(f"acceptance={self.spec.acceptance!r} is a sampling rule; mode must be 'sampling'")
        if self.acceptance_source not in ("auto", "traces", "tv"):
            raise InputError(f"acceptance_source={self.acceptance_source!r} must be auto, traces or tv")
        if self.spec.threshold_kind == "adaptive" and self.spec.schedule != "constant":
            raise InputError("the adaptive threshold kind is modelled with the constant schedule only, "
                             f"got schedule={self.spec.schedule!r}")


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
