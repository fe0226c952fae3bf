"""Engine: model loading, drafters, the pure verify step and the decode loops (no timing, no I/O)."""
from __future__ import annotations

from specdec_tune.engine.decode import DecodeConfig, autoregressive, speculative
from specdec_tune.engine.drafters import ModelDrafter, NgramDrafter, build_drafter
from specdec_tune.engine.kvcache import PreallocatedCache, forward_with_cache, make_cache
from specdec_tune.engine.lean import LeanCausalLM, lean_unsupported, wrap_forward
from specdec_tune.engine.loading import LoadedModel, check_compatible, load_model, resolve_source
from specdec_tune.engine.types import CycleStats, Draft, Drafter, GenerationResult, VerifyResult, acceptance_counts
from specdec_tune.engine.types import acceptance_per_position
from specdec_tune.engine.verify import verify_greedy, verify_sampling

__all__ = [
    "CycleStats", "DecodeConfig", "Draft", "Drafter", "GenerationResult", "LeanCausalLM", "LoadedModel", "ModelDrafter",
    "NgramDrafter", "PreallocatedCache", "VerifyResult", "acceptance_counts", "acceptance_per_position",
    "autoregressive", "build_drafter", "check_compatible", "forward_with_cache", "lean_unsupported", "load_model", "make_cache",
    "resolve_source", "speculative", "verify_greedy", "verify_sampling", "wrap_forward",
]  # fmt: skip
