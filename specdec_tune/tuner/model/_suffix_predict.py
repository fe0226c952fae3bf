"""Suffix decoding's cycles for the predictions (private half of :mod:`tuner.model`): the exact simulation
(:mod:`._suffix_sim`) of a run profile's stored sequences, cached per configuration and policy (a search asks
for the same configuration at many batch sizes and objectives)."""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from specdec_tune.core.errors import InputError
from specdec_tune.core.speculative import SUFFIX, SpeculativeConfig
from specdec_tune.tuner.model._greedy_sim import SimulatedCycle
from specdec_tune.tuner.model._suffix_sim import simulate_suffix


def simulates_suffix(rp, config) -> bool:
    """Greedy suffix decoding (the profile's draft; the configuration may leave its drafter unnamed) with the
    profile's sequences: predicted by exact simulation."""
    return config.mode == "greedy" and rp.draft == SUFFIX and bool(rp.sequences)


def suffix_prompt_cycles(rp, config, i: int, policy: str) -> list[SimulatedCycle]:
    """Profiled prompt ``i``'s cycles under ``config`` with ``policy``'s history (``order`` in sample,
    ``warm`` for the pool a held-out prompt is predicted from).

    Raises:
        InputError: suffix decoding's own trees (engine only, not modelled), or a profile without sequences.
    """
    spec = config.spec if config.spec.is_suffix else replace(config.spec, drafter=SUFFIX)
    if spec.tree:
        raise InputError("suffix decoding's own trees run in the engine (generate --tree suffix); the model "
                         "predicts its chains only")
    if not rp.sequences:
        raise InputError(f"run {rp.run.id} stores no sequences for suffix decoding; profile --draft suffix again")
    return _cycles(rp.sequences, spec, rp.max_new_tokens, policy)[i]


@lru_cache(maxsize=512)
def _cycles(sequences: tuple, spec: SpeculativeConfig, max_new_tokens: int, policy: str) -> tuple:
    return tuple(tuple(c) for c in simulate_suffix(sequences, spec, max_new_tokens, policy))
