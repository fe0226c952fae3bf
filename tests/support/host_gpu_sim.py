"""A discrete-event simulator of one host thread and one GPU stream, for checking on a CPU that the profiler's
hooks and the throughput model handle a GPU's overlap of host and device (issue 37, F3).

Time is simulated, never read from a clock. The host runs Python: every operation costs it ``host_s``
(launching kernels, bookkeeping). The stream runs the launched GPU work in order: an operation's ``gpu_s``
is split into ``kernels`` kernels launched evenly over its host time (``kernels=1``: one launch at the end,
a CUDA-graph replay), and a kernel starts when it has been launched and the stream is free. A
synchronisation blocks the host until the stream is idle. A :class:`SimEvent` (standing in for
``torch.cuda.Event``) takes the stream's timestamp: the moment the stream reaches it. Hooks are real:
:class:`SimModel` is a ``torch.nn.Module`` whose forward launches its simulated cost, so the profiler's own
``ForwardRecorder`` and micro-benchmark runner time it through their real code, with ``torch.cuda.Event``
and ``torch.cuda.synchronize`` replaced by the simulator's (:func:`installed`).

The decode loops (:func:`plain_call`, :func:`spec_call`) follow the engine's synchronisation pattern
(``engine/decode.py``, ``engine/drafters.py``): plain decoding synchronises once per token (the picked
token read back); a speculative cycle at θ = 0 launches its draft forwards without waiting, then the verify,
then synchronises for the verdict; at θ > 0 every draft forward is followed by the confidence's kernels and
a synchronisation (``float(conf)``). Which tokens a cycle drafts and accepts comes from :class:`World`, a
deterministic greedy world consistent with how the model replays recorded cycles."""
from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from specdec_tune.engine import CycleStats

MS = 1e-3


@dataclass(frozen=True)
class Op:
    """One operation: host seconds to issue it, GPU seconds to run it, in how many kernels."""

    host_s: float
    gpu_s: float = 0.0
    kernels: int = 1


@dataclass
class HostGpu:
    """The clocks: when the host is free (``host``) and when the stream is (``gpu``); ``mark_s`` is the host
    cost of recording an event (a hook's cost), ``sync_s`` the host's wake-up after a synchronisation."""

    mark_s: float = 0.0
    sync_s: float = 0.0
    host: float = 0.0
    gpu: float = 0.0

    def work(self, seconds: float) -> None:
        self.host += seconds

    def launch(self, op: Op) -> None:
        host_step, gpu_step = op.host_s / op.kernels, op.gpu_s / op.kernels
        for _ in range(op.kernels):
            self.host += host_step
            self.gpu = max(self.gpu, self.host) + gpu_step

    def sync(self) -> None:
        self.host = max(self.host, self.gpu) + self.sync_s

    def mark(self) -> float:
        self.host += self.mark_s
        return max(self.gpu, self.host)


_SIM: list[HostGpu] = []  # the simulator the patched torch.cuda names act on (innermost installed)


class SimEvent:
    """``torch.cuda.Event`` on the simulated stream."""

    def __init__(self, enable_timing: bool = False, **_: object) -> None:
        self.t: float | None = None
        SimEvent.made += 1

    made = 0  # events constructed (the recorder should make them before a decode, not during)

    def record(self, stream: object = None) -> None:
        self.t = _SIM[-1].mark()

    def synchronize(self) -> None:
        sim = _SIM[-1]
        sim.host = max(sim.host, self.t) + sim.sync_s

    def elapsed_time(self, end: SimEvent) -> float:
        return (end.t - self.t) * 1e3


@contextlib.contextmanager
def installed(sim: HostGpu) -> Iterator[HostGpu]:
    """``torch.cuda.Event`` and ``torch.cuda.synchronize`` act on ``sim`` inside the block."""
    saved = torch.cuda.Event, torch.cuda.synchronize
    _SIM.append(sim)
    torch.cuda.Event, torch.cuda.synchronize = SimEvent, lambda device=None: sim.sync()
    try:
        yield sim
    finally:
        torch.cuda.Event, torch.cuda.synchronize = saved
        _SIM.pop()


class SimCache:
    """A KV cache that only counts its tokens (what the recorder reads)."""

    def __init__(self) -> None:
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def truncate(self, n: int) -> None:
        self.length = n


