"""The speculative configuration, declared once: what to speculate, whoever runs, predicts or stores it.

One frozen record, validated once on construction, read by every room (the engine's ``DecodeConfig``,
the model's ``SpecConfig``, the profiler's ``MeasureSpec`` and ``ArmSpec`` hold it; the tuner's
``Candidate`` *is* it). The shape follows vLLM's ``SpeculativeConfig`` (``vllm/config/speculative.py``:
one dataclass, a docstring under every field, validated in one place, read by every component); the
fields are ours. What is not part of *what to speculate* stays with the record that needs it: the
temperature and output limits (a decode), the batch size (a prediction), synthetic acceptance rates (a
stand-in for the target), a Sequoia tree's per-rank acceptance (a profile's measurement).

Plain decoding has one representation, :data:`PLAIN` (drafter ``"none"``, N = 0): every other way of
saying it (N = 0 with any drafter, or ``drafter="none"`` read from an old row) becomes that value, so
``is_plain`` is ``num_speculative_tokens == 0`` and two plain records compare equal.

Stored forms: :meth:`SpeculativeConfig.to_dict` writes the keys the tuner's ``Candidate`` always wrote
(study user attributes, trial attributes, reports); :meth:`SpeculativeConfig.from_dict` reads those and
the other stored shapes (``measured_runs.config``, a regression suite's benchmark), older rows with
fewer keys included. Pure Python (docs/architecture.md, Rooms: the core imports no room).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from specdec_tune.core.errors import InputError
from specdec_tune.core.limits import MAX_SPECULATIVE_TOKENS, check_num_speculative
from specdec_tune.core.schedules import SCHEDULES, AdaptiveThreshold, check_threshold_kind

NONE = "none"  # the drafter of plain decoding
NGRAM = "ngram"  # prompt lookup
SUFFIX = "suffix"  # suffix decoding (core/suffix.py)
MODEL_FREE = (NGRAM, SUFFIX)  # drafters that run no model (no weights, no draft forward)
SUFFIX_TREE = "suffix"  # the ``tree`` value of suffix decoding's own speculation tree (arctic's use_tree_spec)
ACCEPTANCE_RULES = ("exact", "opt", "uno")  # exact; Decoding-OPT; Decoding-UNO (engine/lossy.py)


def check_acceptance(method: str, epsilon: float) -> str:
    """``method`` if it is an acceptance rule and ``epsilon`` fits it, else :class:`InputError` naming the bad value."""
    if method not in ACCEPTANCE_RULES:
        raise InputError(f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}, got {method!r}")
    if not 0.0 <= epsilon <= 1.0:
        raise InputError(f"epsilon must be in [0, 1], got {epsilon}")
    if method == "exact" and epsilon != 0:
        raise InputError(f"the exact acceptance has no over-acceptance; epsilon must be 0, got {epsilon}")
    return method


@dataclass(frozen=True)
class SpeculativeConfig:
    """One speculative-decoding configuration (validated on construction; frozen)."""

    drafter: str | None = None
    """A draft model (bundled name, local path or hub id), ``"ngram"`` (prompt lookup), ``"suffix"`` (suffix
    decoding, ``specdec_tune.core.suffix``) or ``"none"`` (plain decoding). ``None``: the drafter the context supplies (a profile run's first draft; the drafter object
    handed to the engine)."""
    num_speculative_tokens: int = 4
    """N, the most tokens drafted per cycle, in 0..``MAX_SPECULATIVE_TOKENS``; 0 is plain decoding."""
    threshold: float = 0.0
    """θ in [0, 1): drafting stops at a position whose draft confidence is below it; 0 disables it."""
    threshold_rule: str = "before"
    """``"before"`` (the position below θ is not drafted; exact; llama.cpp ``p-min``) or ``"hf"``
    (transformers' ``assistant_confidence_threshold``: that token is proposed, then drafting stops)."""
    schedule: str = "constant"
    """``"constant"`` (N every cycle) or ``"heuristic"`` (HF's ``num_assistant_tokens_schedule``, capped at N;
    ``specdec_tune.core.schedules``)."""
    ngram_max: int = 3
    """Prompt lookup's longest n-gram (n-gram drafter only)."""
    ngram_min: int = 1
    """Prompt lookup's shortest n-gram (n-gram drafter only)."""
    threshold_kind: str = "per-token"
    """How θ applies: ``"per-token"``, ``"cumulative"`` (the drafted prefix's probability times the top
    probability) or ``"adaptive"`` (θ starts here and moves by ``threshold_step`` after each cycle); the two
    last need rule ``"before"`` (``specdec_tune.core.schedules``)."""
    threshold_step: float = 0.05
    """The adaptive kind's step, in (0, 1]: how far one verdict moves θ."""
    acceptance: str = "exact"
    """``"exact"``, ``"opt"`` (Decoding-OPT) or ``"uno"`` (Decoding-UNO); the lossy two need sampling."""
    epsilon: float = 0.0
    """The lossy rules' over-acceptance ε in [0, 1] (0 with ``"exact"``)."""
    tree: str = ""
    """A token tree of depth N (``specdec_tune.core.trees``: ``chains:M``, ``topk:b1-b2``, ``sequoia:B``,
    ``eagle:K:B``; for the suffix drafter ``"suffix"``: its own best-first tree of at most N nodes);
    ``""`` drafts a chain."""
    staged: str = ""
    """The inner drafter that speculates the draft model's own decoding (``"ngram"`` or a smaller draft
    model); ``""``: the draft decodes alone."""

    suffix_max_tree_depth: int = 24
    """Suffix decoding: the depth of its trees, which bounds match length plus draft length (vLLM's
    ``suffix_decoding_max_tree_depth``, >= 1)."""
    suffix_max_cached_requests: int = 10000
    """Suffix decoding: earlier responses the global tree keeps, the oldest evicted first; 0 disables it
    (vLLM's ``suffix_decoding_max_cached_requests``, >= 0)."""
    suffix_max_spec_factor: float = 1.0
    """Suffix decoding: at most this factor times the match length is drafted (the paper's MAX_SPEC = α·p;
    vLLM's ``suffix_decoding_max_spec_factor``, >= 0)."""
    suffix_min_token_prob: float = 0.1
    """Suffix decoding: only tokens whose estimated probability (frequency counts) is at least this are
    drafted (vLLM's ``suffix_decoding_min_token_prob``, in [0, 1])."""

    def __post_init__(self) -> None:
        n = self.num_speculative_tokens
        check_num_speculative(n, low=0)
        if n == 0 or self.drafter == NONE:
            if n != 0:
                raise InputError(f"drafter {NONE!r} is plain decoding; num_speculative_tokens must be 0, got {n}")
            self._become_plain()
            return
        if not (isinstance(self.threshold, (int, float)) and 0.0 <= self.threshold < 1.0):
            raise InputError(f"threshold must lie in [0, 1), got {self.threshold!r}")
        if self.schedule not in SCHEDULES:
            raise InputError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        try:
            check_threshold_kind(self.threshold_kind, self.threshold_rule)
            if self.threshold_kind == "adaptive":
                AdaptiveThreshold(self.threshold, self.threshold_step)  # names the bad value
        except ValueError as exc:
            raise InputError(str(exc)) from None
        check_acceptance(self.acceptance, self.epsilon)
        lo, hi = self.ngram_min, self.ngram_max
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise InputError(f"n-gram sizes must satisfy 1 <= ngram_min <= ngram_max, got {lo}, {hi}")
        check_suffix(self)

    def _become_plain(self) -> None:
        """Plain decoding's one value: every field at :data:`PLAIN`'s (a frozen record set once, here)."""
        for f in fields(self):
            object.__setattr__(self, f.name, f.default)
        object.__setattr__(self, "drafter", NONE)
        object.__setattr__(self, "num_speculative_tokens", 0)

    @property
    def is_plain(self) -> bool:
        """Plain (autoregressive) decoding: N = 0 (drafter ``"none"``)."""
        return self.num_speculative_tokens == 0

    @property
    def is_ngram(self) -> bool:
        return self.drafter == NGRAM

    @property
    def is_suffix(self) -> bool:
        return self.drafter == SUFFIX

    @property
    def adaptive(self) -> AdaptiveThreshold | None:
        """The adaptive kind's lattice of θ (``None`` for the other kinds)."""
        if self.threshold_kind != "adaptive":
            return None
        return AdaptiveThreshold(self.threshold, self.threshold_step)

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (the keys stored ``Candidate`` dicts always had); suffix decoding's fields only
        for a suffix drafter (the other stored forms keep their keys)."""
        d = asdict(self)
        if not self.is_suffix:
            for k in SUFFIX_FIELDS:
                del d[k]
        return d

    def to_row(self) -> dict[str, Any]:
        """The keys of a ``measured_runs.config`` row, in the order rows always had them: not the drafter
        (a column of its own) nor the n-gram sizes (rows never held them); a tree and an inner drafter
        only where set."""
        d = self.to_dict()
        row = {k: d.pop(k) for k in ("num_speculative_tokens", "threshold", "schedule")}
        for k in ("drafter", "ngram_max", "ngram_min"):
            del d[k]
        row.update((k, v) for k, v in d.items() if v or k not in ("tree", "staged"))
        return row

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpeculativeConfig:
        """Read any stored form: a ``to_dict`` (older ones lack later keys: their defaults), a
        ``measured_runs.config`` or a suite benchmark (the drafter under ``draft``); other keys are ignored,
        ``None`` values read as the default, plain decoding in any of its old spellings becomes :data:`PLAIN`."""
        out = {k: d[k] for k in FIELD_NAMES if d.get(k) is not None}
        if "drafter" not in out and d.get("draft") is not None:
            out["drafter"] = d["draft"]
        if out.get("drafter") == NONE or int(out.get("num_speculative_tokens", 1)) == 0:
            return PLAIN
        return cls(**out)

    def label(self) -> str:
        """Short human label, e.g. ``mini-draft-1l N=4 θ=0.3``."""
        if self.is_plain:
            return "plain decoding"
        parts = [self.drafter or "draft", f"N={self.num_speculative_tokens}"]
        if self.is_ngram:
            parts.append(f"ngram {self.ngram_min}..{self.ngram_max}")
        if self.is_suffix:
            parts.append(f"depth {self.suffix_max_tree_depth} α={self.suffix_max_spec_factor:g} "
                         f"p≥{self.suffix_min_token_prob:g} cached {self.suffix_max_cached_requests}")
        if self.threshold_kind == "adaptive":
            parts.append(f"adaptive θ from {self.threshold:g} step {self.threshold_step:g}")
        elif self.threshold > 0:
            kind = " cumulative" if self.threshold_kind == "cumulative" else ""
            parts.append(f"θ={self.threshold:g}{kind}" + (" (hf rule)" if self.threshold_rule == "hf" else ""))
        if self.schedule != "constant":
            parts.append(self.schedule)
        if self.acceptance != "exact":
            parts.append(f"{self.acceptance.upper()} ε={self.epsilon:g}")
        if self.tree:
            parts.append(f"tree {self.tree}")
        if self.staged:
            parts.append(f"staged by {self.staged}")
        return " ".join(parts)


FIELD_NAMES = frozenset(f.name for f in fields(SpeculativeConfig))
SUFFIX_FIELDS = ("suffix_max_tree_depth", "suffix_max_cached_requests", "suffix_max_spec_factor",
                 "suffix_min_token_prob")


def check_suffix(spec: SpeculativeConfig) -> None:
    """Suffix decoding's fields within vLLM's bounds (``SpeculativeConfig._validate_suffix_decoding``), and a
    suffix drafter's configuration one it can run (no θ: ``suffix_min_token_prob`` is its cut; a chain or its
    own tree; not staged). Raises :class:`InputError` naming the bad value."""
    depth, cached = spec.suffix_max_tree_depth, spec.suffix_max_cached_requests
    factor, floor = spec.suffix_max_spec_factor, spec.suffix_min_token_prob
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise InputError(f"suffix_max_tree_depth={depth!r} must be an integer >= 1")
    if isinstance(cached, bool) or not isinstance(cached, int) or cached < 0:
        raise InputError(f"suffix_max_cached_requests={cached!r} must be an integer >= 0 (0 disables the global tree)")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 <= factor < float("inf"):
        raise InputError(f"suffix_max_spec_factor={factor!r} must be a number >= 0")
    if not isinstance(floor, (int, float)) or isinstance(floor, bool) or not 0 <= floor <= 1:
        raise InputError(f"suffix_min_token_prob={floor!r} must lie in [0, 1]")
    if spec.drafter == SUFFIX:
        if spec.threshold > 0 or spec.threshold_kind != "per-token":
            raise InputError("suffix decoding has no θ: its cut is suffix_min_token_prob (leave threshold at 0)")
        if spec.tree not in ("", SUFFIX_TREE):
            raise InputError(f"suffix decoding drafts a chain or its own tree (tree={SUFFIX_TREE!r}), not {spec.tree!r}")
        if spec.staged:
            raise InputError("suffix decoding runs no model: nothing to stage")
    elif spec.tree == SUFFIX_TREE:
        raise InputError(f"tree={SUFFIX_TREE!r} is suffix decoding's own tree; it needs drafter {SUFFIX!r}")
PLAIN = SpeculativeConfig(NONE, 0)


def with_fields(spec: SpeculativeConfig | None, changes: Mapping[str, Any], owner: str) -> SpeculativeConfig:
    """``spec`` (default: ``SpeculativeConfig()``) with some fields changed: the shorthand of a record that
    holds the configuration (``DecodeConfig(8, num_speculative_tokens=3)``), so it names none of its fields.

    Raises:
        TypeError: a name that is no field of the configuration (as a constructor would).
    """
    unknown = sorted(set(changes) - FIELD_NAMES)
    if unknown:
        raise TypeError(f"{owner}() got unexpected keyword argument(s) {', '.join(unknown)}")
    base = spec if spec is not None else SpeculativeConfig()
    return replace(base, **changes) if changes else base


__all__ = ["ACCEPTANCE_RULES", "FIELD_NAMES", "MAX_SPECULATIVE_TOKENS", "MODEL_FREE", "NGRAM", "NONE", "PLAIN", "SUFFIX",
           "SUFFIX_FIELDS", "SUFFIX_TREE", "SpeculativeConfig", "check_acceptance", "check_suffix", "with_fields"]
