"""Suffix decoding's cycles, simulated exactly on the profiled greedy outputs (private half of
:mod:`tuner.model`; pure Python, no torch).

Greedy decoding emits the target's greedy output whatever the drafter, and suffix decoding's draft is a
function of the context and of the earlier requests' outputs (``specdec_tune.core.suffix``). So the profile's
stored sequences (each profiled prompt's token ids and its greedy output, in the order profiled) give every
cycle of any suffix configuration without running a model: the engine's loop is replayed with the same
cache calls the engine's drafter makes (a request starts on its prompt; before each proposal the tokens
emitted since the last one join its trees; the last ones join at the end), the draft is compared with the
output, and the accepted prefix plus the target's token is emitted. The draft budget per cycle is the
engine's (``min(N, max_new_tokens - emitted)``, the schedule's next N), and the cycle's cost terms are
n-gram lookup's: no draft forward, the per-proposed-token and per-cycle engine overheads the profile fitted
for this drafter (docs/model.md, Suffix decoding).

Which earlier responses a request sees is a policy, the profiler's (``profiler/suffix_history.py``):

- ``order``: the profiled prompts in the order profiled, each seeing every earlier one (how the profile
  ran them; exact for in-sample predictions);
- ``warm``: each profiled prompt seeing every *other* profiled prompt's response (leave one out): what a
  held-out request sees when a measurement warms its history with the profiled prompts' responses, so the
  held-out prediction pools these cycles;
- ``cold``: each prompt seeing no earlier response.
"""
from __future__ import annotations

from collections.abc import Sequence

from specdec_tune.core.schedules import next_num_speculative
from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.core.suffix import SuffixCache
from specdec_tune.tuner.model._greedy_sim import SimulatedCycle

POLICIES = ("order", "warm", "cold")
Sequences = Sequence[tuple[Sequence[int], Sequence[int]]]  # (prompt ids, greedy output ids) per prompt


def request_cycles(cache: SuffixCache, prompt: Sequence[int], output: Sequence[int], spec: SpeculativeConfig,
                   max_new_tokens: int) -> list[SimulatedCycle]:
    """One request's cycles through ``cache`` (the engine's drafter's calls; the request stays cached)."""
    n, out_len = spec.num_speculative_tokens, len(output)
    req = cache.start_request(prompt)
    context, j, n_cur = list(prompt), 0, n
    cycles: list[SimulatedCycle] = []
    while j < out_len:
        most = min(n_cur, max_new_tokens - j)
        draft = cache.speculate(req, context, most, spec.suffix_max_spec_factor, spec.suffix_min_token_prob).tokens \
            if most > 0 else ()
        acc = 0
        while acc < len(draft) and j + acc < out_len and draft[acc] == output[j + acc]:
            acc += 1
        emitted = output[j:j + min(acc + 1, out_len - j)]
        cache.add_response(req, emitted)
        context += emitted
        j += len(emitted)
        cycles.append(SimulatedCycle(len(draft), acc, len(draft)))
        n_cur = next_num_speculative(spec.schedule, n_cur, n, len(draft), acc)
    cache.stop_request(req)
    return cycles


def simulate_suffix(sequences: Sequences, spec: SpeculativeConfig, max_new_tokens: int,
                    policy: str = "order") -> list[list[SimulatedCycle]]:
    """Every profiled prompt's cycles under ``spec`` and ``policy`` (module docstring), in profile order.

    Raises:
        ValueError: an unknown policy, or a configuration that is no chain of suffix decoding.
    """
    if policy not in POLICIES:
        raise ValueError(f"suffix history policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if not spec.is_suffix or spec.tree:
        raise ValueError(f"the suffix simulation runs suffix decoding's chains, not {spec.label()}")
    depth, cached = spec.suffix_max_tree_depth, spec.suffix_max_cached_requests
    if policy == "order":
        cache = SuffixCache(depth, cached)
        return [request_cycles(cache, p, o, spec, max_new_tokens) for p, o in sequences]
    out = []
    for i, (prompt, output) in enumerate(sequences):
        cache = SuffixCache(depth, cached)
        if policy == "warm":
            for k, (p, o) in enumerate(sequences):
                if k != i:
                    cache.add_finished(p, o)
        out.append(request_cycles(cache, prompt, output, spec, max_new_tokens))
    return out
