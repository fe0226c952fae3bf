"""The engine's limits, in one place, for every room that checks or predicts against them: the most
tokens a cycle may draft, the ``--cuda-graphs`` modes (the engine, and the profile settings that validate
them before torch loads), the widest graphed forward and the KV-cache length a graph slot holds (the
engine that allocates slots, ``engine/cuda_graphs.py``, and the memory model that predicts them,
``tuner/model/_memory.py`` and ``tuner/search/_memory.py``). Pure Python (docs/architecture.md, Rooms:
the core imports no room)."""
from __future__ import annotations

MAX_SPECULATIVE_TOKENS = 64  # the most tokens one cycle may draft (the engine's and the CLI's limit)

GRAPH_MODES = ("auto", "on", "off")  # --cuda-graphs
MAX_GRAPH_TOKENS = 64  # verify forwards of up to N + 1 = 64 tokens are graphed; longer ones run eagerly
MIN_SLOT_LEN = 256  # a slot's length: the cache's, rounded up to a power of two, at least this


def slot_length(max_len: int) -> int:
    """The buffer length of a slot serving a cache of ``max_len`` positions."""
    return max(MIN_SLOT_LEN, 1 << max(0, int(max_len) - 1).bit_length())
