"""Measured end-to-end decode runs: one prompt through the baseline or speculative engine, timed.

The engine never times itself; this module wraps a whole decode call in a stopwatch (one
synchronisation at the end on a GPU) and aggregates the per-cycle statistics the engine returns.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from specdec_tune.engine import (
    DecodeConfig,
    GenerationResult,
    LoadedModel,
    acceptance_per_position,
    autoregressive,
    build_drafter,
    speculative,
)
from specdec_tune.engine import StagedDrafter, build_tree_drafter, tree_speculative
from specdec_tune.core.errors import InputError
from specdec_tune.core.latency import RequestLatency
from specdec_tune.profiler.suffix_history import SuffixHistory
from specdec_tune.profiler.timers import Stopwatch, synchronize
from specdec_tune.core.trees import parse_tree

NGRAM = "ngram"
SUFFIX = "suffix"


@dataclass(frozen=True)
class DraftSpec:
    """Which drafter a run uses: a loaded draft model, n-gram lookup, suffix decoding or none (baseline); a
    model draft may draft token trees (``tree``, ``specdec_tune.core.trees``; ``rank_accept`` shapes a Sequoia
    tree) or be speculated itself by ``inner`` (staged drafting, ``inner_n`` tokens per inner cycle); suffix
    decoding drafts from ``history``, the serving histories of the measurement (``profiler.suffix_history``;
    default: requests in the order they run)."""

    kind: str  # "model" | "ngram" | "suffix" | "none"
    model: LoadedModel | None = None
    tree: str = ""
    rank_accept: tuple[float, ...] = ()
    inner: DraftSpec | None = None
    inner_n: int = 3
    history: SuffixHistory | None = None

    def __post_init__(self) -> None:
        if self.kind == SUFFIX and self.history is None:
            object.__setattr__(self, "history", SuffixHistory())

    @property
    def name(self) -> str:
        return self.model.name if self.model is not None else self.kind


@dataclass
class MeasuredRun:
    """One prompt decoded and timed (seconds measured; everything else counted)."""

    prompt_id: str
    prompt_tokens: int
    token_ids: list[int]
    text: str
    seconds: float
    cycles: int
    mean_tokens_per_cycle: float | None
    acceptance_per_position: list[float] = field(default_factory=list)  # alpha_i, conditional
    acceptance_per_cycle: list[float] = field(default_factory=list)  # beta_i, per cycle
    result: GenerationResult | None = None
    latency: RequestLatency | None = None  # when each cycle's tokens reached the host

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("inf")

    def to_json(self) -> dict:
        return {
            "prompt_id": self.prompt_id,
            "token_ids": self.token_ids,
            "text": self.text,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
            "cycles": self.cycles,
            "mean_tokens_per_cycle": self.mean_tokens_per_cycle,
            "acceptance_per_position": self.acceptance_per_position,
            "acceptance_per_cycle": self.acceptance_per_cycle,
        }


def encode_prompt(target: LoadedModel, text: str, prompt_id: str = "prompt") -> torch.Tensor:
    """Tokenise a prompt the way HF does by default; an empty prompt is refused."""
    if not text or not text.strip():
        raise InputError(f"prompt {prompt_id!r} is empty")
    ids = target.tokenizer(text, return_tensors="pt").input_ids[0].to(target.device)
    if ids.numel() == 0:
        raise InputError(f"prompt {prompt_id!r} encodes to no tokens")
    return ids


def decode_once(
    target: LoadedModel,
    draft: DraftSpec,
    prompt_ids: torch.Tensor,
    config: DecodeConfig,
    seed: int | None = None,
    on_cycle=None,
) -> GenerationResult:
    """Run one decode (untimed) with a fresh drafter and generator."""
    generator = None
    if seed is not None:
        generator = torch.Generator(device=target.device)
        generator.manual_seed(seed)
    with torch.inference_mode():
        if draft.kind == "none":
            return autoregressive(target.model, prompt_ids, config, generator, on_cycle=on_cycle)
        if draft.kind == SUFFIX:
            spec = config.spec if config.spec.is_suffix else replace(config.spec, drafter=SUFFIX)
            drafter = build_drafter(None, spec, max_len=0, suffix_cache=draft.history.cache(config))
            loop = tree_speculative if spec.tree else speculative
            return loop(target.model, drafter, prompt_ids, config, generator, on_cycle=on_cycle)
        if draft.tree or draft.inner is not None:
            return _tree_or_staged(target, draft, prompt_ids, config, generator, on_cycle)
        drafter = build_drafter(draft.model.model if draft.model is not None else None, config.spec,
                                max_len=prompt_ids.shape[0] + config.room, temperature=config.temperature,
                                generator=generator)
        return speculative(target.model, drafter, prompt_ids, config, generator, on_cycle=on_cycle)


def _tree_or_staged(target: LoadedModel, draft: DraftSpec, prompt_ids: torch.Tensor, config: DecodeConfig,
                    generator: torch.Generator | None, on_cycle) -> GenerationResult:
    """A decode with a tree drafter (``engine.tree_decode``) or a staged drafter (``engine.staged``)."""
    if draft.model is None:
        raise InputError("token trees and staged drafting need a draft model")
    spec = parse_tree(draft.tree)
    n = config.spec.num_speculative_tokens
    max_len = prompt_ids.shape[0] + config.room + (spec.nodes(n) - n if spec else 0)
    t = config.temperature
    if spec is not None:
        drafter = build_tree_drafter(draft.model.model, max_len, spec, rank_accept=draft.rank_accept, temperature=t,
                                     generator=generator)
        return tree_speculative(target.model, drafter, prompt_ids, config, generator, on_cycle=on_cycle)
    if draft.model.forward == "eagle3":
        raise InputError(f"staged drafting speculates a draft model's own decoding; {draft.name!r} is an EAGLE-3 "
                         "head, whose steps read the target's features (draft it alone, as a chain or a tree)")
    inner = draft.inner
    inner_drafter = build_drafter(inner.model.model if inner.model is not None else None,
                                  max_len=max_len + draft.inner_n + 2, temperature=t, generator=generator)
    staged = StagedDrafter(draft.model.model, inner_drafter, draft.inner_n, max_len, temperature=t, generator=generator)
    return speculative(target.model, staged, prompt_ids, config, generator, on_cycle=on_cycle)
class TokenClock:
    """The engine's ``on_cycle`` hook that notes when each cycle's tokens reached the host.

    The engine never times (docs/architecture.md, Engine contracts); it calls this after every cycle
    (plain decoding: every token). Each cycle already ends in the engine's one host synchronisation
    (the verdict read back, the picked token), so ``perf_counter`` here is when the tokens are on the
    host, where a server would stream them, on a CPU and on a GPU alike.
    """

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.times: list[float] = []
        self.tokens: list[int] = []

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.times, self.tokens = [], []

    def __call__(self, stats) -> None:
        self.times.append(time.perf_counter() - self.t0)
        self.tokens.append(int(stats.emitted))

    def request(self) -> RequestLatency:
        return RequestLatency(tuple(self.times), tuple(self.tokens))


def measure_prompt(
    target: LoadedModel,
    draft: DraftSpec,
    prompt_ids: torch.Tensor,
    config: DecodeConfig,
    *,
    prompt_id: str = "prompt",
    seed: int | None = None,
) -> MeasuredRun:
    """Decode one prompt and time the whole call (wall clock, one sync at the end), and when each
    cycle's tokens arrived (:class:`TokenClock`: TTFT, TPOT, inter-token gaps)."""
    watch = Stopwatch(target.device)
    clock = TokenClock()
    synchronize(target.device)
    watch.start()
    clock.start()
    result = decode_once(target, draft, prompt_ids, config, seed, on_cycle=clock)
    seconds = watch.stop()
    cycles = result.cycles
    if cycles:
        alpha, beta = acceptance_per_position(cycles)
        tau = sum(c.accepted + 1 for c in cycles) / len(cycles)  # tau counts the bonus/recovered token
    else:
        alpha, beta, tau = [], [], None
    text = target.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    return MeasuredRun(
        prompt_id=prompt_id,
        prompt_tokens=result.prompt_tokens,
        token_ids=result.token_ids,
        text=text,
        seconds=seconds,
        cycles=len(cycles),
        mean_tokens_per_cycle=tau,
        acceptance_per_position=alpha,
        acceptance_per_cycle=beta,
        result=result,
        latency=clock.request(),
    )


