"""The KV-cache length a CUDA-graph slot holds: one rule, shared by the engine that allocates slots
(``engine/cuda_graphs.py``) and the memory model that predicts them (``tuner/model/_memory.py``).
Pure Python (docs/architecture.md, Rooms: shared modules import no room)."""
from __future__ import annotations

MIN_SLOT_LEN = 256  # a slot's length: the cache's, rounded up to a power of two, at least this


def slot_length(max_len: int) -> int:
    """The buffer length of a slot serving a cache of ``max_len`` positions."""
    return max(MIN_SLOT_LEN, 1 << max(0, int(max_len) - 1).bit_length())
