"""What a profile run measures (:class:`ProfileSettings`), what it returns (:class:`ProfileResult`) and
the progress sinks every measuring stage reports to (:class:`Progress`, :class:`StageLog`)."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, fields
from typing import Any

from specdec_tune.core.errors import InputError
from specdec_tune.core.limits import GRAPH_MODES, MAX_SPECULATIVE_TOKENS
from specdec_tune.core.splits import check_split
from specdec_tune.db import RunSettings


@dataclass(frozen=True)
class ProfileSettings:
    """How much to measure (defaults keep the bundled models under ~4 minutes on 2 CPU cores)."""

    device: str = "auto"
    dtype: str = "auto"
    forward: str = "auto"  # the engine's model forward: auto | lean | hf (engine.lean)
    cuda_graphs: str = "auto"  # the lean forward on CUDA replays CUDA graphs: auto | on | off (engine.cuda_graphs)
    temperature: float = 0.0
    batch_sizes: tuple[int, ...] = (1,)
    k_max: int = 17
    n_max: int = 16
    repeats: int = 20
    warmup: int = 3
    prefill_repeats: int = 3
    context_lens: tuple[int, ...] = (128, 256, 512)
    max_prompts: int = 16
    max_new_tokens: int = 64
    overhead_ns: tuple[int, ...] = (1, 4, 8)
    overhead_prompts: int = 8
    seed: int = 0
    label: str | None = None
    split: str = "tune"  # which prompts of the workload (specdec_tune.core.splits.split_prompts); then max_prompts
    threads: int | None = None  # intra-op threads (None: chosen by profiler.threads, "auto")
    # Synthetic acceptance α_1, α_2, ... (greedy; engine.verify.SyntheticAcceptance): the verify step accepts
    # with these rates instead of asking the target, for model shapes with random weights. Labelled synthetic.
    synthetic_acceptance: tuple[float, ...] | None = None
    front_prompts: int = 4  # sampling: prompts each lossy rule and ε decodes for the measured front (0: none)
    trees: bool = False  # also record token-tree and staged-drafting data (profiler.tree_profile)
    # The θ > 0 pass: per draft, θ = threshold_pass at N = threshold_pass_n on the first threshold_prompts prompts
    # (a checked draft forward synchronises the host: engine/drafters.py); 0 prompts: none.
    threshold_pass: float = 0.3
    threshold_pass_n: int = 4
    threshold_prompts: int = 4
    hook_tax_prompts: int = 2  # prompts each pass design also decodes unhooked (the hooks' own cost); 0: none

    def __post_init__(self) -> None:
        object.__setattr__(self, "split", check_split(self.split))
        checks = [
            (self.k_max >= 2, f"--k-max must be >= 2, got {self.k_max}"),
            (1 <= self.n_max <= MAX_SPECULATIVE_TOKENS, f"--n-max must be in 1..{MAX_SPECULATIVE_TOKENS}, got {self.n_max}"),
            (self.repeats >= 1, f"--repeats must be >= 1, got {self.repeats}"),
            (self.warmup >= 0, f"--warmup must be >= 0, got {self.warmup}"),
            (self.max_prompts >= 1, f"--max-prompts must be >= 1, got {self.max_prompts}"),
            (self.max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {self.max_new_tokens}"),
            (self.temperature >= 0, f"--temperature must be >= 0 (0 = greedy), got {self.temperature}"),
            (bool(self.batch_sizes) and all(b >= 1 for b in self.batch_sizes),
             f"--batch-sizes must be integers >= 1, got {list(self.batch_sizes)}"),
            (all(c >= 1 for c in self.context_lens), f"context lengths must be >= 1, got {list(self.context_lens)}"),
            (all(n >= 1 for n in self.overhead_ns), f"overhead N values must be >= 1, got {list(self.overhead_ns)}"),
            (self.threads is None or self.threads >= 1, f"--threads must be 'auto' or >= 1, got {self.threads}"),
            (self.synthetic_acceptance is None or (bool(self.synthetic_acceptance)
                                                   and all(0.0 <= a <= 1.0 for a in self.synthetic_acceptance)),
             f"--synthetic-acceptance must be rates in [0, 1], got {self.synthetic_acceptance}"),
            (self.synthetic_acceptance is None or self.temperature == 0,
             "--synthetic-acceptance profiles greedy decoding only (--temperature 0)"),
            (self.front_prompts >= 0, f"--front-prompts must be >= 0, got {self.front_prompts}"),
            (0 < self.threshold_pass < 1, f"the θ pass's threshold must be in (0, 1), got {self.threshold_pass}"),
            (1 <= self.threshold_pass_n <= MAX_SPECULATIVE_TOKENS,
             f"the θ pass's N must be in 1..{MAX_SPECULATIVE_TOKENS}, got {self.threshold_pass_n}"),
            (self.threshold_prompts >= 0 and self.hook_tax_prompts >= 0,
             "the θ pass's and the hook-tax prompts must be >= 0"),
            (self.cuda_graphs in GRAPH_MODES,
             f"--cuda-graphs must be one of {', '.join(GRAPH_MODES)}, got {self.cuda_graphs!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InputError(message)


def run_settings(asked: ProfileSettings, **recorded: Any) -> RunSettings:
    """What a profile run stores as its settings: those it was asked (the label aside: it has its own column),
    replaced where the run resolved them (device, dtype, context lengths, threads), and what it ``recorded``.

    Raises:
        ValueError: a setting :class:`RunSettings` has no field for (it would be stored untyped).
    """
    values = {f.name: getattr(asked, f.name) for f in fields(asked) if f.name != "label"} | recorded
    unknown = sorted(set(values) - set(RunSettings.model_fields))
    if unknown:
        raise ValueError(f"RunSettings has no field for {', '.join(unknown)}: add one (db/run_settings.py)")
    return RunSettings(**values)


class Progress:
    """Progress sink: the CLI shows a bar, library callers may ignore it."""

    def stage(self, name: str, total: int) -> None:
        """A new stage of ``total`` steps begins."""

    def advance(self, steps: int = 1) -> None:
        """Steps of the current stage finished."""


class StageLog(Progress):
    """Progress sink printing one timestamped line per stage on stderr (a benchmark's log, not a bar)."""

    def stage(self, name: str, total: int) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {name} ({total} steps)", file=sys.stderr, flush=True)


@dataclass
class ProfileResult:
    """What a finished profile run produced (the rest is in the database)."""

    run_id: int
    target: str
    drafts: list[str]
    settings: dict
    telemetry: dict = field(default_factory=dict)
    threads: dict = field(default_factory=dict)  # the thread choice (profiler.threads.ThreadChoice.to_dict())