def after_request(draft: DraftSpec, config: DecodeConfig) -> None:
    """A request of a measurement ended (outside its timed decode): suffix decoding's history policy acts."""
    if getattr(draft, "history", None) is not None:  # a stand-in spec (tests) may have none
        draft.history.after_request(config)


def new_pass(draft: DraftSpec) -> None:
    """A new pass over the prompts starts: suffix decoding's histories start again."""
    if getattr(draft, "history", None) is not None:
        draft.history.new_pass()


def rerunnable(spec: DraftSpec, config: DecodeConfig, fn):
    """``fn`` for a timed region that may run again (``profiler.clean``): suffix decoding's history forgets the
    earlier attempt's response first, so the kept attempt drafts from the requests before it only."""
    if getattr(spec, "history", None) is None:
        return fn
    ran: list[bool] = []

    def once():
        if ran:
            cache = spec.history.cache(config)
            cache.forget(cache.last_request())
        ran.append(True)
        return fn()
    return once


WARM_UP_TOKENS = 8  # the fewest tokens a warm-up decodes (allocation, kernel selection)


def warm_up(target: LoadedModel, draft: DraftSpec, prompt_ids: torch.Tensor, config: DecodeConfig) -> float:
    """One short untimed decode (allocation, kernel selection); returns its seconds for reporting (its
    configuration differs from the measured one's, so a suffix drafter's warm-up joins no measured history).

    It decodes at least N + 2 tokens (capped at the configuration's), so its first cycle drafts all N and
    a second one follows: the widths 1..N + 1 and, after a fully accepted first cycle, the draft's catch-up
    run once here (a warm-up of 8 tokens left N + 1 to a timed pass for N >= 8). With CUDA graphs this is not
    enough on its own: ``profiler.measure_passes`` warms every prompt and makes every graph first."""
    tokens = max(WARM_UP_TOKENS, config.spec.num_speculative_tokens + 2)
    short = DecodeConfig(min(tokens, config.max_new_tokens), config.spec, temperature=config.temperature)
    watch = Stopwatch(target.device)
    watch.start()
    decode_once(target, draft, prompt_ids, short, seed=0)
    return watch.stop()
