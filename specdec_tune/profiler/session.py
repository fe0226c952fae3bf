"""A whole profile run: records, micro-benchmarks, baseline, acceptance and overhead, stored as it goes.

Stages (each stores its samples and commits as it goes, so an interrupted run keeps what it
measured): warm-up; T_v(B, k) of the target and T_s of each draft (interleaved rounds); prefill of
each prompt; then the decoding passes, interleaved prompt by prompt: the plain baseline (per-token
overhead, in-loop T_ar, greedy output lengths), per draft the greedy acceptance pass (θ = 0,
N = N_max: traces, per-cycle overhead, in-loop forward times), short overhead passes at small N on
the first prompts (to separate per-cycle from per-forward overhead), a θ > 0 pass on the first prompts
(the cost of a checked draft forward) and with ``temperature > 0`` a sampling pass; then the
teacher-forced agreement and the per-draft summaries; then the hooks' own cost (each pass design unhooked
and hooked, ``profiler.hook_tax``); last, with ``trees``, the token-tree and staged-drafting stage
(:mod:`profiler.tree_profile`). A
``KeyboardInterrupt`` marks the run ``interrupted``, any other error ``failed``; both re-raise.

Every timed forward of the micro-benchmarks and every decode of the decoding stage is a timed region
checked for a CUDA-graph capture or a new KV slot inside (re-run when one happened; :mod:`profiler.clean`);
after the run, finished or not, the run's settings record that check and the CUDA-graph state and counters
of the target and of every draft model (a capture can fail late, and a draft's state counts as much).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import torch

from specdec_tune.db import Database, DraftRecord, TimingRow, add_acceptance, add_measured_run, add_telemetry
from specdec_tune.db import add_timing_samples, create_run, finish_run, get_or_create_hardware
from specdec_tune.db import add_bias_front, add_teacher_forced, get_or_create_model, get_or_create_workload
from specdec_tune.db import TreeTraceRecord, add_tree_traces, update_run_settings
from specdec_tune.engine import DecodeConfig, check_compatible, graph_counters, load_model, resolve_source
from specdec_tune.engine import load_workload
from specdec_tune.core.errors import InputError
from specdec_tune.profiler import acceptance as acc
from specdec_tune.profiler import microbench as mb
from specdec_tune.profiler.clean import TimedRegions
from specdec_tune.profiler.describe import hardware_info, model_info, workload_info
from specdec_tune.profiler.head_profile import is_head, rollout_rows, teacher_view
from specdec_tune.profiler.lossy_front import measured_front, teacher_forced_front
from specdec_tune.profiler.decode_passes import decode_passes, first_cycles, hook_tax, threshold_cycles
from specdec_tune.profiler.overhead import in_loop_medians
from specdec_tune.profiler.runs import NGRAM, SUFFIX, DraftSpec, decode_once, encode_prompt
from specdec_tune.profiler.machine_probe import MachineProbe
from specdec_tune.profiler.settings import ProfileResult, ProfileSettings, Progress, StageLog, run_settings
from specdec_tune.profiler.threads import apply_threads, choose_threads
from specdec_tune.profiler.telemetry import NullMonitor, open_monitor
from specdec_tune.profiler.tree_profile import tree_passes
from specdec_tune.core.splits import check_split_prompts
from specdec_tune.core.testpoints import pause_point

CONTEXT_KS = (1, 2, 5, 9)  # verify widths timed at every profiled context length (and k_max)

# The settings, result and progress types live in profiler.settings; this module keeps their old names.
__all__ = ["ProfileResult", "ProfileSession", "ProfileSettings", "Progress", "StageLog", "run_profile"]


# --------------------------------------------------------------------------- helpers


def _finish(db: Database, run_id: int, status: str) -> None:
    """Mark the run finished without hiding the error that ended it."""
    try:
        finish_run(db, run_id, status)
    except Exception:  # the database itself may be what failed; the original error matters more
        pass


# --------------------------------------------------------------------------- the run


class ProfileSession:
    """One profile run of a target against drafts on a workload (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        target: str,
        drafts: Sequence[str],
        workload: str,
        settings: ProfileSettings = ProfileSettings(),
        progress: Progress | None = None,
    ) -> None:
        if not drafts:
            raise InputError("--draft needs at least one draft (a model, or 'ngram')")
        if len(set(drafts)) != len(drafts):
            raise InputError(f"--draft lists a draft twice: {', '.join(drafts)}")
        self.db = db
        self.target_name = target
        self.draft_names = list(drafts)
        self.workload_name = workload
        self.settings = settings
        self.progress = progress or Progress()
        self.run_id: int | None = None

    # -- set-up
    def _load(self) -> None:
        s = self.settings
        self.target = load_model(self.target_name, s.device, s.dtype, s.forward, s.cuda_graphs)
        self.device = self.target.device
        self.drafts: list[DraftSpec] = []
        for name in self.draft_names:
            if name in (NGRAM, SUFFIX):
                self.drafts.append(DraftSpec(name))  # suffix: its passes' histories in workload order
                continue
            loaded = load_model(name, self.device, s.dtype, s.forward, s.cuda_graphs)
            check_compatible(self.target, loaded)
            self.drafts.append(DraftSpec("model", loaded))
        all_prompts = load_workload(self.workload_name)
        # Profile one split only (default: the tuning half), so measure can validate on the rest.
        self.prompts = check_split_prompts(all_prompts, s.split, self.workload_name)[: s.max_prompts]
        self.all_prompt_count = len(all_prompts)
        # Every workload prompt's length (a length, not a timing): predictions for prompts the profile
        # does not run (the held-out split) need it without loading the tokenizer again.
        self.workload_lengths = [[p.id, int(len(encode_prompt(self.target, p.prompt, p.id)))] for p in all_prompts]
        self.ids = [encode_prompt(self.target, p.prompt, p.id) for p in self.prompts]
        limit = int(getattr(self.target.model.config, "max_position_embeddings", 0) or 0)
        need = max(len(i) for i in self.ids) + s.max_new_tokens + s.n_max + 2
        if limit and need > limit:
            raise InputError(
                f"the longest prompt ({max(len(i) for i in self.ids)} tokens) + --max-new-tokens {s.max_new_tokens} "
                f"+ --n-max {s.n_max} exceeds the target's {limit} positions; lower them"
            )
        mean_prompt = sum(len(i) for i in self.ids) / len(self.ids)
        self.typical_context = int(round(mean_prompt + s.max_new_tokens / 2))
        cap = (limit or 10**9) - s.k_max - 1
        self.context_lens = sorted({min(c, cap) for c in s.context_lens} | {min(self.typical_context, cap)})
        self.source_ids = torch.cat(self.ids)

    def _create(self, monitor) -> int:
        db = self.db
        hw = get_or_create_hardware(db, hardware_info(self.device, monitor))
        target_id = get_or_create_model(db, model_info(self.target))
        drafts = [
            DraftRecord(d.name if d.model is None else d.model.name,
                        get_or_create_model(db, model_info(d.model)) if d.model is not None else None)
            for d in self.drafts
        ]
        wl = get_or_create_workload(db, workload_info(self.workload_name, self.all_prompt_count))
        settings = run_settings(
            self.settings, device=self.device.type, dtype=str(self.target.dtype).replace("torch.", ""),
            forward=self.target.forward, lean_kernels=self.target.kernels, cuda_graphs_used=self.target.cuda_graphs,
            draft_forwards={d.model.name: d.model.forward for d in self.drafts if d.model is not None},
            target=self.target_name, drafts=self.draft_names, workload=self.workload_name,
            prompt_ids=[p.id for p in self.prompts], prompt_tokens=[int(len(i)) for i in self.ids],
            workload_prompt_tokens=self.workload_lengths, typical_context=self.typical_context,
            context_lens=self.context_lens, threads=torch.get_num_threads(), thread_choice=self.thread_choice.to_dict(),
            throughput="end to end: new tokens / wall seconds of whole decode calls, prefill included",
        )
        return create_run(db, target_model_id=target_id, hardware_id=hw, workload_id=wl, drafts=drafts,
                          settings=settings, label=self.settings.label)

    def run(self) -> ProfileResult:
        """Measure everything and store it; return the run id and a summary."""
        self._load()
        first_draft = next((d.model for d in self.drafts if d.model is not None), None)
        self.thread_choice = apply_threads(choose_threads(self.settings.threads, self.target, first_draft))
        self.probe = MachineProbe(self.device)
        self.probe.run()  # warm-up
        monitor = open_monitor(self.device)
        self.regions = TimedRegions(self._models())
        self.run_id = self._create(monitor)
        pause_point("profile-run")  # tests of two processes: both runs are open here at once
        summary: dict = {}
        monitor.start()
        try:
            self._stages()
            summary = self._store_telemetry(monitor)
            self._store_graph_state()
            finish_run(self.db, self.run_id, "completed")
        except KeyboardInterrupt:
            self._store_telemetry(monitor, quiet=True)
            self._store_graph_state(quiet=True)
            _finish(self.db, self.run_id, "interrupted")
            raise
        except BaseException:
            self._store_telemetry(monitor, quiet=True)
            self._store_graph_state(quiet=True)
            _finish(self.db, self.run_id, "failed")
            raise
        return ProfileResult(self.run_id, self.target_name, self.draft_names, asdict(self.settings), summary,
                             self.thread_choice.to_dict())

    def _store_telemetry(self, monitor, quiet: bool = False) -> dict:
        try:
            result = monitor.stop()
            if result.samples:
                add_telemetry(self.db, self.run_id, result.samples)
            out = result.to_json()
            out["monitor"] = "nvml" if not isinstance(monitor, NullMonitor) else f"none ({monitor.reason})"
            return out
        except Exception:
            if not quiet:
                raise
            return {}

    def _models(self) -> dict:
        """The run's models by name (the target's ``target``), as the engine runs them."""
        drafts = {d.model.name: d.model.model for d in self.drafts if d.model is not None}
        return {"target": self.target.model, **drafts}

    def _store_graph_state(self, quiet: bool = False) -> None:
        """After the run: the CUDA-graph state (a capture can fail late) and counters of the target and of
        every draft model, and the timed regions' check, into the run's settings."""
        try:
            counters = {name: c.to_json() for name, m in self._models().items() if (c := graph_counters(m)) is not None}
            update_run_settings(self.db, self.run_id, {
                "cuda_graphs_used": self.target.cuda_graphs, "graph_counters": counters,
                "draft_cuda_graphs": {d.model.name: d.model.cuda_graphs for d in self.drafts if d.model is not None},
                "timed_regions": self.regions.report()})
        except Exception:
            if not quiet:
                raise

    # -- stages
    def _stages(self) -> None:
        trees = (self.tree_passes,) if self.settings.trees else ()
        for stage in (self.warm_up, self.bench_forwards, self.bench_prefill, self.decode_passes, self.hook_tax, *trees):
            stage()
            add_timing_samples(self.db, self.run_id, self.probe_rows(3))

    def probe_rows(self, runs: int = 1) -> list[TimingRow]:
        """The machine probe's seconds now (``profiler.machine_probe``): how fast this machine was while
        the profile measured, so predictions can be rescaled to a machine that runs faster or slower."""
        return [TimingRow("machine_probe", self.probe.steps, 1, 0, self.probe.run()) for _ in range(runs)]

    def _store(self, timings: Sequence[mb.ForwardTiming]) -> None:
        add_timing_samples(self.db, self.run_id, [r for t in timings for r in t.rows()])

    def warm_up(self) -> None:
        """Short decodes with each drafter, untimed: allocation and kernel selection happen here, and on a
        GPU the CUDA graphs of every verify width up to N_max + 1 are captured (the longest prompt: its
        cache's graph slot fits every other prompt's, engine.cuda_graphs)."""
        self.progress.stage("warm-up", len(self.drafts))
        n = self.settings.n_max
        config = DecodeConfig(max_new_tokens=n + 1, num_speculative_tokens=n,
                              synthetic_acceptance=self.settings.synthetic_acceptance)
        longest = max(self.ids, key=len)
        for spec in self.drafts:
            decode_once(self.target, spec, longest, config, seed=0)
            self.progress.advance()

    def bench_forwards(self) -> None:
        """T_v(B, k) of the target and T_s of every draft, timed in interleaved rounds."""
        s = self.settings
        cases = []
        for b in s.batch_sizes:
            shapes = [(self.typical_context, k) for k in range(1, s.k_max + 1)]
            cases += mb.cached_cases(self.target.model, "verify", shapes, batch_size=b, source=self.source_ids,
                                     device=self.device)
        # T_v(k) at the other context lengths, a few k (B = 1): how a longer prompt slows a verify
        # (per-request latency, tuner.model._latency_prediction); kept apart as kind verify_context.
        others = [c for c in self.context_lens if c != self.typical_context]
        ks = sorted({k for k in CONTEXT_KS if k <= s.k_max} | {s.k_max})
        if 1 in s.batch_sizes and others:
            cases += mb.cached_cases(self.target.model, "verify_context", [(c, k) for c in others for k in ks],
                                     source=self.source_ids, device=self.device)
        for spec in (d for d in self.drafts if d.model is not None):
            for b in s.batch_sizes:
                contexts = self.context_lens if b == 1 else [self.typical_context]
                cases += mb.cached_cases(spec.model.model, "draft_step", [(c, 1) for c in contexts], batch_size=b,
                                         source=self.source_ids, draft=spec.model.name, device=self.device)
        self.progress.stage("forwards T_v(k), T_s", s.warmup + s.repeats)
        self._store(mb.run_interleaved(cases, warmup=s.warmup, repeats=s.repeats, device=self.device, seed=s.seed,
                                       advance=self.progress.advance, regions=self.regions))

    def bench_prefill(self) -> None:
        """Prefill of every prompt by the target and each model draft, interleaved rounds."""
        s = self.settings
        cases = mb.prefill_cases(self.target.model, self.ids, drop_last=True)
        for spec in (d for d in self.drafts if d.model is not None):
            cases += mb.prefill_cases(spec.model.model, self.ids, drop_last=False, draft=spec.model.name)
        self.progress.stage("prefill", 1 + s.prefill_repeats)
        self._store(mb.run_interleaved(cases, warmup=1, repeats=s.prefill_repeats, device=self.device, seed=s.seed,
                                       advance=self.progress.advance, regions=self.regions))

    def decode_passes(self) -> None:
        """The plain baseline and every draft's passes, interleaved prompt by prompt (``profiler.decode_passes``),
        then the per-draft summaries."""
        passes = decode_passes(self)
        self._outputs, self._infos, self._base_seconds = passes.outputs, passes.infos, passes.base_seconds
        self._greedy, self._sampled, self._timelines = passes.greedy, passes.sampled, passes.timelines
        self._threshold_timelines = passes.threshold_timelines
        self._store_baseline()
        for spec in self.drafts:
            self._store_acceptance(spec)

    def hook_tax(self) -> None:
        """The hooks' own cost: each decoding-pass design unhooked and hooked (``profiler.hook_tax``)."""
        hook_tax(self)

    def tree_passes(self) -> None:
        """Token-tree and staged-drafting data (``profile --trees``, :mod:`profiler.tree_profile`)."""
        tree_passes(self)

    def _store_baseline(self) -> None:
        """The hooked baseline as a measured run (draft NULL; the profiler stores no prediction); its
        config keeps the greedy output length of every prompt (the simulation's end of sequence)."""
        s = self.settings
        tokens = sum(i["new_tokens"] for i in self._infos)
        add_measured_run(
            self.db, self.run_id, draft=None,
            config={"num_speculative_tokens": 0, "threshold": 0.0, "schedule": "constant", "batch_size": 1,
                    "temperature": 0.0, "max_new_tokens": s.max_new_tokens, "hooked": True, "prompts": self._infos},
            measured_tokens_per_s=tokens / self._base_seconds if self._base_seconds > 0 else 0.0,
            seconds=self._base_seconds, new_tokens=tokens, measured_tau=1.0,
        )

    def _store_acceptance(self, spec: DraftSpec) -> None:
        """Per-position acceptance, teacher-forced agreement, in-loop medians and bonus continuations."""
        s = self.settings
        name = spec.name
        tf = None
        if spec.model is not None:
            tf = acc.teacher_forced(self.target.model, teacher_view(self.target, spec.model), self._outputs,
                                    s.temperature or 1.0)
        traces = self._greedy[name]
        summary = acc.summarize([c for t in traces for c in t.cycles], s.n_max)
        # The in-loop forward times calibrate the micro-benchmarks (tuner.model); the continuations let the
        # greedy simulation follow a roll-out past a fully accepted cycle (a head's roll-outs start at
        # every output position instead: profiler.head_profile).
        continuations = None if spec.model is None or is_head(spec.model) else \
            acc.bonus_continuations(spec.model.model, traces, self.ids)
        if is_head(spec.model):
            rows = rollout_rows(self.target.model, spec.model.model, self._outputs, [len(i) for i in self.ids], s.n_max)
            add_tree_traces(self.db, self.run_id, name, [TreeTraceRecord("rollouts", i, 0.0, d) for i, d in enumerate(rows)])
        teacher = dict(teacher_forced_tokens=tf.tokens if tf else None,
                       greedy_agreement=tf.greedy_agreement if tf else None, one_minus_tv=tf.one_minus_tv if tf else None)
        add_acceptance(self.db, self.run_id, draft=name, mode="greedy", temperature=0.0, num_speculative=s.n_max,
                       cycles=summary.cycles, position_attempts=summary.attempts, position_accepts=summary.accepts,
                       alpha=summary.alpha, beta=summary.beta, confidence_bins=summary.confidence_bins, **teacher,
                       in_loop=self._in_loop(name), continuations=continuations,
                       tv_temperature=tf.temperature if tf else None)
        if s.temperature > 0 and spec.model is not None:
            self._store_front(spec)
        if s.temperature > 0:
            ssum = acc.summarize([c for t in self._sampled[name] for c in t.cycles], s.n_max)
            add_acceptance(self.db, self.run_id, draft=name, mode="sampling", temperature=s.temperature,
                           num_speculative=s.n_max, cycles=ssum.cycles, position_attempts=ssum.attempts,
                           position_accepts=ssum.accepts, alpha=ssum.alpha, beta=ssum.beta,
                           confidence_bins=ssum.confidence_bins, tv_temperature=s.temperature, **teacher)


    def _in_loop(self, name: str) -> dict:
        """The draft's in-loop forward times (``overhead.in_loop_medians``) and its θ > 0 pass's cycles."""
        out = in_loop_medians(self._timelines[name])
        if self._threshold_timelines.get(name):
            out["threshold_cycles"] = threshold_cycles(self._threshold_timelines[name])
            out["threshold_first_cycles"] = first_cycles(self._threshold_timelines[name])
        return out

    def _store_front(self, spec: DraftSpec) -> None:
        """Teacher-forced positions of the sampled generations and the lossy front (``profiler.lossy_front``)."""
        s, name = self.settings, spec.name
        seqs = [torch.cat([ids, torch.tensor(t.result.token_ids, dtype=ids.dtype, device=ids.device)])
                for ids, t in zip(self.ids, self._sampled[name])]
        tf = teacher_forced_front(self.target.model, teacher_view(self.target, spec.model), seqs,
                                  [len(i) for i in self.ids], s.temperature, name)
        add_teacher_forced(self.db, self.run_id, tf.rows)
        front = tf.front
        if s.front_prompts:
            self.progress.stage(f"lossy front: {name}", 1)
            config = DecodeConfig(max_new_tokens=s.max_new_tokens, num_speculative_tokens=s.n_max,
                                  temperature=s.temperature, eos_token_id=self.target.eos_token_id)
            front = front + measured_front(self.target, spec.model, self.ids[:s.front_prompts], config, name, seed=s.seed)
            self.progress.advance()
        add_bias_front(self.db, self.run_id, front)


def check_inputs(target: str, drafts: Sequence[str], workload: str, split: str | None = None) -> int:
    """Fail fast, before any model loads: the workload parses, ``split`` of it has prompts, and every model
    name resolves. Returns the workload's number of prompts.

    Raises:
        InputError: a malformed or missing workload (file and line named), an empty or out-of-range split.
        ModelLoadError: a model name that is neither bundled, a local folder nor a reachable hub id.
    """
    prompts = load_workload(workload)
    if split is not None:
        check_split_prompts(prompts, split, workload)
    for name in (target, *drafts):
        if name not in (NGRAM, SUFFIX, "none"):
            resolve_source(name)
    return len(prompts)


def run_profile(db: Database, target: str, drafts: Sequence[str], workload: str,
                settings: ProfileSettings = ProfileSettings(), progress: Progress | None = None) -> ProfileResult:
    """Profile ``target`` against ``drafts`` on ``workload`` into ``db`` (see :class:`ProfileSession`)."""
    check_inputs(target, drafts, workload, settings.split)
    return ProfileSession(db, target, drafts, workload, settings, progress).run()