class SimModel(torch.nn.Module):
    """A model whose forward of k tokens launches ``cost(k, context)`` on the simulator."""

    def __init__(self, sim: HostGpu, cost: Callable[[int, int], Op]) -> None:
        super().__init__()
        self.sim, self.cost = sim, cost

    def forward(self, input_ids: torch.Tensor, cache: SimCache, logits_to_keep: int = 1) -> None:
        k = int(input_ids.shape[-1])
        self.sim.launch(self.cost(k, cache.length))
        cache.length += k


@dataclass(frozen=True)
class Regime:
    """Host and GPU costs of everything a decode does (seconds). Forwards: a draft step, a verify of k tokens
    (``verify_gpu_s + k · verify_gpu_per_token_s``), a prefill of T tokens; the rest is the loop's own work:
    ``pick``: the small kernels that pick a token (argmax, the verdict's compare), ``theta``: the confidence's
    exp and logsumexp; ``*_host_s``: Python between them."""

    name: str
    draft: Op
    verify_host_s: float
    verify_gpu_s: float
    verify_gpu_per_token_s: float
    verify_kernels: int
    prefill_host_s: float
    prefill_gpu_per_token_s: float
    prefill_kernels: int
    pick: Op
    theta: Op
    draft_host_s: float  # per draft forward, after it (the drafting loop's Python)
    cycle_host_s: float  # per cycle, after the verdict (emit, truncate, observe)
    token_host_s: float  # per plain decoding token, after the pick
    setup_host_s: float  # per decode call
    theta_host_s: float  # per checked draft forward, after its synchronisation
    mark_s: float = 4e-6  # a hook's mark
    sync_s: float = 5e-6

    def verify(self, k: int, context: int) -> Op:
        if context == 0:  # a prefill
            return Op(self.prefill_host_s, self.prefill_gpu_per_token_s * k, self.prefill_kernels)
        return Op(self.verify_host_s, self.verify_gpu_s + self.verify_gpu_per_token_s * k, self.verify_kernels)

    def draft_forward(self, k: int, context: int) -> Op:
        if context == 0:
            return Op(self.prefill_host_s / 4, self.prefill_gpu_per_token_s * k / 8, self.prefill_kernels // 4)
        return self.draft


def _regime(name: str, draft: Op, verify: tuple[float, float, float, int], **kw: float) -> Regime:
    host, gpu, per_token, kernels = verify
    base = dict(prefill_host_s=1.5 * MS, prefill_gpu_per_token_s=0.01 * MS, prefill_kernels=40,
                pick=Op(0.02 * MS, 0.01 * MS), theta=Op(0.03 * MS, 0.015 * MS, 2), draft_host_s=0.03 * MS,
                cycle_host_s=0.25 * MS, token_host_s=0.05 * MS, setup_host_s=0.3 * MS, theta_host_s=0.02 * MS)
    return Regime(name, draft, host, gpu, per_token, kernels, **{**base, **kw})


# host-bound: eager forwards whose launches take longer than their kernels (a small model on a big GPU);
# GPU-bound: graphed forwards of a model whose kernels take far longer than one launch; balanced: both alike.
REGIMES = (
    _regime("host-bound", Op(0.30 * MS, 0.08 * MS, 12), (0.60 * MS, 0.12 * MS, 0.01 * MS, 24)),
    _regime("GPU-bound", Op(0.03 * MS, 0.30 * MS), (0.05 * MS, 2.0 * MS, 0.05 * MS, 1)),
    _regime("balanced", Op(0.12 * MS, 0.12 * MS, 4), (0.35 * MS, 0.30 * MS, 0.02 * MS, 8)),
)


# --------------------------------------------------------------------------- the greedy world


@dataclass(frozen=True)
class SimCycle:
    proposed: int
    accepted: int
    forwards: int
    confidences: tuple[float, ...]


@dataclass
class World:
    """One prompt's greedy world: at output position p the draft's token (on the target's context) has
    confidence ``conf[p]`` and matches the target's iff ``match[p]``; after a mismatch at q the draft goes on
    with confidences ``wrong(q)``. The draft's roll-out from any position is then a suffix of a recorded
    cycle's, the property the model's exact greedy replay rests on."""

    seed: int
    length: int
    conf: list[float] = field(default_factory=list)
    match: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        for _ in range(self.length + 80):
            c = min(0.999, max(0.02, rng.betavariate(2.2, 0.9)))
            self.conf.append(c)
            self.match.append(rng.random() < c)

    def wrong(self, q: int, i: int) -> float:
        return random.Random(self.seed * 7919 + q * 131 + i).betavariate(1.2, 2.0)

    def rollout(self, j: int, n: int) -> tuple[tuple[float, ...], int]:
        """The first ``n`` confidences of the draft's roll-out from position j, and its accepted prefix."""
        confs, accepted, miss = [], 0, None
        for i in range(n):
            if miss is None:
                confs.append(self.conf[j + i])
                if self.match[j + i]:
                    accepted += 1
                else:
                    miss = j + i
            else:
                confs.append(self.wrong(miss, j + i - miss))  # the draft's own branch after the miss
        return tuple(confs), accepted

    def cycles(self, n: int, theta: float, new_tokens: int) -> list[SimCycle]:
        """The engine's cycles (rule "before", per-token θ) over ``new_tokens`` output tokens."""
        out, j = [], 0
        while j < new_tokens:
            budget = min(n, new_tokens - j)
            confs, acc = self.rollout(j, budget)
            length = next((i for i, c in enumerate(confs) if c < theta), budget) if theta > 0 else budget
            cut = length < budget
            accepted = min(length, acc)
            out.append(SimCycle(length, accepted, length + 1 if cut else length, confs[:length]))
            j += accepted + 1
        return out


# --------------------------------------------------------------------------- decode calls


@dataclass
class Models:
    sim: HostGpu
    regime: Regime
    target: SimModel
    draft: SimModel


def models(regime: Regime, sim: HostGpu | None = None) -> Models:
    sim = sim or HostGpu(mark_s=regime.mark_s, sync_s=regime.sync_s)
    return Models(sim, regime, SimModel(sim, regime.verify), SimModel(sim, regime.draft_forward))


def _ids(k: int) -> torch.Tensor:
    return torch.zeros(1, k, dtype=torch.long)


def plain_call(m: Models, prompt: int, new_tokens: int) -> None:
    """Plain greedy decoding: prefill, then per token a pick read back (a synchronisation) and a forward."""
    sim, r = m.sim, m.regime
    sim.work(r.setup_host_s)
    cache = SimCache()
    m.target(_ids(prompt), cache=cache)
    for i in range(new_tokens):
        sim.launch(r.pick)
        sim.sync()
        sim.work(r.token_host_s)
        if i + 1 < new_tokens:
            m.target(_ids(1), cache=cache)


def spec_call(m: Models, prompt: int, cycles: list[SimCycle], checked: bool,
              on_cycle: Callable[[CycleStats], None] | None = None) -> None:
    """Speculative decoding of ``cycles`` (θ checked per draft forward or not), as ``engine.decode`` runs it."""
    sim, r = m.sim, m.regime
    sim.work(r.setup_host_s)
    target, draft = SimCache(), SimCache()
    m.target(_ids(prompt - 1), cache=target)
    length = prompt  # tokens in the context (the last one not yet in the target's cache)
    for c in cycles:
        m.draft(_ids(length - draft.length), cache=draft)  # catch up: the prompt, then 1 or 2 tokens
        for i in range(c.forwards):
            sim.launch(r.pick)
            sim.work(r.draft_host_s)
            if checked:
                sim.launch(r.theta)
                sim.sync()
                sim.work(r.theta_host_s)
            if i == c.proposed:  # θ cut the draft at this position
                break
            if i + 1 < c.forwards:
                m.draft(_ids(1), cache=draft)
        m.target(_ids(c.proposed + 1), cache=target)
        sim.launch(r.pick)
        sim.sync()
        sim.work(r.cycle_host_s)
        target.truncate(length - 1 + c.accepted + 1)
        draft.truncate(min(draft.length, length + c.accepted))
        length += c.accepted + 1
        if on_cycle is not None:
            on_cycle(CycleStats(drafted=c.proposed, accepted=c.accepted, emitted=c.accepted + 1,
                                confidences=c.confidences, outcomes=tuple(i < c.accepted for i in range(c.proposed)),
                                draft_forwards=c.forwards, target_positions=c.proposed + 1))


def whole_call(sim: HostGpu, call: Callable[[], None]) -> float:
    """Seconds of one call timed as ``measure`` times it: synchronise, an event, the call, an event, wait."""
    sim.sync()
    start, end = SimEvent(), SimEvent()
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3
