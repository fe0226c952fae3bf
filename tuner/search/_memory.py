"""The memory objective of ``tune``: bytes speculation adds to serving (draft weights and KV caches)."""
from __future__ import annotations

from typing import Any

from specdec_tune.db import Database, get_run, list_models
from specdec_tune.tuner.model import Candidate


def memory_model(db: Database, run_id: int, max_context: int) -> Any:
    """Bytes speculation adds for a candidate: draft weights + the draft's KV cache at the longest
    context + the target's KV cache for the N extra verify positions (0 for plain decoding)."""
    run = get_run(db, run_id)
    models = {m.id: m for m in list_models(db)}

    def kv_per_token(record: Any) -> float:
        from transformers import AutoConfig

        width = 2 if record.dtype in ("bfloat16", "float16") else 4
        try:
            cfg = AutoConfig.from_pretrained(record.extra.get("source") or record.name).get_text_config(decoder=True)
        except Exception:  # no config at hand: count layers only, with the target's width unknown
            return 0.0
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2.0 * cfg.num_hidden_layers * heads * head_dim * width

    target_kv = kv_per_token(run.target)
    drafts = {}
    for d in run.drafts:
        if d.model_id is not None and d.model_id in models:
            rec = models[d.model_id]
            width = 2 if rec.dtype in ("bfloat16", "float16") else 4
            drafts[d.name] = ((rec.num_parameters or 0) * width, kv_per_token(rec))

    def memory(c: Candidate) -> float:
        if c.is_plain:
            return 0.0
        n = c.num_speculative_tokens
        weights, kv = drafts.get(c.drafter, (0.0, 0.0))
        return float(weights + kv * (max_context + n) + target_kv * n)

    return memory
