"""What ``tune`` was asked (:class:`TuneRequest`), what it reports (:class:`TuneReport`), and whether a
stored profile already answers the request."""
from __future__ import annotations

import math
import platform
from dataclasses import dataclass, field
from typing import Any

from specdec_tune.db import Database, RunRecord, list_runs
from specdec_tune.core.errors import InputError
from specdec_tune.profiler import ProfileSettings
from specdec_tune.core.latency import Slo
from specdec_tune.tuner.model import GIB, Objective, TuningResult
from specdec_tune.tuner.search._space import ANY, N_LIMIT, THRESHOLD_KINDS, check_server

TREE_K_MAX = 17  # with --trees the verify curve reaches 17 positions: trees of up to 16 nodes


@dataclass(frozen=True)
class TuneRequest:
    """Everything ``specdec-tune tune`` was asked (defaults: the README's main job on a 2-core CPU)."""

    target: str
    drafts: tuple[str, ...]
    workload: str
    server: str = ANY
    trials: int = 200
    measure_top: int = 6
    batch_sizes: tuple[int, ...] = (1, 4, 16, 64)
    temperature: float = 0.0
    objectives: tuple[str, ...] = ()  # two for a Pareto front (--objectives A,B); () = the objective alone
    objective: str = "throughput"  # what the winner is chosen by (--objective)
    slo_tpot_ms: float | None = None
    slo_ttft_ms: float | None = None
    slo_percentile: float = 99.0
    gpu_price: float | None = None  # dollars per hour (--gpu-price)
    memory_budget_gib: float | None = None  # --memory-budget
    study: str | None = None
    n_max: int = N_LIMIT
    max_prompts: int = 12  # tuning prompts profiled
    max_new_tokens: int = 48
    profile_repeats: int = 10
    measure_prompts: int = 8  # tuning prompts measured per candidate
    heldout_prompts: int = 16
    repeats: int = 3
    seed: int = 0
    device: str = "auto"
    thresholds: tuple[float, ...] | None = None  # θ grid override (benchmarks); default: 0..0.95 step 0.05
    reprofile: bool = False  # profile afresh even when a matching profile is stored (regress --retune)
    backend: str = "engine"  # engine | vllm: where the confirmation and held-out measurements run
    vllm_python: str | None = None  # the vLLM venv's Python (--backend vllm; else $SPECDEC_VLLM_PYTHON)
    threads: int | None = None  # intra-op threads (None: chosen by the profiler, "auto")
    threshold_kinds: tuple[str, ...] = ("per-token",)  # how θ may apply (per-token, cumulative, adaptive)
    max_bias: float | None = None  # a bias budget per verified position: Decoding-OPT's ε is searched too
    trees: tuple[str, ...] = ()  # token trees searched besides chains, plus staged drafting (._tree_space); () = chains only

    def __post_init__(self) -> None:
        check_server(self.server)
        if self.max_bias is not None:
            if not 0.0 <= self.max_bias <= 1.0:
                raise InputError(f"--max-bias must be a total variation distance in [0, 1], got {self.max_bias}")
            if self.temperature <= 0:
                raise InputError("--max-bias needs --temperature > 0: lossy acceptance is a sampling rule")
            if self.objectives not in ((), ("throughput",)) or self.objective != "throughput":
                raise InputError("--max-bias makes its own objectives (throughput and bias); drop --objectives and "
                                 "--objective")
            object.__setattr__(self, "objectives", ("throughput", "bias"))
        bad = [k for k in self.threshold_kinds if k not in THRESHOLD_KINDS]
        if bad or not self.threshold_kinds:
            raise InputError(f"--threshold-kinds must list some of {', '.join(THRESHOLD_KINDS)}, "
                             f"got {','.join(self.threshold_kinds)!r}")
        if not self.drafts:
            raise InputError("--drafts needs at least one draft (a model, or 'ngram')")
        if len(set(self.drafts)) != len(self.drafts):
            raise InputError(f"--drafts lists a draft twice: {','.join(self.drafts)}")
        if not 1 <= self.n_max <= N_LIMIT:
            raise InputError(f"--n-max must be in 1..{N_LIMIT}, got {self.n_max}")
        for flag, value in (("--trials", self.trials), ("--measure-top", self.measure_top),
                            ("--repeats", self.repeats), ("--max-prompts", self.max_prompts),
                            ("--measure-prompts", self.measure_prompts), ("--heldout-prompts", self.heldout_prompts),
                            ("--max-new-tokens", self.max_new_tokens)):
            if value < 1:
                raise InputError(f"{flag} must be >= 1, got {value}")
        if self.temperature < 0:
            raise InputError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.thresholds is not None and (not self.thresholds or any(not 0 <= t <= 0.95 for t in self.thresholds)):
            raise InputError(f"thresholds must lie in [0, 0.95], got {list(self.thresholds)}")
        if self.threads is not None and self.threads < 1:
            raise InputError(f"--threads must be 'auto' or >= 1, got {self.threads}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise InputError(f"--batch-sizes must be integers >= 1, got {list(self.batch_sizes)}")
        if self.trees:
            from specdec_tune.tuner.search._tree_space import check_shapes

            object.__setattr__(self, "trees", check_shapes(self.trees))
            if self.backend != "engine":
                raise InputError("--trees measures trees in the engine: use --backend engine")
        if self.backend not in ("engine", "vllm"):
            raise InputError(f"--backend must be engine or vllm, got {self.backend!r}")
        self.spec()  # a bad objective, SLO, price or budget fails before anything runs
        if self.backend == "vllm":
            if self.server != "vllm":
                raise InputError(f"--backend vllm measures on vLLM, so it tunes for vLLM: pass --server vllm "
                                 f"(not {self.server!r})")
            if self.temperature > 0 or len(self.objectives) > 1:
                raise InputError("--backend vllm tunes greedy decoding for one objective (--temperature 0, no Pareto "
                                 "--objectives)")
            from specdec_tune.profiler import require_vllm_python

            require_vllm_python(self.vllm_python)  # a missing or broken path fails before profiling

    @property
    def mode(self) -> str:
        return "sampling" if self.temperature > 0 else "greedy"

    @property
    def search_objectives(self) -> tuple[str, ...]:
        """What the study optimises: the Pareto pair, or the objective alone."""
        return self.objectives or (self.objective,)

    def spec(self, watts: float | None = None) -> Objective:
        """The :class:`Objective` asked (``watts``: the device's mean power while profiling, for energy).

        Raises:
            InputError: a bad objective, SLO, price or budget (one line naming the flag).
        """
        try:
            slo = Slo(self.slo_tpot_ms, self.slo_ttft_ms, self.slo_percentile)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if self.gpu_price is not None and not (math.isfinite(self.gpu_price) and self.gpu_price >= 0):
            raise InputError(f"--gpu-price must be a non-negative number of dollars per hour, got {self.gpu_price!r}")
        budget = None if self.memory_budget_gib is None else self.memory_budget_gib * GIB
        return Objective(self.objective, slo, self.gpu_price, budget, watts)

    def study_name(self, run_id: int | None = None) -> str:
        """The default study of this request on profile run ``run_id``: what was tuned, and from which
        profile, so the same command (which reuses the profile) resumes the same study, and a study never
        holds trials predicted from two profiles. Without ``run_id``: the name of the family (the part
        before ``-run<id>``)."""
        import hashlib
        import json

        key = [self.target, list(self.drafts), self.workload, self.temperature, list(self.search_objectives),
               self.n_max, self.max_prompts, self.max_new_tokens,
               list(self.thresholds) if self.thresholds is not None else None]
        if self.search_objectives != ("throughput",) or self.memory_budget_gib is not None:
            # the trials' values depend on these (a throughput study without a budget keeps its old name)
            key += [self.slo_tpot_ms, self.slo_ttft_ms, self.slo_percentile, self.gpu_price, self.memory_budget_gib]
        if self.threshold_kinds != ("per-token",):  # (studies made before the kinds keep their names)
            key.append(list(self.threshold_kinds))
        if self.trees:  # (likewise studies made before trees)
            key.append(list(self.trees))
        key = json.dumps(key, sort_keys=True)
        short = lambda s: s.rstrip("/").rsplit("/", 1)[-1]  # noqa: E731
        backend = "" if self.backend == "engine" else f"-{self.backend}"
        run = "" if run_id is None else f"-run{run_id}"
        return (f"tune-{short(self.target)}-{short(self.workload)}-{self.server}{backend}-"
                f"{hashlib.sha1(key.encode()).hexdigest()[:8]}{run}")


@dataclass
class TuneReport:
    """What ``tune`` found: the result (stored in the study) and the evidence behind it."""

    result: TuningResult
    study: str
    storage: str
    run_id: int
    profiled: bool
    completed_trials: int
    new_trials: int
    sampler: str
    confirmation: list[dict[str, Any]] = field(default_factory=list)  # measured on the tuning prompts
    pareto: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    exports: list[str] = field(default_factory=list)
    space: Any = None  # the SearchSpace searched
    server_report: dict[str, Any] | None = None  # --backend vllm: calibration, schedule, per-B held-out
    threads: dict[str, Any] | None = None  # the thread choice the measurements ran with (profiler.ThreadChoice)
    not_written: dict[str, str] = field(default_factory=dict)  # export format asked but not written -> why
    new_states: dict[str, int] = field(default_factory=dict)  # this process's trials per end state

    def trial_counts(self) -> dict[str, int]:
        """Counts that add up: ``completed`` = ``completed_other`` (earlier runs, other processes) +
        ``completed_new``; ``new`` = ``completed_new`` + ``pruned_new`` + ``failed_new``."""
        done = self.new_states.get("COMPLETE", 0)
        return {"completed": self.completed_trials, "completed_other": self.completed_trials - done,
                "completed_new": done, "pruned_new": self.new_states.get("PRUNED", 0),
                "failed_new": self.new_states.get("FAIL", 0), "new": self.new_trials}


# --------------------------------------------------------------------------- profile reuse


def profile_settings(req: TuneRequest) -> ProfileSettings:
    kwargs: dict[str, Any] = dict(
        device=req.device, temperature=req.temperature, batch_sizes=tuple(sorted(set(req.batch_sizes))),
        n_max=req.n_max, k_max=max(req.n_max + 1, TREE_K_MAX if req.trees else 0), repeats=req.profile_repeats,
        max_prompts=req.max_prompts, max_new_tokens=req.max_new_tokens, seed=req.seed, label="tune",
        threads=req.threads, trees=bool(req.trees),
    )
    return ProfileSettings(split="tune", **kwargs)


def find_profile(db: Database, req: TuneRequest) -> int | None:
    """A completed run that answers this request as a fresh profile would (newest first), or None."""
    for run in list_runs(db, status="completed", target=req.target):
        if answers(run, req):
            return run.id
    return None


def answers(run: RunRecord, req: TuneRequest) -> bool:
    """Whether the completed profile ``run`` answers ``req`` as a fresh profile on this machine would."""
    wanted = profile_settings(req)
    s = run.settings
    return (
        run.status == "completed" and run.target.name == req.target
        and s.workload == req.workload
        and set(req.drafts) <= set(s.drafts)
        and s.split == wanted.split
        and abs(s.temperature - req.temperature) < 1e-9
        and s.n_max >= req.n_max
        and set(req.batch_sizes) <= set(s.batch_sizes)
        and s.max_new_tokens == req.max_new_tokens
        and s.max_prompts == req.max_prompts
        and (not req.trees or (s.trees and s.k_max >= wanted.k_max))
        and run.hardware.hostname == (platform.node() or None)
        and (req.device == "auto" or run.hardware.device == req.device)
    )


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C once the study was named: ``study`` says which one holds the trials kept."""

    def __init__(self, study: str) -> None:
        super().__init__(study)
        self.study = study
