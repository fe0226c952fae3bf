"""The passes of one ``measure`` call: warm-up, the timed passes and, with an energy meter, the metered ones.

The protocol (docs/architecture.md, Measurement rules):

1. **Warm-up, untimed.** With CUDA graphs (any model with a graph runner): one full untimed pass, every
   configuration over every measured prompt, so every slot length, graph and first eager prefill of a
   prompt's shape is paid before timing, then every graph a timed decode can replay is made on every
   slot (``engine.prepare_graphs``: verify widths 1..N + 1 of the target, the draft's steps and its
   catch-up). On an eager CPU one short decode per configuration on the longest prompt (allocation,
   kernel selection; at least N + 2 tokens): a CPU has no capture or slot to pay, and each prompt counts
   with its median over the repeats, which a first-call cost in one repeat does not move.
2. **Timed passes.** The configurations take turns prompt by prompt, the order rotated at each prompt and
   repeat, so a slow stretch of a shared machine lands on all of them alike; every decode is a timed
   region checked by :class:`~specdec_tune.profiler.clean.TimedRegions` (re-run when a graph or slot was
   made inside) with the garbage collector off (:func:`~specdec_tune.profiler.clean.quiet_gc`). The machine
   probe runs :data:`PROBES_PER_REPEAT` times a repeat, between turns.
3. **Energy** (a GPU with NVML): :data:`ENERGY_PASSES` further passes per configuration over all prompts,
   the counter read around each whole pass (NVML's counter advances in steps of about 13 J, which a read
   around one short decode would not resolve); their times are not used, so energy never coarsens the
   timed passes' interleaving.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from specdec_tune.engine import decode_keys, graph_counters, prepare_graphs
from specdec_tune.profiler.clean import TimedRegions, quiet_gc
from specdec_tune.profiler.energy import EnergyMeter
from specdec_tune.profiler.machine_probe import MachineProbe
from specdec_tune.profiler.runs import after_request, decode_once, measure_prompt, new_pass, rerunnable, warm_up
from specdec_tune.profiler.settings import Progress
from specdec_tune.profiler.timers import synchronize

PROBES_PER_REPEAT = 4  # machine probes (20-40 ms each) spread over one repeat of the prompt set
ENERGY_PASSES = 2  # metered passes per configuration (two: a spread between passes)


def _models(target, cases: list) -> dict[str, Any]:
    """Every model the cases run, by name (the target's ``target``), for the timed-region check."""
    models = {"target": target.model}
    for case in cases:
        spec = case.spec
        for inner in (spec, spec.inner):
            if inner is not None and inner.model is not None:
                models[inner.model.name] = inner.model.model
    return models


def graphed(models: dict[str, Any]) -> bool:
    """Any model replays CUDA graphs (has a graph runner): the full untimed pass is needed."""
    return any(graph_counters(m) is not None for m in models.values())


def warm_cases(target, cases: list, ids: list[torch.Tensor], full: bool, seed: int, progress: Progress) -> dict:
    """Step 1 of the protocol (the module docstring); returns what it did and what it cost, for the JSON."""
    start = time.perf_counter()
    longest = max(ids, key=len)  # its KV cache is the largest
    for case in cases:
        if full:
            for i in sorted(range(len(ids)), key=lambda j: -len(ids[j])):
                decode_once(target, case.spec, ids[i], case.decode, seed=seed + i)
        else:
            warm_up(target, case.spec, longest, case.decode)
        progress.advance()
    made = 0
    for case in cases:
        n = case.config.spec.num_speculative_tokens
        made += prepare_graphs(target.model, decode_keys(max(n, 0), draft=False))
        for spec in (case.spec, case.spec.inner):
            if spec is not None and spec.model is not None:
                made += prepare_graphs(spec.model.model, decode_keys(n, draft=True))
    kind = "a full untimed pass: every configuration over every prompt" if full else \
        "one short untimed decode per configuration on the longest prompt"
    return {"kind": kind, "seconds": time.perf_counter() - start, "graphs_prepared": made}


def run_cases(target, cases: list, wanted: list[str], ids: list[torch.Tensor], repeats: int, seed: int,
              progress: Progress, meter: EnergyMeter | None = None, full_warm: bool | None = None) -> dict:
    """Warm up, then decode every prompt ``repeats`` times per case, into the cases (the module docstring).

    ``full_warm``: the full untimed pass (None: where a model replays CUDA graphs). Returns the warm-up's
    record; each case's ``regions`` holds its timed regions' check.
    """
    models = _models(target, cases)
    full = graphed(models) if full_warm is None else full_warm
    label = (f"measure {cases[0].draft or 'plain'} N={cases[0].config.spec.num_speculative_tokens} "
             f"θ={cases[0].config.spec.threshold}" if len(cases) == 1 else f"measure {len(cases)} configurations")
    energy = ENERGY_PASSES * len(ids) if meter is not None else 0
    progress.stage(label, len(cases) * (len(ids) * repeats + 1 + energy))
    probe = MachineProbe(target.device)
    probe.run()  # warm-up
    warm = warm_cases(target, cases, ids, full, seed, progress)
    for case in cases:
        case.regions = TimedRegions(models)
    probe_every = max(1, -(-len(ids) // PROBES_PER_REPEAT))
    with quiet_gc():
        for r in range(repeats):
            for case in cases:  # each repeat is a pass of its own: suffix decoding's history starts again
                new_pass(case.spec)
            for i in range(len(ids)):
                shift = (r + i) % len(cases)  # each configuration takes every place in the order in turn
                for case in cases[shift:] + cases[:shift]:
                    _timed(target, case, wanted[i], ids[i], i, r, seed)
                    progress.advance()
                if (i + 1) % probe_every == 0 or i == len(ids) - 1:
                    seconds = probe.run()  # how fast the machine was: every configuration ran in this stretch
                    for case in cases:
                        case.probes.append(seconds)
        if meter is not None:
            _metered_passes(target, cases, ids, seed, meter, progress)
    return warm


def _timed(target, case, prompt_id: str, x: torch.Tensor, i: int, r: int, seed: int) -> None:
    """One timed decode of prompt ``i`` in repeat ``r``, checked (re-run when a graph or slot was made)."""
    decode = rerunnable(case.spec, case.decode, lambda: measure_prompt(target, case.spec, x, case.decode,
                                                                       prompt_id=prompt_id, seed=seed + i))
    m = case.regions.run(decode, f"{case.draft or 'plain'} N={case.config.spec.num_speculative_tokens} {prompt_id} r{r + 1}")
    after_request(case.spec, case.decode)  # suffix decoding's history policy (outside the timed region)
    case.times[i].append(m.seconds)
    case.tokens[i].append(m.new_tokens)
    if m.latency is not None:
        case.arrivals[i].append(m.latency)
    if r == 0 and m.result is not None:
        case.cycles += m.result.cycles


def _metered_passes(target, cases: list, ids: list[torch.Tensor], seed: int, meter: EnergyMeter,
                    progress: Progress) -> None:
    """Step 3: each case's energy over whole passes of its own, the cases rotated between passes."""
    for p in range(ENERGY_PASSES):
        shift = p % len(cases)
        for case in cases[shift:] + cases[:shift]:
            new_pass(case.spec)
            synchronize(target.device)
            joules0, tokens, start = meter.read(), 0, time.perf_counter()
            for i, x in enumerate(ids):
                tokens += len(decode_once(target, case.spec, x, case.decode, seed=seed + i).token_ids)
                after_request(case.spec, case.decode)
            synchronize(target.device)
            case.joule_seconds.append(time.perf_counter() - start)
            case.joules.append(meter.read() - joules0)
            case.joule_tokens.append(float(tokens))
            progress.advance(len(ids))
