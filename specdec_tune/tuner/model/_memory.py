"""Memory of a configuration, predicted: what serving it holds, and how many sequences fit a budget.

    memory(c, B, ctx) = W_target + W_draft + packed copies
                        + B · positions(c, ctx) · (kv_target + kv_draft) + graph pools

- **weights** W: parameters × bytes per element of the dtype they are held in;
- **packed copies**: our lean forward on a CPU in float32 repacks the linear weights (every layer's
  projections and the LM head) once into oneDNN's blocked layout at its first forward of 2 to 128
  tokens and keeps that second copy (``engine/lean.py``); 0 elsewhere. A speculating target verifies
  L + 1 ≥ 2 positions, and a draft model catches up 2 tokens after a fully accepted cycle, so both
  pack; plain decoding packs only when its prompt's prefill has 2 to 128 tokens (steps are 1 token);
- **KV caches**: 2 (K and V) × layers × KV heads × head dim × bytes per element, per position and
  sequence, for the target *and* the draft (a draft model keeps its own cache; n-gram lookup none).
  Our engine preallocates ``ctx + N + 2`` positions per cache when speculating (``ctx + 1`` for
  plain decoding), where ctx = prompt + new tokens;
- **CUDA-graph pools**: the memory a server's captured graphs hold, 0 unless given
  (``graph_pool_bytes``: what a server reports at start). Our engine replaying CUDA graphs
  (``engine/cuda_graphs.py``; ``graph_slots``) holds each cache in a slot rounded up to a power of two
  of at least 256 positions (``specdec_tune.core.limits``) and a second copy of each layer's q/k/v and
  gate/up weights, concatenated (the ``packed`` term, for models up to 1 GiB); its graphs' own pool
  (the captured forwards' intermediates) is not predicted;
- **prefill activations**: the tensors alive at the widest point of one decoder layer while the
  target prefills a T-token prompt (one sequence at a time): the residual, its norm, q, k, v and the
  attention output (6 × hidden), gate, up and their product (3 × intermediate) per token, and the
  attention scores (heads × T) per token where the kernel materialises them; a decode step's few
  positions are negligible. An estimate from the architecture, not a measurement: on the bundled
  models it explains most of what a 459-token prompt adds to the peak (``benchmarks/memory_fidelity.py``).

At a budget, the largest batch a configuration serves is what remains after its weights divided by one
sequence's caches: a draft costs sequences of batch (its weights and its cache per sequence), which is
why a draft that wins at low load can lose to n-gram lookup at high load (the "which N at which load"
question of vLLM RFC #4565; vLLM #17984 measured speculation turning into a loss at batch 32). Pure
Python.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from specdec_tune.core.errors import InputError
from specdec_tune.core.limits import slot_length
from specdec_tune.tuner.model._configs import Candidate

GIB = float(2**30)


@dataclass(frozen=True)
class ModelMemory:
    """One model as the engine holds it (bytes).

    Attributes:
        name: the model.
        weight_bytes: its parameters.
        kv_bytes_per_token: K and V of every layer for one position of one sequence.
        packed_bytes: the lean forward's blocked copy of its linear weights (0 where not packed).
        packed_widths: forwards of this many tokens (inclusive range) make that copy.
    """

    name: str
    weight_bytes: float
    kv_bytes_per_token: float
    packed_bytes: float = 0.0
    packed_widths: tuple[int, int] = (2, 128)
    activation_bytes_per_token: float = 0.0  # a prefill's per-token transient (module docstring)
    score_bytes_per_token2: float = 0.0  # attention scores: bytes per token², where materialised

    def activations(self, tokens: int) -> float:
        return tokens * self.activation_bytes_per_token + tokens * tokens * self.score_bytes_per_token2

    def packs(self, width: int) -> bool:
        return self.packed_bytes > 0 and self.packed_widths[0] <= width <= self.packed_widths[1]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted bytes of one configuration at one batch size and context (all predicted)."""

    target_weights: float
    draft_weights: float
    packed: float
    target_kv: float
    draft_kv: float
    graph_pools: float
    activations: float = 0.0
    label: str = "predicted"

    @property
    def total(self) -> float:
        return (self.target_weights + self.draft_weights + self.packed + self.target_kv + self.draft_kv
                + self.graph_pools + self.activations)

    def to_dict(self) -> dict[str, float]:
        return {"target_weights": self.target_weights, "draft_weights": self.draft_weights, "packed": self.packed,
                "target_kv": self.target_kv, "draft_kv": self.draft_kv, "graph_pools": self.graph_pools,
                "activations": self.activations, "total": self.total}


