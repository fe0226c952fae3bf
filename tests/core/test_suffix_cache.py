"""Suffix decoding's serving history (core/suffix_cache.py): the global tree over earlier responses, its FIFO
bound, and 0 turning it off."""
from __future__ import annotations

from specdec_tune.core.suffix_cache import SuffixCache


def test_global_tree_serves_later_requests_and_evicts_the_oldest():
    cache = SuffixCache(8, max_cached_requests=2)  # a starting request takes a slot at once
    first = cache.start_request([9])
    cache.add_response(first, [4, 5, 6, 7])
    cache.stop_request(first)
    second = cache.start_request([8, 4, 5])
    assert cache.speculate(second, [8, 4, 5], 4, 1.0, 0.1).tokens == (6, 7)  # from the first response
    cache.stop_request(second)
    third = cache.start_request([4, 5])  # three responses for two slots: the first (oldest) goes
    assert cache.speculate(third, [4, 5], 4, 1.0, 0.1).tokens == ()
    assert cache.cached_requests == 2
    off = SuffixCache(8, max_cached_requests=0)  # 0: no global tree, the request's own tree only
    r = off.start_request([9])
    off.add_response(r, [4, 5, 6, 7])
    off.stop_request(r)
    assert off.speculate(off.start_request([4, 5]), [4, 5], 4, 1.0, 0.1).tokens == ()
