"""Suffix decoding's serving history: the per-request trees and the global tree over earlier responses
(arctic-inference 0.1.1's ``SuffixDecodingCache``, ``arctic_inference/suffix_decoding/cache.py``, read there and
written anew); the trees and the speculation rule are ``core/suffix.py``'s. Pure Python, no torch.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from specdec_tune.core.suffix import SuffixDraft, SuffixPath, SuffixTree, choose_between


class SuffixCache:
    """The per-request trees and the global tree of one serving history (arctic's ``SuffixDecodingCache``).

    A request is started with its prompt (its own tree; a slot for its response in the global tree, the
    oldest response evicted past ``max_cached_requests``), given its output tokens as they come, and
    stopped when done (its tree dropped, its response kept in the global tree). :meth:`reset` empties
    everything: a new serving history (a cold global tree).
    """

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000) -> None:
        if max_tree_depth < 1 or max_cached_requests < 0:
            raise ValueError(f"need max_tree_depth >= 1 and max_cached_requests >= 0, got {max_tree_depth}, "
                             f"{max_cached_requests}")
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.reset()

    def reset(self) -> None:
        """Forget every request and cached response."""
        self.global_tree = SuffixTree(self.max_tree_depth)
        self._local: dict[int, SuffixTree] = {}
        self._cached: dict[int, None] = {}  # responses in the global tree, oldest first
        self._next = 0

    @property
    def cached_requests(self) -> int:
        """Responses held by the global tree."""
        return len(self._cached)

    def start_request(self, prompt: Iterable[int]) -> int:
        """A new request over ``prompt``; returns its id."""
        req = self._next
        self._next += 1
        tree = self._local[req] = SuffixTree(self.max_tree_depth)
        tree.extend(0, prompt)
        if self.max_cached_requests > 0:
            self._cached[req] = None
            while len(self._cached) > self.max_cached_requests:
                oldest = next(r for r in self._cached if r != req)
                del self._cached[oldest]
                self.global_tree.remove(oldest)
        return req

    def add_response(self, req: int, tokens: Sequence[int]) -> None:
        """Tokens the request just emitted: into its own tree and, while cached, the global one."""
        self._local[req].extend(0, tokens)
        if req in self._cached:
            self.global_tree.extend(req, tokens)

    def stop_request(self, req: int) -> None:
        """The request is done: its own tree goes, its response stays cached."""
        self._local.pop(req, None)

    def forget(self, req: int) -> None:
        """Evict a request's response from the global tree (arctic's ``evict_cached_response``)."""
        if req in self._cached:
            del self._cached[req]
            self.global_tree.remove(req)

    def last_request(self) -> int | None:
        """The id of the request started last (``None``: none yet)."""
        return self._next - 1 if self._next else None

    def add_finished(self, prompt: Iterable[int], response: Sequence[int]) -> int:
        """A whole earlier request at once (start, its response, stop): a history warmed by past traffic."""
        req = self.start_request(prompt)
        self.add_response(req, response)
        self.stop_request(req)
        return req

    def paths(self, req: int, context: Sequence[int], limit: int,
              max_spec_factor: float | None = None) -> tuple[list[SuffixPath], list[SuffixPath]]:
        """The request's own tree's and the global tree's paths after ``context`` (:meth:`SuffixTree.paths`)."""
        pattern = list(context[-self.max_tree_depth:])
        own = self._local[req].paths(pattern, limit, max_spec_factor)
        return own, self.global_tree.paths(pattern, limit, max_spec_factor) if self.max_cached_requests > 0 else []

    def speculate(self, req: int, context: Sequence[int], max_tokens: int, max_spec_factor: float = 1.0,
                  min_token_prob: float = 0.1, *, tree: bool = False) -> SuffixDraft:
        """The draft after ``context`` (its last ``max_tree_depth`` tokens are matched): the request's own
        tree's, unless the global tree's scores strictly higher."""
        if not tree:
            own, shared = self.paths(req, context, max_tokens, max_spec_factor)
            return choose_between(own, shared, max_tokens, max_spec_factor, min_token_prob)
        pattern = list(context[-self.max_tree_depth:])
        best = self._local[req].speculate(pattern, max_tokens, max_spec_factor, min_token_prob, tree=tree)
        if self.max_cached_requests > 0:
            other = self.global_tree.speculate(pattern, max_tokens, max_spec_factor, min_token_prob, tree=tree)
            if other.score > best.score:
                best = other
        return best


__all__ = ["SuffixCache"]