@dataclass(frozen=True)
class MemoryModel:
    """Predicted memory of every candidate of one profile run.

    Attributes:
        target: the target's facts.
        drafts: draft name -> facts (n-gram lookup needs none: no weights, no cache).
        context: tokens each sequence's caches hold by default (prompt + new tokens).
        graph_pool_bytes: CUDA-graph pools (0: none captured, or a CPU).
    """

    target: ModelMemory
    drafts: Mapping[str, ModelMemory] = field(default_factory=dict)
    context: int = 512
    graph_pool_bytes: float = 0.0
    prompt_tokens: int | None = None  # the longest prompt prefilled (activations); None: not counted
    graph_slots: bool = False  # our engine's caches are CUDA-graph slots (rounded up: specdec_tune.core.limits)

    def _draft(self, c: Candidate) -> ModelMemory | None:
        if c.is_plain or c.is_ngram or c.is_suffix:
            return None
        if c.drafter not in self.drafts:
            raise InputError(f"no memory facts for draft {c.drafter!r}; known: {', '.join(self.drafts) or 'none'}")
        return self.drafts[c.drafter]

    def breakdown(self, c: Candidate, batch_size: int = 1, context: int | None = None,
                  prompt_tokens: int | None = None) -> MemoryBreakdown:
        """The bytes of ``c`` serving ``batch_size`` sequences of ``context`` tokens (default: the run's);
        ``prompt_tokens`` decides whether plain decoding's prefill packs the target (None: it does)."""
        if batch_size < 1:
            raise InputError(f"batch size must be >= 1, got {batch_size}")
        ctx = self.context if context is None else int(context)
        positions = ctx + 1 if c.is_plain else ctx + c.num_speculative_tokens + 2
        if self.graph_slots:
            positions = slot_length(positions)
        d = self._draft(c)
        target_packs = not c.is_plain or prompt_tokens is None or self.target.packs(prompt_tokens)
        prompt = prompt_tokens if prompt_tokens is not None else self.prompt_tokens
        return MemoryBreakdown(
            target_weights=self.target.weight_bytes, draft_weights=d.weight_bytes if d else 0.0,
            packed=(self.target.packed_bytes if target_packs else 0.0) + (d.packed_bytes if d else 0.0),
            target_kv=batch_size * positions * self.target.kv_bytes_per_token,
            draft_kv=batch_size * positions * d.kv_bytes_per_token if d else 0.0,
            graph_pools=self.graph_pool_bytes, activations=self.target.activations(prompt) if prompt else 0.0)

    def bytes(self, c: Candidate, batch_size: int = 1, context: int | None = None) -> float:
        return self.breakdown(c, batch_size, context).total

    def max_batch_size(self, c: Candidate, budget_bytes: float, context: int | None = None) -> int:
        """The most sequences ``c`` serves within ``budget_bytes`` (0: not even one fits); prefills run one
        sequence at a time, so their activations count once."""
        one = self.breakdown(c, 1, context)
        fixed = one.total - one.target_kv - one.draft_kv
        per_sequence = one.target_kv + one.draft_kv
        if budget_bytes < fixed + per_sequence:
            return 0
        return int((budget_bytes - fixed) // per_sequence)

    def draft_cost_in_batch(self, c: Candidate, budget_bytes: float, context: int | None = None) -> int:
        """Sequences of batch the draft costs at the budget: plain decoding's largest batch minus ``c``'s."""
        return self.max_batch_size(Candidate("none", 0), budget_bytes, context) - self.max_batch_size(
            c, budget_bytes, context)
