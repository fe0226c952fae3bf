"""``specdec-tune generate``: decode prompts with the baseline or speculative engine, measured."""
from __future__ import annotations

from dataclasses import replace

from typing import Optional

import typer

from specdec_tune.cli import _checks as opt
from specdec_tune.cli._app import app, console, print_json, quiet_loading, set_threads
from specdec_tune.cli._options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_CUDA_GRAPHS,
    DEFAULT_FORWARD,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DEFAULT_SCHEDULE,
    DEFAULT_SEED,
    DEFAULT_THREADS,
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLD_KIND,
    DEFAULT_THRESHOLD_STEP,
    DeviceOption,
    DtypeOption,
    CudaGraphsOption,
    ForwardOption,
    MaxNewTokensOption,
    NumSpeculativeTokensOption,
    SeedOption,
    SyntheticAcceptanceOption,
    TargetOption,
    ThreadsOption,
    AcceptanceOption,
    EpsilonOption,
    ThresholdKindOption,
    ThresholdStepOption,
)
from specdec_tune.cli._suffix_options import SUFFIX_DEFAULTS as SD
from specdec_tune.cli._suffix_options import SuffixCachedOption, SuffixDepthOption, SuffixFactorOption
from specdec_tune.cli._suffix_options import SuffixMinProbOption, suffix_fields
from specdec_tune.core.errors import InputError
from specdec_tune.core.schedules import THRESHOLD_RULES

NGRAM = "ngram"  # profiler.runs.NGRAM: the prompt-lookup drafter (the engine is imported only once a command runs)
SUFFIX = "suffix"  # profiler.runs.SUFFIX: suffix decoding


