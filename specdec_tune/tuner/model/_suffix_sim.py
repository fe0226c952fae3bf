"""Suffix decoding's cycles, simulated exactly on the profiled greedy outputs (private half of
:mod:`tuner.model`; pure Python, no torch).

Greedy decoding emits the target's greedy output whatever the drafter, and suffix decoding's draft is a
function of the context and of the earlier requests' outputs (``specdec_tune.core.suffix``). So the profile's
stored sequences (each profiled prompt's token ids and its greedy output, in the order profiled) give every
cycle of any suffix configuration without running a model: the trees hold at output position j exactly
what the engine's drafter has added by then (the prompt, the output before j, the earlier responses), so
the paths it would match there are computed once (:func:`build_table`, per tree depth, global-tree bound
and policy), and the engine's loop is replayed over them for any N, spec factor and min token probability
(:func:`replay`: each draft cut by ``core.suffix.choose_between``, compared with the output, the accepted
prefix plus the target's token emitted). The draft budget per cycle is the
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
from functools import lru_cache

from specdec_tune.core.schedules import next_num_speculative
from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.core.suffix import SuffixPath, choose_between
from specdec_tune.core.suffix_cache import SuffixCache
from specdec_tune.tuner.model._greedy_sim import SimulatedCycle

POLICIES = ("order", "warm", "cold")
Sequences = Sequence[tuple[Sequence[int], Sequence[int]]]  # (prompt ids, greedy output ids) per prompt
# Per prompt, per output position: the paths of the request's own tree and of the global tree there.
Table = tuple[tuple[tuple[tuple[SuffixPath, ...], tuple[SuffixPath, ...]], ...], ...]


def _request_paths(cache: SuffixCache, prompt: Sequence[int], output: Sequence[int], limit: int) -> tuple:
    """At every output position, the paths the drafter would match there (any N <= ``limit``); the request's
    tokens join the trees one by one, as they do in chunks in the engine (the same counts, the same order)."""
    req = cache.start_request(prompt)
    context, rows = list(prompt), []
    for token in output:
        own, shared = cache.paths(req, context, limit)
        rows.append((tuple(p for p in own if p.tokens), tuple(p for p in shared if p.tokens)))
        cache.add_response(req, [token])
        context.append(token)
    cache.stop_request(req)
    return tuple(rows)


def build_table(sequences: Sequences, depth: int, cached: int, policy: str, limit: int) -> Table:
    """Every prompt's paths at every position under ``policy`` (module docstring): the part of the simulation
    that depends only on the trees, shared by every N <= ``limit``, spec factor and min token probability."""
    if policy not in POLICIES:
        raise ValueError(f"suffix history policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "order":
        cache = SuffixCache(depth, cached)
        return tuple(_request_paths(cache, p, o, limit) for p, o in sequences)
    out = []
    for i, (prompt, output) in enumerate(sequences):
        cache = SuffixCache(depth, cached)
        if policy == "warm":
            for k, (p, o) in enumerate(sequences):
                if k != i:
                    cache.add_finished(p, o)
        out.append(_request_paths(cache, prompt, output, limit))
    return tuple(out)


def replay(table: Table, sequences: Sequences, spec: SpeculativeConfig, max_new_tokens: int) -> list[list[SimulatedCycle]]:
    """Every prompt's cycles under ``spec``: the engine's loop over the table's paths."""
    n, factor, floor = spec.num_speculative_tokens, spec.suffix_max_spec_factor, spec.suffix_min_token_prob
    out = []
    for rows, (_, output) in zip(table, sequences):
        cycles: list[SimulatedCycle] = []
        j, n_cur, out_len = 0, n, len(output)
        while j < out_len:
            most = min(n_cur, max_new_tokens - j)
            draft = choose_between(*rows[j], most, factor, floor).tokens if most > 0 else ()
            acc = 0
            while acc < len(draft) and j + acc < out_len and draft[acc] == output[j + acc]:
                acc += 1
            cycles.append(SimulatedCycle(len(draft), acc, len(draft)))
            j += min(acc + 1, out_len - j)
            n_cur = next_num_speculative(spec.schedule, n_cur, n, len(draft), acc)
        out.append(cycles)
    return out


def table_limit(n: int) -> int:
    """The paths' length a table keeps for N = ``n``: a bucket, so tables serve every N up to it."""
    return next(b for b in (16, 32, 64) if n <= b) if n <= 64 else n


def simulate_suffix(sequences: Sequences, spec: SpeculativeConfig, max_new_tokens: int,
                    policy: str = "order") -> list[list[SimulatedCycle]]:
    """Every profiled prompt's cycles under ``spec`` and ``policy`` (module docstring), in profile order.

    Raises:
        ValueError: an unknown policy, or a configuration that is no chain of suffix decoding.
    """
    if not spec.is_suffix or spec.tree:
        raise ValueError(f"the suffix simulation runs suffix decoding's chains, not {spec.label()}")
    table = _table(tuple((tuple(p), tuple(o)) for p, o in sequences), spec.suffix_max_tree_depth,
                   spec.suffix_max_cached_requests, policy, table_limit(spec.num_speculative_tokens))
    return replay(table, sequences, spec, max_new_tokens)


@lru_cache(maxsize=4)  # a table holds ~10^5 paths; a search visits the tree parameters grid-outer (tuner.search)
def _table(sequences: tuple, depth: int, cached: int, policy: str, limit: int) -> Table:
    return build_table(sequences, depth, cached, policy, limit)
