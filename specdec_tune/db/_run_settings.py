"""What a profile run measured and recorded: :class:`RunSettings`, the typed form of ``profile_runs.settings``.

The profiler writes one (``RunSettings.to_json``), every reader gets one on :class:`~specdec_tune.db.RunRecord`
(``run.settings.n_max``), and each field's default is written once, here: it is what a row stored before the
field existed means (so ``forward`` defaults to ``hf``, the only forward there was). Rows written by any
version read: missing keys take the default, keys this version does not know are kept (``model_extra``) and
written back unchanged, a key stored as ``null`` where the field takes no ``None`` reads as its default.

A pydantic model rather than a dataclass with a hand-written ``from_json``: the stored JSON has lists where
the record has tuples, pairs inside lists and string keys, and pydantic converts each field by its declared
type, in one place, where a hand-written reader would repeat a conversion per field.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from specdec_tune.core.errors import StorageError
from specdec_tune.core.limits import MAX_SEARCHED_TOKENS


class IdentityCheck(BaseModel):
    """What a profile's end checks (issue 37, F7): the model calibrated on the run reproduces the plain decoding
    it measured (hooked), and the loop's forwards cost what the micro-benchmarks say, within bounds. Written
    after the run by ``profile`` and ``tune`` (the tuner predicts; the profiler never does).

    Attributes:
        plain_predicted_tokens_per_s: plain decoding as the calibrated model predicts it, hooks included.
        plain_measured_tokens_per_s: the profile's hooked plain pass, measured.
        plain_error: predicted ÷ measured - 1 (beyond 3 %: one-off costs in the pass, or a term the model misses).
        in_loop_ratios: draft -> in-loop ÷ isolated time of the verify (the largest at the calibration's
            anchors) and of a later draft forward (beyond 1.5×: the loop did not run what was benchmarked).
        warnings: the problems found, one line each.
    """

    model_config = ConfigDict(frozen=True)

    plain_predicted_tokens_per_s: float
    plain_measured_tokens_per_s: float
    plain_error: float
    in_loop_ratios: dict[str, dict[str, float]] = {}
    warnings: tuple[str, ...] = ()


class RunSettings(BaseModel):
    """A profile run's settings: what it was asked to measure (``profiler.ProfileSettings``, label aside:
    that is ``profile_runs.label``) with the values the run resolved, and what it recorded about itself."""

    model_config = ConfigDict(frozen=True, extra="allow")

    # -- asked (profiler.ProfileSettings), with device, dtype, context_lens and threads as the run resolved them
    device: str = "auto"  # the device the run used: cpu, cuda, mps
    dtype: str = "auto"  # the dtype the models ran in (float32, bfloat16, ...)
    forward: str = "hf"  # the target's forward (lean | hf): runs before the lean forward existed used HF's
    cuda_graphs: str = "auto"  # --cuda-graphs as asked (auto | on | off); cuda_graphs_used says what ran
    temperature: float = 0.0  # of the sampling pass (0: greedy only)
    batch_sizes: tuple[int, ...] = (1,)  # the B of every T_v(B, k) and T_s(B) timed
    k_max: int = 17  # the widest verify forward timed: T_v(k) for k = 1..k_max
    n_max: int = MAX_SEARCHED_TOKENS  # the N the acceptance traces were recorded at: the largest N they replay
    repeats: int = 20
    warmup: int = 3
    prefill_repeats: int = 3
    context_lens: tuple[int, ...] = (128, 256, 512)  # context lengths of the T_s timings (typical one included)
    max_prompts: int = 16
    max_new_tokens: int = 64  # of every decode pass (baseline, traces)
    overhead_ns: tuple[int, ...] = (1, 4, 8)  # the small N of the overhead passes
    overhead_prompts: int = 8
    seed: int = 0
    split: str = "all"  # the workload's prompts profiled (core.splits): runs before splits profiled them all
    threads: int | None = None  # the intra-op threads the run used (None: not recorded)
    synthetic_acceptance: tuple[float, ...] | None = None  # given α_i instead of the target's verdicts
    front_prompts: int = 0  # prompts of the measured lossy front (runs before it measured none)
    trees: bool = False  # token-tree and staged-drafting data recorded (profile --trees)
    # The θ > 0 pass (per draft, θ = threshold_pass at N = threshold_pass_n on the first threshold_prompts
    # prompts): what a checked draft forward costs beyond θ = 0's (runs before it ran none: 0 prompts).
    threshold_pass: float = 0.0
    threshold_pass_n: int = 4
    threshold_prompts: int = 0
    hook_tax_prompts: int = 0  # prompts each pass design decoded unhooked too, for the hooks' cost (0: none)

    # -- recorded by the run
    lean_kernels: str | None = None  # the lean forward's kernels (engine.lean_kernels), None before recorded
    # whether the target ran CUDA graphs (on | off | failed (why)), read after the run; None before recorded
    cuda_graphs_used: str | None = None
    draft_cuda_graphs: dict[str, str | None] = {}  # draft model name -> its CUDA-graph state after the run
    graph_counters: dict[str, dict[str, Any]] = {}  # model -> its graph runner's counters after the run
    timed_regions: dict[str, Any] | None = None  # the timed regions' check (profiler.clean), None before recorded
    draft_forwards: dict[str, str] = {}  # draft model name -> its forward (lean | hf)
    target: str | None = None  # the target as named on the command line
    drafts: tuple[str, ...] = ()  # the drafts as named on the command line
    workload: str | None = None  # the workload as named on the command line
    prompt_ids: tuple[str, ...] = ()  # the profiled prompts, in order
    prompt_tokens: tuple[int, ...] = ()  # their lengths in tokens
    workload_prompt_tokens: tuple[tuple[str, int], ...] | None = None  # every workload prompt's (id, tokens)
    typical_context: int = 0  # the context length of the T_v(k) timings (0: not recorded)
    thread_choice: dict[str, Any] | None = None  # profiler.threads.ThreadChoice.to_dict()
    throughput: str | None = None  # what the run's tokens/s mean, in words
    identity_check: IdentityCheck | None = None  # the check at the profile's end (None: not made)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        """A stored ``null`` where the field takes no ``None`` means "not recorded": its default."""
        if not isinstance(data, Mapping):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or k not in fields or _takes_none(fields[k].annotation)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, *, where: str = "profile run") -> RunSettings:
        """Read stored settings (``None`` or ``{}``: every default).

        Raises:
            StorageError: a stored value of the wrong type (``where`` names the row).
        """
        try:
            return cls.model_validate(dict(data or {}))
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise StorageError(f"{where}: stored setting {field!r} is not valid: {first['msg']}") from None

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in ``profile_runs.settings`` (keys this version does not know kept)."""
        return self.model_dump(mode="json")

    @property
    def max_prompt_tokens(self) -> int:
        """The longest profiled prompt in tokens (0: not recorded)."""
        return max(self.prompt_tokens, default=0)


def _takes_none(annotation: Any) -> bool:
    return annotation is None or type(None) in get_args(annotation)
