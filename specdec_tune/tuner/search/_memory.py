"""The memory of ``tune``'s candidates: a :class:`~specdec_tune.tuner.model.MemoryModel` built from a
profile run's stored models (their configs give layers, KV heads and head size; the run gives the
dtype, device and forward they ran with)."""
from __future__ import annotations

from typing import Any

from specdec_tune.db import Database, get_run, list_models
from specdec_tune.core.errors import InputError
from specdec_tune.core.limits import MAX_GRAPH_TOKENS
from specdec_tune.tuner.model import NGRAM, MemoryModel, ModelMemory

_WIDTH = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
PACK_MAX_BYTES = 1 << 30  # engine/lean.py: a larger model keeps no packed copy
PACKED_WIDTHS = (2, 128)  # engine/lean.py PACKED_MIN_TOKENS, PACKED_MAX_TOKENS: forwards that use (and make) it
GRAPHED_WIDTHS = (1, MAX_GRAPH_TOKENS)  # engine/cuda_graphs.py: every graphed forward uses the concatenated copy


def _config(record: Any) -> Any:
    from transformers import AutoConfig

    source = record.extra.get("source") or record.name
    try:
        return AutoConfig.from_pretrained(source).get_text_config(decoder=True)
    except Exception as exc:  # noqa: BLE001 - any loading failure is one line for the user
        raise InputError(f"cannot read the config of {record.name!r} ({source}) for the memory model: {exc}") from None


def model_memory(record: Any, *, device: str, forward: str, graphs: bool = False) -> ModelMemory:
    """One stored model's memory facts (docs/architecture.md, The throughput model; ``tuner.model._memory``).

    The packed copy: the lean forward on a CPU in float32 packs every layer's q/k/v (one product),
    o, gate/up (one product) and down projections and the LM head once (engine/lean.py,
    ``_packed_weights``), for models up to 1 GiB. A oneDNN blocked weight pads its output features to a
    multiple of 64 (``torch.ops.mkldnn._nbytes``, torch 2.13 on this project's x86-64 CPUs; other ISAs may
    block differently); widths that are multiples of 64, as real models have, pack to exactly their bytes.
    With CUDA graphs (``graphs``: engine/cuda_graphs.py) the copy is each layer's q/k/v and gate/up
    weights concatenated, made at the first graphed forward of any width, for models up to 1 GiB.
    """
    cfg = _config(record)
    width = _WIDTH.get(str(record.dtype), 4)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    layers = int(cfg.num_hidden_layers)
    weights = float((record.num_parameters or 0) * width)
    packed = 0.0
    if device == "cpu" and width == 4 and forward == "lean" and weights <= PACK_MAX_BYTES:
        hidden, inter = int(cfg.hidden_size), int(cfg.intermediate_size)
        q, kv = heads * head_dim, kv_heads * head_dim
        per_layer = _padded(q + 2 * kv) * hidden + _padded(hidden) * q + _padded(2 * inter) * hidden \
            + _padded(hidden) * inter  # qkv, o, gate/up, down: [out, in]
        packed = float(width * (layers * per_layer + _padded(int(cfg.vocab_size)) * hidden))
    widths = PACKED_WIDTHS
    if device == "cuda" and graphs and forward == "lean" and weights <= PACK_MAX_BYTES:
        hidden, inter = int(cfg.hidden_size), int(cfg.intermediate_size)
        packed = float(width * layers * ((heads + 2 * kv_heads) * head_dim + 2 * inter) * hidden)
        widths = GRAPHED_WIDTHS
    activation = float(width * (6 * int(cfg.hidden_size) + 3 * int(cfg.intermediate_size)))
    return ModelMemory(record.name, weights, float(2 * layers * kv_heads * head_dim * width), packed, widths,
                       activation, float(width * heads))


def _padded(rows: int) -> int:
    return -(-rows // 64) * 64


def memory_model(db: Database, run_id: int, max_context: int, graph_pool_bytes: float = 0.0) -> MemoryModel:
    """The memory model of a run's target and model drafts, caches of ``max_context`` tokens.

    Raises:
        InputError: a model's config cannot be read.
    """
    run = get_run(db, run_id)
    models = {m.id: m for m in list_models(db)}
    settings = run.settings
    device = run.hardware.device
    forward = settings.forward
    graphs = settings.cuda_graphs_used == "on"  # recorded by profile since CUDA graphs (engine/cuda_graphs.py)
    drafts = {}
    for d in run.drafts:
        if d.name == NGRAM or d.model_id is None or d.model_id not in models:
            continue
        drafts[d.name] = model_memory(models[d.model_id], device=device, graphs=graphs,
                                      forward=settings.draft_forwards.get(d.name, forward))
    prompt = settings.max_prompt_tokens or None
    return MemoryModel(model_memory(run.target, device=device, forward=forward, graphs=graphs), drafts,
                       int(max_context), float(graph_pool_bytes), prompt, graph_slots=graphs)
