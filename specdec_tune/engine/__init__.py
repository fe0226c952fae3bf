"""Engine: model loading, drafters, the pure verify step and the decode loops, one sequence or a batch (no
timing, no I/O).

Public names only: other rooms import them from here, never from a module behind this face (the
``faces-engine`` import contract). The names load their module on first use (PEP 562), so that a check of a
model name (:func:`resolve_source`), a workload (:func:`load_workload`) or the bundled zoo (:func:`list_models`)
does not import torch and transformers: a command refuses bad input before it pays for them
(``tests/test_architecture.py`` checks it). ``_HOME`` says which module defines each name; the
``TYPE_CHECKING`` imports say the same for type checkers and import-linter (a test keeps the two equal).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specdec_tune.engine.batch_decode import BatchCycle, batch_autoregressive, batch_speculative
    from specdec_tune.engine.batch_drafters import BatchDraft, BatchModelDrafter, BatchNgramDrafter, build_batch_drafter
    from specdec_tune.engine.decode import DecodeConfig, autoregressive, speculative
    from specdec_tune.engine.draft_budget import DraftBudget, LoadBudget, ScheduleBudget, choose_budget
    from specdec_tune.engine.drafters import ModelDrafter, NgramDrafter, build_drafter, probs_from_logits
    from specdec_tune.engine.eagle import EagleHead
    from specdec_tune.engine.eagle_draft import EagleDrafter, EagleTreeDrafter, TeacherForcedHead
    from specdec_tune.engine.eagle_io import head_config, load_head, save_head
    from specdec_tune.engine.eagle_layout import default_aux_layers, is_eagle3_folder
    from specdec_tune.engine.eagle_unroll import unroll
    from specdec_tune.engine.features import FeatureForward, FeatureStore, choose_target_forward, hf_hidden_states
    from specdec_tune.engine.graph_state import GraphCounters, decode_keys, graph_counters, prepare_graphs
    from specdec_tune.engine.kvcache import PreallocatedCache, forward_with_cache, make_cache
    from specdec_tune.engine.lean import LeanCausalLM, lean_unsupported, wrap_forward
    from specdec_tune.engine.lean_kernels import status as lean_kernels_status
    from specdec_tune.engine.loading import LoadedModel, check_compatible, load_model, resolve_device
    from specdec_tune.engine.lossy import bias_and_rejection, emitted_distribution, least_bias, pareto_bias
    from specdec_tune.engine.names import resolve_source
    from specdec_tune.engine.ragged import RaggedCache, check_batchable, forward_ragged, make_ragged_cache
    from specdec_tune.engine.shapes import available_memory, get_shape, memory_needed, parameter_count, shape_names
    from specdec_tune.engine.staged import StagedDrafter
    from specdec_tune.engine.suffix_drafter import SuffixDrafter, cache_for as suffix_cache_for
    from specdec_tune.engine.tree import TokenTree
    from specdec_tune.engine.tree_decode import TreeSamplingVerifier, tree_speculative
    from specdec_tune.engine.tree_draft import TreeDrafter, build_tree_drafter
    from specdec_tune.engine.types import CycleStats, Draft, Drafter, GenerationResult, VerifyResult
    from specdec_tune.engine.types import acceptance_counts, acceptance_per_position
    from specdec_tune.engine.verifiers import GreedyVerifier, SamplingVerifier, Verifier, choose_verifier
    from specdec_tune.engine.verify import verify_greedy, verify_lossy, verify_sampling
    from specdec_tune.engine.workloads import Prompt, load_workload, resolve_workload
    from specdec_tune.engine.zoo import list_models, list_workloads, read_manifest

_HOME = {  # public name -> the module that defines it ("module.attribute": the name there differs)
    "BatchCycle": "batch_decode", "batch_autoregressive": "batch_decode", "batch_speculative": "batch_decode",
    "BatchDraft": "batch_drafters", "BatchModelDrafter": "batch_drafters", "BatchNgramDrafter": "batch_drafters",
    "build_batch_drafter": "batch_drafters",
    "RaggedCache": "ragged", "check_batchable": "ragged", "forward_ragged": "ragged", "make_ragged_cache": "ragged",
    "DecodeConfig": "decode", "autoregressive": "decode", "speculative": "decode",
    "DraftBudget": "draft_budget", "LoadBudget": "draft_budget", "ScheduleBudget": "draft_budget",
    "choose_budget": "draft_budget",
    "ModelDrafter": "drafters", "NgramDrafter": "drafters", "build_drafter": "drafters", "probs_from_logits": "drafters",
    "EagleHead": "eagle", "EagleDrafter": "eagle_draft", "EagleTreeDrafter": "eagle_draft",
    "TeacherForcedHead": "eagle_draft",
    "head_config": "eagle_io", "load_head": "eagle_io", "save_head": "eagle_io",
    "default_aux_layers": "eagle_layout", "is_eagle3_folder": "eagle_layout", "unroll": "eagle_unroll",
    "FeatureForward": "features", "FeatureStore": "features", "choose_target_forward": "features", "hf_hidden_states": "features",
    "GraphCounters": "graph_state", "decode_keys": "graph_state", "graph_counters": "graph_state",
    "prepare_graphs": "graph_state",
    "PreallocatedCache": "kvcache", "forward_with_cache": "kvcache", "make_cache": "kvcache",
    "LeanCausalLM": "lean", "lean_unsupported": "lean", "wrap_forward": "lean",
    "lean_kernels_status": "lean_kernels.status",
    "LoadedModel": "loading", "check_compatible": "loading", "load_model": "loading", "resolve_device": "loading",
    "resolve_source": "names",
    "available_memory": "shapes", "get_shape": "shapes", "memory_needed": "shapes", "parameter_count": "shapes",
    "shape_names": "shapes",
    "bias_and_rejection": "lossy", "emitted_distribution": "lossy", "least_bias": "lossy", "pareto_bias": "lossy",
    "StagedDrafter": "staged", "SuffixDrafter": "suffix_drafter", "suffix_cache_for": "suffix_drafter.cache_for",
    "TokenTree": "tree", "tree_speculative": "tree_decode",
    "TreeSamplingVerifier": "tree_decode", "TreeDrafter": "tree_draft", "build_tree_drafter": "tree_draft",
    "CycleStats": "types", "Draft": "types", "Drafter": "types", "GenerationResult": "types", "VerifyResult": "types",
    "acceptance_counts": "types", "acceptance_per_position": "types",
    "GreedyVerifier": "verifiers", "SamplingVerifier": "verifiers", "Verifier": "verifiers",
    "choose_verifier": "verifiers",
    "verify_greedy": "verify", "verify_lossy": "verify", "verify_sampling": "verify",
    "Prompt": "workloads", "load_workload": "workloads", "resolve_workload": "workloads",
    "list_models": "zoo", "list_workloads": "zoo", "read_manifest": "zoo",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = home.partition(".")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
