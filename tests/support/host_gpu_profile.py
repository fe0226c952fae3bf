"""A profile of the simulated host and GPU (:mod:`tests.support.host_gpu_sim`) through the profiler's real timing code,
and the unhooked truth the model's predictions are checked against (issue 37, F3).

:func:`simulated_profile` runs what ``profile`` runs, each stage with the profiler's own functions: the
micro-benchmarks (``microbench.run_interleaved`` with CUDA events), the hooked decoding passes
(``overhead.ForwardRecorder``: plain, θ = 0 at N_max on every prompt, the small-N passes and the θ > 0 pass on
the first prompts), their rows (``decode_passes.plain_rows``, ``overhead_rows``, ``threshold_cycles``,
``overhead.in_loop_medians``) and the hooks' tax (``hook_tax.hook_tax_rows``); then the model's
``build_run_profile``. :func:`simulated_seconds` is what ``measure`` would time: whole unhooked calls."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from specdec_tune.db import DraftRecord, HardwareRecord, ModelRecord, RunRecord, RunSettings, TimingRow, TraceRow
from specdec_tune.profiler import decode_passes as dp
from specdec_tune.profiler import microbench as mb
from specdec_tune.profiler.hook_tax import HookTaxCall, hook_tax_rows
from specdec_tune.profiler.overhead import ForwardRecorder, in_loop_medians
from specdec_tune.tuner.model import PromptInfo, RunProfile, build_run_profile
from tests.support.host_gpu_sim import Models, Regime, SimCache, World, installed, models, plain_call, spec_call, whole_call

DRAFT = "sim-draft"
N_MAX, OVERHEAD_NS, OVERHEAD_PROMPTS = 16, (1, 4, 8), 4
THETA_PASS = (0.3, 4, 4)  # θ, N, prompts: the profile's θ > 0 pass
NEW_TOKENS = 64


@dataclass
class SimRun:
    regime: Regime
    models: Models
    worlds: list[World]
    prompts: list[int]
    profile: RunProfile
    baseline: RunProfile


def _micro(m: Models, prompts: list[int], typical: int) -> list[TimingRow]:
    """T_v(k), T_s and the prefills, timed by the profiler's interleaved micro-benchmark runner."""
    cases = []

    def case(kind: str, model, k: int, context: int, draft: str | None) -> mb.Case:
        cache = SimCache()
        ids = __import__("torch").zeros(1, k, dtype=__import__("torch").long)
        return mb.Case(kind, k, 1, context, draft, fn=lambda: model(ids, cache=cache),
                       setup=lambda: cache.truncate(context))

    cases += [case("verify", m.target, k, typical, None) for k in range(1, 18)]
    cases += [case("draft_step", m.draft, 1, typical, DRAFT)]
    cases += [case("prefill", m.target, p - 1, 0, None) for p in prompts]
    cases += [case("prefill", m.draft, p, 0, DRAFT) for p in prompts]
    return [r for t in mb.run_interleaved(cases, warmup=1, repeats=3, device="cuda") for r in t.rows()]


def _traces(world: World, i: int) -> tuple[list, list[TraceRow], list]:
    """The N_max pass's cycles, their trace rows and the bonus continuations of fully accepted ones."""
    cycles = world.cycles(N_MAX, 0.0, NEW_TOKENS)
    traces, conts, j = [], [], 0
    for ci, c in enumerate(cycles):
        traces.append(TraceRow(ci, c.confidences, c.accepted, i, c.confidences))
        if c.accepted == c.proposed and ci + 1 < len(cycles):
            conts.append((i, ci, world.conf[j + c.proposed], world.match[j + c.proposed]))
        j += c.accepted + 1
    return cycles, traces, conts


def _passes(m: Models, worlds: list[World], prompts: list[int]):
    """The decoding stage, hooked: rows, traces, continuations, the in-loop timelines and the θ pass's."""
    rows, traces, conts, timelines, theta_timelines = [], [], [], [], []
    recorder = ForwardRecorder("cuda")
    theta, theta_n, theta_prompts = THETA_PASS
    with recorder.attach(m.target, m.draft):
        for i, (w, p) in enumerate(zip(worlds, prompts)):
            recorder.begin()
            plain_call(m, p, NEW_TOKENS)
            rows += dp.plain_rows(recorder.finish(), p)
            cycles, tr, co = _traces(w, i)
            traces += tr
            conts += co
            ns = [N_MAX] + (dp.small_ns(N_MAX, OVERHEAD_NS) if i < OVERHEAD_PROMPTS else [])
            for n in ns:
                recorder.begin()
                spec_call(m, p, w.cycles(n, 0.0, NEW_TOKENS), False, recorder.on_cycle)
                timelines.append(recorder.finish())
                rows += dp.overhead_rows(DRAFT, timelines[-1])
            if i < theta_prompts:
                recorder.begin()
                spec_call(m, p, w.cycles(theta_n, theta, NEW_TOKENS), True, recorder.on_cycle)
                theta_timelines.append(recorder.finish())
    return rows, traces, conts, timelines, theta_timelines


