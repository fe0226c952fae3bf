"""Regression benchmarks on vLLM itself (a suite with ``backend = "vllm"``): the same per-prompt
samples as :mod:`profiler.suite_runs`, measured on the server a team deploys.

Each arm carries the exact ``speculative_config`` vLLM gets (built by the tuner, as its vLLM export
writes it). One engine per distinct (target, speculative config), plus one plain engine per target,
all started first and frozen between their requests (an idle vLLM engine still polls:
``VllmWorker.pause``). Every repeat goes
round every arm (rotated order) and every prompt: the speculative request, then the same prompt on
the plain engine right after (the paired reference: its output is the correctness reference and the
ratio of the two times the prompt's speedup), then the machine probe (:mod:`profiler.machine_probe`)
in this process. Prompts are our tokenizer's token ids, so vLLM decodes what our engine decodes.

From vLLM's per-request record (``per_step_accepted`` / ``per_step_drafted``: one entry per decode
step that had draft tokens) come the cycles, the per-position reached / accepted counts and the
traces. vLLM reports no draft confidences, so each drafted token's confidence is stored as 1.0: the
vLLM backend runs θ = 0, which never reads them. Nor can the draft's time be told apart from the
verify step's from outside the server: ``draft_seconds`` stays empty and an explanation speaks of
the server's step as a whole.
"""
from __future__ import annotations

import json
from typing import Any

from specdec_tune.engine import resolve_device
from specdec_tune.core.errors import InputError
from specdec_tune.profiler.machine_probe import MachineProbe
from specdec_tune.profiler.suite_runs import ArmSpec, PromptSample, ModelCache, arm_prompts, model_source
from specdec_tune.profiler.backends._vllm import VllmWorker, omp_bind_env, require_vllm_python

__all__ = ["measure_arms_vllm", "step_counts"]


def step_counts(accepted: list[int], drafted: list[int], positions: int) -> tuple[list[int], list[int]]:
    """Per-position (reached, accepted) counts from per-step records: a step with d draft tokens of
    which a were accepted reaches positions 1..min(a + 1, d) and accepts positions 1..a."""
    reached, acc = [0] * positions, [0] * positions
    for a, d in zip(accepted, drafted):
        for i in range(min(a + 1, d, positions)):
            reached[i] += 1
        for i in range(min(a, positions)):
            acc[i] += 1
    return reached, acc


def _run(worker, ids: list[int], max_new: int):
    """One timed request on a paused engine, which is paused again afterwards."""
    with worker.awake():
        return worker.generate([ids], max_new).outputs[0]


def measure_arms_vllm(arms: list[ArmSpec], *, vllm_python: str | None = None, threads: int = 1, progress=None,
                      worker=None) -> dict[str, list[PromptSample]]:
    """Measure every arm on vLLM (module docstring); ``{arm key: [PromptSample per prompt]}``.

    Raises:
        InputError: no vLLM environment, an arm without its speculative config, sampling or θ > 0.
        VllmError: vLLM failed to start or to run (the message ends with its last log line).
    """
    _check_arms(arms)
    python = require_vllm_python(vllm_python)
    env = omp_bind_env(threads)
    models = ModelCache()
    plans = []
    for arm in arms:
        target = models.get(arm.target, "cpu", "auto", "auto")  # the tokenizer: vLLM decodes our token ids
        prompts, ids = arm_prompts(arm, target)
        plans.append((arm, [[int(t) for t in x.tolist()] for x in ids],
                      [PromptSample(prompt_id=p.id, new_tokens=0) for p in prompts]))
    keys = {}
    for arm, _ids, _s in plans:
        keys.setdefault(("plain", arm.target), (arm.target, None))
        if not arm.plain:
            keys.setdefault(_engine_key(arm), (arm.target, arm.server_config))
    total = len(keys) + sum(a.repeats * len(ids) for a, ids, _s in plans)
    if progress is not None:
        progress.stage(f"vLLM: {len(keys)} engine(s), {len(arms)} benchmark(s)", total)
    workers: dict[Any, Any] = {}
    try:
        _start_engines(keys, workers, worker or VllmWorker, python, env, plans[0][1][0], progress)
        probe = MachineProbe(resolve_device(arms[0].device))  # the device the server decodes on
        probe.run()
        for r in range(max(a.repeats for a, _i, _s in plans)):
            shift = r % len(plans)
            for arm, ids, samples in plans[shift:] + plans[:shift]:
                if r >= arm.repeats:
                    continue
                plain = workers[("plain", arm.target)]
                spec_w = plain if arm.plain else workers[_engine_key(arm)]
                for x, s in zip(ids, samples):
                    _measure_prompt(arm, spec_w, plain, x, s, r, probe)
                    if progress is not None:
                        progress.advance()
    finally:
        for w in workers.values():
            w.close()
    return {arm.key: samples for arm, _ids, samples in plans}


def _check_arms(arms: list[ArmSpec]) -> None:
    if not arms:
        raise InputError("no benchmark to measure")
    for arm in arms:
        if arm.temperature > 0 or arm.spec.threshold > 0 or arm.spec.schedule != "constant":
            raise InputError(f"benchmark {arm.key!r}: the vllm backend runs greedy decoding with θ = 0 and a constant "
                             "N (vLLM's draft-model and n-gram methods have no confidence threshold)")
        if not arm.plain and arm.server_config is None:
            raise InputError(f"benchmark {arm.key!r}: no speculative config for vLLM")


def _engine_key(arm: ArmSpec) -> tuple[str, str]:
    """The engine a speculative arm runs on: one per distinct (speculative config, target)."""
    return json.dumps(arm.server_config, sort_keys=True), arm.target


def _start_engines(keys: dict, workers: dict, worker_cls, python: str, env: dict, warm_ids: list[int],
                   progress) -> None:
    """Start one engine per key into ``workers`` (so that the caller closes those started), warm each
    up on ``warm_ids`` and freeze it until its turn."""
    for key, (target, spec) in keys.items():
        w = worker_cls(python, env=env)
        workers[key] = w
        w.start(model_source(target), spec, max_num_seqs=1)
        w.generate([warm_ids], 4)  # warm-up, untimed
        w.pause()  # an idle engine still polls: frozen until its turn (VllmWorker.pause)
        if progress is not None:
            progress.advance()


def _measure_prompt(arm: ArmSpec, spec_w, plain, x: list[int], s: PromptSample, repeat: int,
                    probe: MachineProbe) -> None:
    """One repeat of one prompt: the arm's request, the plain engine's right after, then the machine probe.

    The first repeat also keeps the outputs and the per-step counts.
    """
    out = _run(spec_w, x, arm.max_new_tokens)
    s.seconds.append(out.seconds)
    if not arm.plain:
        ref = _run(plain, x, arm.max_new_tokens)
        s.plain_seconds.append(ref.seconds)
        if repeat == 0:
            s.plain_new_tokens, s.plain_token_ids = len(ref.token_ids), list(ref.token_ids)
    s.probe_seconds.append(probe.run())
    if repeat == 0:
        s.new_tokens, s.token_ids = len(out.token_ids), list(out.token_ids)
        acc, drafted = list(out.steps_accepted or []), list(out.steps_drafted or [])
        positions = arm.spec.num_speculative_tokens
        s.cycles, s.drafted = len(acc), sum(drafted)
        s.reached, s.accepted = step_counts(acc, drafted, positions)
        s.traces = [[[1.0] * d, a] for a, d in zip(acc, drafted)]
