"""Run by path with the vLLM venv's Python (where arctic-inference is installed): our suffix decoding
(``specdec_tune/core/suffix.py`` and ``suffix_cache.py``: pure Python, imported from the checkout given as the
first argument) against arctic-inference's own on the same random token streams. Prints one JSON line of
counts; ``tests/core/test_suffix_arctic.py`` reads it.

Trees: random sequences over small alphabets (ties everywhere), sequences removed again, random patterns,
both speculation modes. Caches: request streams (prompts, responses arriving a few tokens at a time) through
arctic's ``SuffixDecodingCache`` and our ``SuffixCache``, with the global tree off, small (FIFO eviction) and
large.
"""
from __future__ import annotations

import json
import random
import sys


sys.path.insert(0, sys.argv[1])  # the checkout: its specdec_tune.core imports nothing but the standard library
from specdec_tune.core import suffix as ours  # noqa: E402
from specdec_tune.core.suffix_cache import SuffixCache  # noqa: E402

from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: E402
from arctic_inference.suffix_decoding._C import SuffixTree  # noqa: E402


def same(a, o) -> bool:
    return (list(a.token_ids), list(a.parents), list(a.probs), a.score) == \
        (list(o.tokens), list(o.parents), list(o.probs), o.score) and (not a.token_ids or a.match_len == o.match_len)


def trees(rng: random.Random, counts: dict) -> None:
    depth = rng.choice([2, 3, 5, 8, 24])
    a, o, alive = SuffixTree(depth), ours.SuffixTree(depth), []
    for step in range(rng.randint(1, 12)):
        if alive and rng.random() < 0.25:
            sid = alive.pop(rng.randrange(len(alive)))
            a.remove(sid)
            o.remove(sid)
            continue
        sid = rng.choice(alive) if alive and rng.random() < 0.5 else 1000 + step
        if sid not in alive:
            alive.append(sid)
        alphabet = rng.randint(2, 6)
        tokens = [rng.randrange(alphabet) for _ in range(rng.randint(1, 40))]
        a.extend(sid, tokens)
        o.extend(sid, tokens)
        for _ in range(3):
            pattern = [rng.randrange(alphabet) for _ in range(rng.randint(1, depth + 2))]
            n, f, p = rng.randint(1, 12), rng.choice([0.5, 1.0, 2.0, 3.0]), rng.choice([0.0, 0.1, 0.3])
            for mode in ("path", "tree"):
                counts[mode + "_total"] += 1
                counts[mode + "_same"] += same(a.speculate(pattern, n, f, 0.0, p, mode == "tree"),
                                               o.speculate(pattern, n, f, p, tree=mode == "tree"))


def caches(rng: random.Random, counts: dict) -> None:
    depth, cached = rng.choice([4, 8, 24]), rng.choice([0, 1, 2, 5, 100])
    a, o = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=cached), SuffixCache(depth, cached)
    alphabet = rng.randint(2, 8)
    for r in range(rng.randint(1, 8)):
        prompt = [rng.randrange(alphabet) for _ in range(rng.randint(1, 30))]
        a.start_request(r, prompt)
        req = o.start_request(prompt)
        context = list(prompt)
        for _ in range(rng.randint(1, 10)):
            new = [rng.randrange(alphabet) for _ in range(rng.randint(1, 4))]
            a.add_active_response(r, new)
            o.add_response(req, new)
            context += new
            n, f, p = rng.randint(1, 10), rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 0.1, 0.3])
            counts["cache_total"] += 1
            counts["cache_same"] += same(a.speculate(r, context[-depth:], max_spec_tokens=n, max_spec_factor=f,
                                                     min_token_prob=p), o.speculate(req, context, n, f, p))
        a.stop_request(r)
        o.stop_request(req)
        counts["cached_same"] += len(a.cached_requests) == o.cached_requests


def main() -> None:
    rng = random.Random(int(sys.argv[2]))
    counts = dict.fromkeys(("path_total", "path_same", "tree_total", "tree_same", "cache_total", "cache_same",
                            "cached_same"), 0)
    for _ in range(int(sys.argv[3])):
        trees(rng, counts)
        caches(rng, counts)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
