"""How the bundled mini model family (``engine/zoo``) is made: corpus, tokenizer, distillation recipe,
on-policy refinement, held-out quality and latency assessment, and the model card.

A development tool behind ``specdec-tune zoo train|refine|evaluate``, apart from the engine, which only
loads the finished models. Its clock readings are the training's wall-clock budget and its log; the
model card's forward latencies are timed with the profiler's :class:`~specdec_tune.profiler.Stopwatch`.

The names below are its face, what ``specdec-tune zoo`` uses (the ``faces-training`` import contract).
"""
from __future__ import annotations

from specdec_tune.training.assess import forward_samples
from specdec_tune.training.recipe import reassess, refine, run_recipe, train_eagle

__all__ = ["forward_samples", "reassess", "refine", "run_recipe", "train_eagle"]
