"""End-to-end predictions of token trees and staged drafting (docs/model.md, Token trees and staged
drafting), counted as ``measure`` counts them: the same prefills, overheads and renewal-reward sum as
chains (:mod:`._predict`), with the cycles and their cost from here.

A tree cycle costs the first draft forward (the draft's catch-up and the root's children, T_s), one
draft forward per deeper depth over that depth's nodes that have children (T_draft(w), the profile's
draft-width curve scaled like T_s to the in-loop forwards), the target's verify over nodes + 1
positions from the existing T_v(k) curve, and the per-cycle overhead. A staged chain proposes what the
draft alone would (greedy: the same tokens; sampling: the same distribution), so its acceptance is the
chain's; its draft cost is the staged pass's measured rates per proposed token: f_d draft-model
forwards of mean width w, f_i inner forwards of the inner drafter's T_s.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from scipy import stats

from specdec_tune.core.errors import InputError
from specdec_tune.core.trees import TreeSpec
from specdec_tune.tuner.model._greedy_sim import simulate_prompt
from specdec_tune.tuner.model._predict import PromptSpec, RunPrediction, _Cycles, _predict, profiled_specs
from specdec_tune.tuner.model._profile import RunProfile
from specdec_tune.tuner.model._throughput import SpecConfig, draft_step_time, verify_time
from specdec_tune.tuner.model._throughput import predict as model_predict
from specdec_tune.tuner.model._tree import StagedStats, TreeCycle, TreeData, expected_tau, mean_shape, sibling_betas
from specdec_tune.tuner.model._tree import simulate_tree


@dataclass(frozen=True)
class TreePlan:
    """What a candidate drafts besides N: a tree, or a staged drafter (never both).

    Attributes:
        tree: the tree kind (``None``: a chain).
        staged: the staged pass of the chosen inner drafter (``None``: the draft drafts alone).
        inner_step_s: the inner drafter's T_s (its own profile's draft step; n-gram: its lookup).
    """

    tree: TreeSpec | None = None
    staged: StagedStats | None = None
    inner_step_s: float = 0.0


def width_time(rp: RunProfile, data: TreeData, width: float) -> float:
    """T_draft(w), one draft forward over w tree nodes (plus o_f, as T_s carries it): the tree loop's own
    in-loop median at the nearest timed width (the profile's tree overhead pass), moved along the robust
    slope s of the draft-width micro-benchmarks (Theil-Sen over w = 1..W, w = 1 being T_s's own; single
    medians of a loaded machine are too noisy to interpolate between), s scaled like T_s to the loop;
    without in-loop widths, T_s + s·(w - 1)."""
    step = draft_step_time(rp.model, 1)
    raw1 = rp.draft_step_raw_s.get(1)
    if not raw1 or not data.width_raw_s or width <= 1:
        return step * max(width, 1.0)
    slope = _width_slope(raw1, tuple(sorted(data.width_raw_s.items()))) * step / raw1  # calibrated
    if data.width_in_loop_s:  # the tree loop's own depth forwards: nearest timed width, then the slope
        near = min(data.width_in_loop_s, key=lambda w: (abs(w - width), w))
        return data.width_in_loop_s[near] + rp.forward_overhead_s + slope * (width - near)
    return step + slope * (width - 1.0)


@lru_cache(maxsize=64)
def _width_slope(raw1: float, points: tuple[tuple[int, float], ...]) -> float:
    xs = [1.0] + [float(w) for w, _ in points]
    ys = [raw1] + [t for _, t in points]
    slope = stats.theilslopes(ys, xs)[0]
    return max(float(slope), 0.0)


def tree_overhead(rp: RunProfile, data: TreeData, nodes: int, dynamic: bool) -> float:
    """The engine's own time per tree cycle: a Theil-Sen line in the nodes through the profile's timed
    tree cycles (their per-draft-forward overhead o_f taken out, as T_draft carries it), plus the first
    draft forward's excess the chain's o_c holds; the chain's o_c when the profile timed no tree."""
    rows = [r for r in data.overhead if bool(r[0]) == dynamic] or list(data.overhead)
    if len(rows) < 3:
        return rp.cycle_overhead_s
    intercept, slope = _overhead_line(tuple((n, t - f * rp.forward_overhead_s) for _, n, f, t in rows))
    excess = max(rp.cycle_overhead_s - rp.engine_overhead_s, 0.0)
    return max(intercept + slope * nodes, 0.0) + excess


@lru_cache(maxsize=64)
def _overhead_line(points: tuple[tuple[int, float], ...]) -> tuple[float, float]:
    xs = [float(n) for n, _ in points]
    ys = [t for _, t in points]
    if len(set(xs)) < 2:
        return sum(ys) / len(ys), 0.0
    slope, intercept, _, _ = stats.theilslopes(ys, xs)
    return float(intercept), float(slope)


def _tree_cost(rp: RunProfile, data: TreeData, c: TreeCycle, dynamic: bool = False) -> float:
    return (draft_step_time(rp.model, 1) + sum(width_time(rp, data, w) for w in c.widths)
            + verify_time(rp.model, 1, c.nodes + 1) + tree_overhead(rp, data, c.nodes, dynamic))


def _alphas(accepted: Sequence[int], depth: int) -> tuple[float, ...]:
    """Conditional acceptance per depth: P(accepted >= d) / P(accepted >= d - 1)."""
    reach = [sum(a >= d for a in accepted) for d in range(depth + 1)]
    return tuple(reach[d] / reach[d - 1] if reach[d - 1] else math.nan for d in range(1, depth + 1))


def _pooled(rp: RunProfile, specs: Sequence[PromptSpec], simulate: Callable[[int], list],
            cost: Callable[[object], float], size: Callable[[object], float],
            forwards: Callable[[object], float], source: str, depth: int) -> _Cycles:
    """Cycles of profiled prompts simulated one by one; other prompts at the profiled prompts' pooled
    seconds and cycles per token (as :mod:`._predict` pools chains)."""
    exact = [c for s in specs if s.profiled_index is not None for c in simulate(s.profiled_index)]
    decode_s, count, used = sum(cost(c) for c in exact), float(len(exact)), list(exact)
    pooled_tokens = sum(s.new_tokens for s in specs if s.profiled_index is None)
    if pooled_tokens:
        pool = [c for i in range(len(rp.prompts)) for c in simulate(i)]
        if not pool:
            raise InputError(f"run {rp.run.id} has no tree data for draft {rp.draft!r}")
        pool_tokens = sum(p.new_tokens for p in rp.prompts)
        decode_s += pooled_tokens * sum(cost(c) for c in pool) / pool_tokens
        count += pooled_tokens * len(pool) / pool_tokens
        used += pool
        source += f" pooled over {len(rp.prompts)} profiled prompts"
    if not used:
        raise InputError(f"run {rp.run.id} has no tree data for draft {rp.draft!r}")
    n = len(used)
    return _Cycles(decode_s, count, decode_s / count, sum(c.accepted + 1 for c in used) / n,
                   sum(size(c) for c in used) / n, sum(forwards(c) for c in used) / n,
                   _alphas([c.accepted for c in used], depth), source)


def _greedy_tree(rp: RunProfile, data: TreeData, spec: TreeSpec, depth: int, specs: Sequence[PromptSpec]) -> _Cycles:
    a = data.rank_accept

    def simulate(i: int) -> list[TreeCycle]:
        top = data.top[i] if i < len(data.top) else ()
        ranks = data.rollouts[i] if i < len(data.rollouts) else data.ranks[i]  # a head's: per chain step
        return simulate_tree(ranks, top, rp.prompts[i].new_tokens, rp.max_new_tokens, depth, spec, a)

    source = "tree simulation" + (" (dynamic tree: proxy)" if spec.kind == "eagle" else "")
    dynamic = spec.kind == "eagle"
    return _pooled(rp, specs, simulate, lambda c: _tree_cost(rp, data, c, dynamic), lambda c: c.nodes,
                   lambda c: 1 + len(c.widths), source, depth)


def _sampling_tree(rp: RunProfile, data: TreeData, spec: TreeSpec, depth: int, tokens: int) -> _Cycles:
    """E[τ] averaged over the sampled outputs' positions; a fixed shape's cost per cycle."""
    if not data.iid:
        raise InputError("sampling predictions of trees need a profile with --temperature > 0 and --trees")
    shape = mean_shape(spec, depth, data)
    point = spec.kind == "eagle"  # SGLang's deterministic top-k children, verified as point masses
    taus = []
    for i, rows in enumerate(data.point if point else data.iid):
        at = (lambda pos, rows=rows: sibling_betas(rows[pos]) if pos < len(rows) else ()) if point else \
            (lambda pos, rows=rows: rows[pos] if pos < len(rows) else ())
        taus += [expected_tau(shape, at, j) for j in range(len(rows))]
    tau = sum(taus) / len(taus)
    cycle = TreeCycle(shape.size, 0, shape.expanded()[1:])
    seconds = _tree_cost(rp, data, cycle, point)
    cycles = tokens / tau
    return _Cycles(cycles * seconds, cycles, seconds, tau, float(shape.size), float(1 + len(cycle.widths)), (),
                   "tree sampling expectation")


def _staged_cost(rp: RunProfile, data: TreeData, plan: TreePlan, proposed: float) -> float:
    """Draft cost of proposing ``proposed`` tokens with the staged drafter (rates of the staged pass)."""
    st = plan.staged
    assert st is not None
    per_token = st.draft_forwards / max(st.tokens, 1)
    width = st.fed / max(st.draft_forwards, 1)
    inner = st.inner_forwards / max(st.tokens, 1)
    return proposed * (per_token * width_time(rp, data, width) + inner * plan.inner_step_s)


def staged_overhead(rp: RunProfile, plan: TreePlan, proposed: float) -> float:
    """The engine's own time of a staged cycle proposing ``proposed`` tokens: a Theil-Sen line through
    the staged pass's hooked cycles (the inner loop's verdicts and rollbacks included); o_c without them."""
    st = plan.staged
    if st is None or len(st.cycles) < 3:
        return rp.cycle_overhead_s
    intercept, slope = _overhead_line(tuple(st.cycles))
    return max(intercept + slope * proposed, 0.0)


def _staged(rp: RunProfile, data: TreeData, plan: TreePlan, config: SpecConfig, specs: Sequence[PromptSpec],
            tokens: int) -> _Cycles:
    n = config.spec.num_speculative_tokens
    if config.mode == "greedy" and rp.positions is not None:
        def simulate(i: int) -> list:
            return simulate_prompt(rp.positions[i], rp.prompts[i].new_tokens, rp.max_new_tokens, n, 0.0)

        def cost(c) -> float:
            return (_staged_cost(rp, data, plan, c.proposed) + verify_time(rp.model, 1, c.proposed + 1)
                    + staged_overhead(rp, plan, c.proposed))

        return _pooled(rp, specs, simulate, cost, lambda c: c.proposed, lambda c: c.forwards,
                       f"staged simulation ({plan.staged.inner})", n)
    p = model_predict(rp.model, config)
    chain_draft = p.expected_draft_forwards * draft_step_time(rp.model, 1)
    seconds = (p.cycle_time_s - chain_draft - rp.cycle_overhead_s + _staged_cost(rp, data, plan, p.expected_draft_length)
               + staged_overhead(rp, plan, p.expected_draft_length))
    cycles = tokens / p.expected_tokens_per_cycle
    return _Cycles(cycles * seconds, cycles, seconds, p.expected_tokens_per_cycle, p.expected_draft_length,
                   p.expected_draft_forwards, tuple(p.acceptance_per_position), f"staged {p.source}")


def predict_tree_prompts(rp: RunProfile, data: TreeData, config: SpecConfig, plan: TreePlan,
                         prompts: Sequence[PromptSpec] | None = None) -> RunPrediction:
    """Predict a tree or staged configuration end to end (profiled prompts exactly, others pooled).

    Args:
        rp: the draft's run profile.
        data: its tree data (``load_tree_data``).
        config: N (the tree's depth), mode; θ must be 0, the schedule constant, the batch size 1.
        plan: the tree or the staged drafter.
        prompts: the prompts (default: the run's profiled prompts).

    Raises:
        InputError: θ, a schedule, a batch size the tree loop does not run, or missing data.
    """
    if config.spec.threshold > 0 or config.spec.schedule != "constant" or config.batch_size != 1:
        raise InputError("trees and staged drafting run θ = 0, the constant schedule and batch size 1")
    if (plan.tree is None) == (plan.staged is None):
        raise InputError("a tree plan needs a tree or a staged drafter (one of them)")
    specs = list(prompts) if prompts is not None else profiled_specs(rp)
    k_max = max(rp.model.verify_s[1]) if 1 in rp.model.verify_s else 1
    n = config.spec.num_speculative_tokens
    nodes = plan.tree.nodes(n) if plan.tree is not None else n
    if nodes + 1 > k_max:
        raise InputError(f"a tree of {nodes} nodes needs T_v({nodes + 1}); the profile measured k <= {k_max} "
                         f"(profile with a larger --k-max)")

    def cycles(rp_: RunProfile, config_: SpecConfig, specs_: Sequence[PromptSpec], tokens: int) -> _Cycles:
        n = config_.spec.num_speculative_tokens
        if plan.staged is not None:
            return _staged(rp_, data, plan, config_, specs_, tokens)
        if config_.mode == "greedy":
            return _greedy_tree(rp_, data, plan.tree, n, specs_)
        return _sampling_tree(rp_, data, plan.tree, n, tokens)

    return _predict(rp, config, specs, cycles)


def tree_plan(tree: str, staged: str, data: TreeData | None, inner: RunProfile | None = None) -> TreePlan | None:
    """The plan of a candidate's ``tree`` / ``staged`` fields (``None``: an ordinary chain).

    Args:
        tree: the tree spec text (``""``: none).
        staged: the inner drafter's name (``""``: none).
        data: the draft's tree data (``load_tree_data``).
        inner: the inner drafter's run profile (its T_s), for staged drafting.

    Raises:
        InputError: both set, a bad tree, or a profile without the data the plan needs.
    """
    from specdec_tune.core.trees import parse_tree

    if not tree and not staged:
        return None
    if tree and staged:
        raise InputError("a candidate drafts a tree or is staged, not both")
    if data is None:
        raise InputError("trees and staged drafting need a profile recorded with --trees")
    if tree:
        return TreePlan(tree=parse_tree(tree))
    if staged not in data.staged:
        raise InputError(f"the profile has no staged pass with inner drafter {staged!r}; it has: "
                         f"{', '.join(data.staged) or 'none'}")
    step = draft_step_time(inner.model, 1) if inner is not None else 0.0
    return TreePlan(staged=data.staged[staged], inner_step_s=step)