def _tax(m: Models, recorder: ForwardRecorder, worlds: list[World], prompts: list[int]) -> list[TimingRow]:
    """The hooks' tax: each pass design unhooked and hooked on the first prompts, whole calls only."""
    theta, theta_n, theta_prompts = THETA_PASS
    calls = []
    for w, p in list(zip(worlds, prompts))[:2]:
        calls.append(HookTaxCall(None, 0, 0.0, lambda on_cycle, p=p: plain_call(m, p, NEW_TOKENS)))
        for n in [N_MAX, *dp.small_ns(N_MAX, OVERHEAD_NS)]:
            calls.append(HookTaxCall(DRAFT, n, 0.0, lambda on_cycle, p=p, c=w.cycles(n, 0.0, NEW_TOKENS):
                                     spec_call(m, p, c, False, on_cycle)))
        calls.append(HookTaxCall(DRAFT, theta_n, theta, lambda on_cycle, p=p, c=w.cycles(theta_n, theta, NEW_TOKENS):
                                 spec_call(m, p, c, True, on_cycle)))
    return hook_tax_rows(recorder, (m.target, m.draft), calls, "cuda", repeats=1)


def simulated_profile(regime: Regime, prompts: int = 8, seed: int = 0) -> SimRun:
    """Profile the simulated pair in ``regime`` and build the model's profiles of the draft and the baseline."""
    m = models(regime)
    lengths = [90 + (97 * i) % 310 for i in range(prompts)]
    worlds = [World(seed * 1000 + i, NEW_TOKENS) for i in range(prompts)]
    typical = round(sum(lengths) / len(lengths) + NEW_TOKENS / 2)
    with installed(m.sim):
        rows = _micro(m, lengths, typical)
        passes, traces, conts, timelines, theta_timelines = _passes(m, worlds, lengths)
        rows += passes + _tax(m, ForwardRecorder("cuda"), worlds, lengths)
    theta, theta_n, theta_prompts = THETA_PASS
    settings = RunSettings(device="cuda", n_max=N_MAX, overhead_ns=OVERHEAD_NS, overhead_prompts=OVERHEAD_PROMPTS,
                           max_new_tokens=NEW_TOKENS, prompt_tokens=tuple(lengths), typical_context=typical, k_max=17,
                           threshold_pass=theta, threshold_pass_n=theta_n, threshold_prompts=theta_prompts)
    run = RunRecord(1, "completed", dt.datetime(2025, 1, 1), None, ModelRecord(1, "sim-target"),
                    HardwareRecord(1, "cuda", "simulated"), None, (DraftRecord(DRAFT, 2),), settings)
    in_loop = in_loop_medians(timelines) | {"threshold_cycles": dp.threshold_cycles(theta_timelines),
                                            "threshold_first_cycles": dp.first_cycles(theta_timelines)}
    infos = [PromptInfo(p, NEW_TOKENS) for p in lengths]
    rp = build_run_profile(run, DRAFT, rows, traces, prompts=infos, continuations=conts, in_loop=in_loop)
    base = build_run_profile(run, None, rows, [], prompts=infos)
    return SimRun(regime, m, worlds, lengths, rp, base)


def simulated_seconds(run: SimRun, n: int, theta: float) -> float:
    """Whole unhooked calls over every prompt, as ``measure`` times them (N = 0: plain decoding)."""
    m = run.models
    total = 0.0
    with installed(m.sim):
        for w, p in zip(run.worlds, run.prompts):
            if n == 0:
                total += whole_call(m.sim, lambda: plain_call(m, p, NEW_TOKENS))
            else:
                cycles = w.cycles(n, theta, NEW_TOKENS)
                total += whole_call(m.sim, lambda: spec_call(m, p, cycles, theta > 0))
    return total
