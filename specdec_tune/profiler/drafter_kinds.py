"""What kind of drafter a name is: plain decoding, prompt lookup, an EAGLE-3 head or a draft model.

The speculative configuration names its drafter (``SpeculativeConfig.drafter``); a head is named as a
model is (a bundled name or a folder) and told apart by its ``config.json`` (``engine.eagle_layout``):
a JSON read, no model loaded. The tuner asks here (its capability table and exports differ by kind).
"""
from __future__ import annotations

from functools import lru_cache

from specdec_tune.core.errors import SpecdecError
from specdec_tune.core.speculative import NGRAM, NONE
from specdec_tune.engine import is_eagle3_folder, resolve_source

EAGLE3 = "eagle3"


@lru_cache(maxsize=256)
def drafter_kind(name: str | None) -> str:
    """``none``, ``ngram``, ``eagle3`` (an EAGLE-3 head's folder) or ``model`` (anything else, hub ids and
    names that do not resolve here included)."""
    if not name or name == NONE:
        return "none"
    if name == NGRAM:
        return "ngram"
    try:
        source = resolve_source(name)
    except SpecdecError:
        return "model"
    return EAGLE3 if is_eagle3_folder(source) else "model"
