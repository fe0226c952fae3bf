"""Suffix decoding's four options (vLLM's ``suffix_decoding_*`` fields), shared by the commands that run it."""
from __future__ import annotations

from typing import Annotated, Any

import typer

from specdec_tune.core.speculative import SpeculativeConfig

SUFFIX_DEFAULTS = {f: SpeculativeConfig.__dataclass_fields__[f].default for f in (
    "suffix_max_tree_depth", "suffix_max_cached_requests", "suffix_max_spec_factor", "suffix_min_token_prob")}

SuffixDepthOption = Annotated[int, typer.Option(
    "--suffix-max-tree-depth", help="--draft suffix: depth of its suffix trees, bounding match plus draft length "
    "(vLLM's suffix_decoding_max_tree_depth).")]
SuffixCachedOption = Annotated[int, typer.Option(
    "--suffix-max-cached-requests", help="--draft suffix: earlier responses its global tree keeps, oldest evicted "
    "first; 0 disables the global tree (vLLM's suffix_decoding_max_cached_requests).")]
SuffixFactorOption = Annotated[float, typer.Option(
    "--suffix-max-spec-factor", help="--draft suffix: draft at most this factor times the match length "
    "(vLLM's suffix_decoding_max_spec_factor).")]
SuffixMinProbOption = Annotated[float, typer.Option(
    "--suffix-min-token-prob", help="--draft suffix: draft only tokens whose estimated probability (from the "
    "trees' counts) is at least this (vLLM's suffix_decoding_min_token_prob).")]


def suffix_fields(depth: int, cached: int, factor: float, min_prob: float) -> dict[str, Any]:
    """The four options as the configuration's fields (checked when the configuration is built)."""
    return {"suffix_max_tree_depth": depth, "suffix_max_cached_requests": cached,
            "suffix_max_spec_factor": factor, "suffix_min_token_prob": min_prob}