@app.command()
def generate(
    target: TargetOption,
    draft: str = typer.Option("none", "--draft", help="Draft model (same tokenizer), 'ngram' for prompt lookup, 'suffix' for suffix decoding (its trees span the prompts of this command, in order), or 'none' for target-only decoding."),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="One prompt text."),
    prompts: Optional[str] = typer.Option(None, "--prompts", "--workload", help="Bundled workload name (functions, docstrings, tables) or a JSONL file: {\"id\", \"prompt\", optional \"category\"} per line."),
    max_new_tokens: MaxNewTokensOption = DEFAULT_MAX_NEW_TOKENS,
    num_speculative_tokens: NumSpeculativeTokensOption = DEFAULT_NUM_SPECULATIVE_TOKENS,
    threshold: float = typer.Option(DEFAULT_THRESHOLD, "--threshold", help="θ: stop drafting before a position whose top draft probability is below θ (0 disables; exact when sampling)."),
    threshold_rule: str = typer.Option("before", "--threshold-rule", help="before (default, exact) | hf (transformers' assistant_confidence_threshold: the token below θ is proposed, then drafting stops)."),
    threshold_kind: ThresholdKindOption = DEFAULT_THRESHOLD_KIND,
    threshold_step: ThresholdStepOption = DEFAULT_THRESHOLD_STEP,
    acceptance: AcceptanceOption = "exact",
    epsilon: EpsilonOption = 0.0,
    schedule: str = typer.Option(DEFAULT_SCHEDULE, "--schedule", help="constant | heuristic (N += 2 after a cycle whose proposed tokens were all accepted, L = 0 included, else N -= 1; capped at N)."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy; > 0 samples (exact speculative sampling)."),
    seed: SeedOption = DEFAULT_SEED,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
    forward: ForwardOption = DEFAULT_FORWARD,
    cuda_graphs: CudaGraphsOption = DEFAULT_CUDA_GRAPHS,
    threads: ThreadsOption = DEFAULT_THREADS,
    synthetic_acceptance: SyntheticAcceptanceOption = None,
    tree: Optional[str] = typer.Option(None, "--tree", help="Draft a token tree of depth N: chains:M, topk:b1-b2 or eagle:K:B (sequoia trees are shaped by a profile: tune --trees); with --draft suffix, 'suffix': its own tree of at most N nodes."),
    staged: Optional[str] = typer.Option(None, "--staged", help="Speculate the draft's own decoding with 'ngram' or a smaller draft model."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object per prompt on stdout."),
    suffix_depth: SuffixDepthOption = SD["suffix_max_tree_depth"],
    suffix_cached: SuffixCachedOption = SD["suffix_max_cached_requests"],
    suffix_factor: SuffixFactorOption = SD["suffix_max_spec_factor"],
    suffix_min_prob: SuffixMinProbOption = SD["suffix_min_token_prob"],
) -> None:
    """Generate text and print measured tokens/s, tokens per cycle τ and per-position acceptance α_i."""
    rates = _check(max_new_tokens, num_speculative_tokens, threshold, threshold_rule, schedule, temperature, threads,
                   synthetic_acceptance)
    opt.check_threshold_kind(threshold_kind, threshold_step, threshold, threshold_rule, schedule)
    opt.check_acceptance(acceptance, epsilon, temperature)
    _check_tree(tree, staged, draft, threshold, schedule, threshold_kind, acceptance)
    suffix = opt.speculative_fields(draft, suffix_fields(suffix_depth, suffix_cached, suffix_factor, suffix_min_prob),
                                    num_speculative_tokens, tree)
    items = _collect_prompts(prompt, prompts)
    opt.check_model_names(target, draft)  # a mistyped name fails now, before torch and the models load
    from specdec_tune.engine import DecodeConfig

    quiet_loading()
    tgt, spec, choice = _models(target, draft, None if draft == SUFFIX else tree, staged, threads, device, dtype,
                                (forward, cuda_graphs))
    config = DecodeConfig(
        max_new_tokens=max_new_tokens, num_speculative_tokens=num_speculative_tokens, threshold=threshold,
        schedule=schedule, temperature=temperature, eos_token_id=tgt.eos_token_id, threshold_rule=threshold_rule,
        threshold_kind=threshold_kind, threshold_step=threshold_step, acceptance=acceptance, epsilon=epsilon,
        synthetic_acceptance=rates, synthetic_seed=seed, **suffix,
    )
    _decode_each(tgt, spec, items, config, seed=seed, json_out=json_out, target=target, choice=choice, rates=rates)


def _models(target: str, draft: str, tree: str | None, staged: str | None, threads: str, device: str, dtype: str,
            how: tuple[str, str]):  # noqa: ANN202 - (an engine LoadedModel, a profiler DraftSpec, a ThreadChoice)
    """The target, the draft (with its tree or inner drafter) and the thread choice; ``how``: (--forward,
    --cuda-graphs), how every model of the command is loaded."""
    tgt = _load(target, device, dtype, how)
    spec = _draft_spec(draft, tgt, device, dtype, how)
    if tree or staged:  # a tree of the draft, or the draft speculated by an inner drafter (profiler.runs)
        spec = replace(spec, tree=tree or "",
                       inner=_draft_spec(staged, tgt, device, dtype, how) if staged else None)
    # The target's choice whatever the draft (none, ngram or a model): plain and speculative runs of one
    # target take the same thread count, so their tokens/s compare.
    return tgt, spec, set_threads(threads, tgt)


def _decode_each(tgt, spec, items: list, config, *, seed: int, json_out: bool, target: str, choice,
                 rates: tuple[float, ...] | None) -> None:
    """Decode every prompt (after one warm-up) and print its text and measured line, or one JSON object each."""
    from specdec_tune.profiler import encode_prompt, measure_prompt, warm_up

    acceptance = f" ({opt.synthetic_label(rates)})" if rates else ""
    encoded = [(p, encode_prompt(tgt, p.prompt, p.id)) for p in items]
    warm_up(tgt, spec, encoded[0][1], config)
    out = console(stderr=json_out)
    for i, (p, ids) in enumerate(encoded):
        run = measure_prompt(tgt, spec, ids, config, prompt_id=p.id, seed=seed + i)
        if json_out:
            print_json({**run.to_json(), "target": target, "draft": spec.name, "category": p.category,
                        "threads": choice.to_dict(), "acceptance_rates": "synthetic" if rates else "measured",
                        "synthetic_acceptance": list(rates) if rates else None})
            continue
        out.print(f"[bold]{p.id}[/bold]", highlight=False)
        out.print(run.text, markup=False, highlight=False)
        line = (f"measured: {run.tokens_per_s:.1f} tokens/s with {choice.threads} thread{'s' * (choice.threads != 1)} "
                f"({run.new_tokens} new tokens in {run.seconds:.3f} s)")
        if run.cycles:
            line += (f", τ = {run.mean_tokens_per_cycle:.2f} tokens/cycle over {run.cycles} cycles, "
                     f"α = {opt.format_alphas(run.acceptance_per_position)}{acceptance}")
        out.print(line, highlight=False)


def _check(max_new_tokens: int, n: int, threshold: float, threshold_rule: str, schedule: str, temperature: float,
           threads: str, synthetic_acceptance: str | None) -> tuple[float, ...] | None:
    """Every flag checked before anything loads; returns the synthetic acceptance rates (None: off)."""
    rates = opt.parse_rates(synthetic_acceptance)
    if rates is not None and temperature > 0:
        raise InputError("--synthetic-acceptance decodes greedily: leave --temperature at 0")
    opt.check_max_new_tokens(max_new_tokens)
    opt.check_num_speculative_tokens(n)
    opt.check_threshold(threshold)
    opt.check_schedule(schedule)
    if threshold_rule not in THRESHOLD_RULES:
        raise InputError(f"--threshold-rule must be one of {', '.join(THRESHOLD_RULES)}, got {threshold_rule!r}")
    opt.check_temperature(temperature)
    opt.parse_threads(threads)
    return rates


def _check_tree(tree: str | None, staged: str | None, draft: str, threshold: float, schedule: str,
                threshold_kind: str = "per-token", acceptance: str = "exact") -> None:
    """``--tree`` / ``--staged`` need a model draft, θ = 0, the constant schedule and exact acceptance (one
    of them at a time)."""
    if not tree and not staged:
        return
    from specdec_tune.core.trees import parse_tree

    if tree and staged:
        raise InputError("give --tree or --staged, not both")
    if draft == SUFFIX and not staged:
        return  # its own tree (--tree suffix): the configuration checks the rest
    if draft in ("none", NGRAM, SUFFIX):
        raise InputError(f"--tree and --staged need a draft model, not --draft {draft}")
    if threshold > 0 or schedule != "constant" or threshold_kind != "per-token":
        raise InputError("--tree and --staged run θ = 0 and the constant schedule (no --threshold-kind)")
    if acceptance != "exact":
        raise InputError(f"--tree and --staged verify exactly; --acceptance {acceptance} is for chains")
    spec = parse_tree(tree) if tree else None
    if tree and spec is None:
        raise InputError(f"--tree {tree!r} is a chain; leave --tree out")
    if spec is not None and spec.kind == "sequoia":
        raise InputError("sequoia trees are shaped from a profile's acceptance: use tune --trees, or chains/topk/eagle")
    if staged and staged != NGRAM:
        opt.check_model_names(staged)


def _collect_prompts(prompt: str | None, prompts: str | None) -> list:
    from specdec_tune.engine import Prompt, load_workload

    if (prompt is None) == (prompts is None):
        raise InputError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    if prompt is not None:
        if not prompt.strip():
            raise InputError("--prompt is empty")
        return [Prompt(id="prompt", prompt=prompt, category=None)]
    return load_workload(prompts)


def _load(name: str, device: str, dtype: str, forward: tuple[str, str]):  # noqa: ANN202 - an engine LoadedModel
    """``forward``: (--forward, --cuda-graphs)."""
    from specdec_tune.engine import load_model

    return load_model(name, device, dtype, *forward)


def _draft_spec(draft: str, target, device: str, dtype: str, forward: tuple[str, str]):  # noqa: ANN202 - a profiler DraftSpec
    from specdec_tune.engine import check_compatible
    from specdec_tune.profiler import DraftSpec

    if draft == "none":
        return DraftSpec("none")
    if draft in (NGRAM, SUFFIX):
        return DraftSpec(draft)
    loaded = _load(draft, device, dtype, forward)
    check_compatible(target, loaded)
    return DraftSpec("model", loaded)
