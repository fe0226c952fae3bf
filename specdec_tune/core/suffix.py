"""Suffix decoding's trees and speculation rule, defined once (the engine drafts with it, the model
simulates it); pure Python, no torch.

SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975, "SuffixDecoding: Extreme Speculative Decoding for
Emerging AI Applications") drafts from suffix trees over earlier token sequences: a per-request tree over
the request's prompt and its output so far, and a global tree over the outputs of earlier requests. The
rules here are those of the implementation vLLM runs for ``method: "suffix"`` (``vllm/v1/spec_decode/
suffix_decoding.py`` calls Snowflake's arctic-inference 0.1.1, ``arctic_inference/suffix_decoding/cache.py``
and ``csrc/suffix_decoding/suffix_tree.cc``), read there and written anew:

- **Counts.** A tree of depth D holds every substring of length <= D of its sequences; a node's count is
  how many times its substring occurs (an occurrence that ends a sequence included). The estimated
  probability of a continuation is the product of count(child) / count(parent) along its path: the
  paper's D(N), "the estimated empirical probability of the token at node N".
- **Speculation length follows the match** (the paper's MAX_SPEC = α·p): for every match length p =
  1, 2, .. (the last p tokens of the context, found in the tree; the context is cut to its last D tokens
  and p stays below its length), at most min(N, floor(p·α + offset)) tokens are drafted, α being vLLM's
  ``suffix_decoding_max_spec_factor``.
- **Path.** From the matched node, repeatedly the child of the highest count (ties: the order
  arctic's sibling lists keep, :class:`_Node`), while the path's probability stays >= ``min_token_prob``.
  **Tree** (arctic's ``use_tree_spec``, not exposed by vLLM): best-first by probability, every child whose
  probability is >= ``min_token_prob``, up to the same number of nodes.
- **Score** (the paper's SCORE(T) = Σ_N D(N)): the sum of the drafted tokens' probabilities. Of all match
  lengths the highest score wins (ties: the longer match); of the two trees the global one wins only with
  a strictly higher score.
- **Global tree bound**: ``max_cached_requests`` responses, the oldest evicted first (first in, first out:
  arctic's ``_maybe_evict_requests`` and vLLM's field docstring say FIFO, not LRU); 0 disables the global
  tree. A request's own response joins the global tree while it is generated, as in arctic.

Probabilities and scores are rounded to float32 where arctic computes in float (``_f32``), so ties and
the ``min_token_prob`` cut fall where arctic's do.
"""
from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_F32 = struct.Struct("f")


def _f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (arctic's ``float`` arithmetic)."""
    return _F32.unpack(_F32.pack(x))[0]


@dataclass(frozen=True)
class SuffixDraft:
    """One speculation: ``tokens`` with their ``parents`` (index into ``tokens``; -1: the context's last
    token), each token's estimated probability, their sum (the score) and the match length it came from."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    score: float = 0.0
    match_len: int = 0


class _Node:
    """A trie node: its count, its children by token and in arctic's sibling order.

    Sibling order (arctic's ``head_child`` list, kept sorted by count, highest first): a new child joins at
    the end; a child whose count rises from c to c + 1 goes first among the children of count c + 1 if no
    sibling before it had count c, else last among them; a child whose count falls goes first among the
    children of its new count (``_increment_count``, ``_decrement_count``, ``_insert_into_siblings_*``).
    """

    __slots__ = ("token", "count", "children", "order", "pos")

    def __init__(self, token: int = -1) -> None:
        self.token = token
        self.count = 0
        self.children: dict[int, _Node] = {}
        self.order: list[_Node] = []
        self.pos = 0  # index in the parent's order

    def child(self, token: int) -> _Node:
        """A new child for ``token`` (count 0, last in the order)."""
        node = self.children[token] = _Node(token)
        node.pos = len(self.order)
        self.order.append(node)
        return node

    def bump(self, node: _Node) -> None:
        """Add one to a child's count and move it to its place in the order."""
        order, i, c = self.order, node.pos, node.count
        head = i == 0 or order[i - 1].count > c
        limit = c + 1 if head else c
        j = i
        while j > 0 and order[j - 1].count <= limit:
            j -= 1
        node.count = c + 1
        if j != i:
            order[j + 1:i + 1] = order[j:i]
            order[j] = node
            for k in range(j, i + 1):
                order[k].pos = k

    def drop(self, token: int) -> None:
        """Take one from a child's count; a child whose count reaches 0 leaves with its subtree."""
        node = self.children[token]
        order, i, c = self.order, node.pos, node.count
        if c == 1:
            del self.children[token]
            del order[i]
            for k in range(i, len(order)):
                order[k].pos = k
            return
        j = i
        while j + 1 < len(order) and order[j + 1].count >= c:
            j += 1
        node.count = c - 1
        if j != i:
            order[i:j] = order[i + 1:j + 1]
            order[j] = node
            for k in range(i, j + 1):
                order[k].pos = k


class SuffixTree:
    """Counts of every substring of length <= ``max_depth`` of a set of token sequences."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"a suffix tree needs max_depth >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node()
        self._seqs: dict[int, list[int]] = {}
        self._active: dict[int, list[_Node]] = {}  # seq -> the nodes of its last tokens' suffixes, longest first

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (created if new): every substring ending at each new token
        (of length <= max_depth) has its count raised by one."""
        seq = self._seqs.setdefault(seq_id, [])
        nodes = self._active.get(seq_id, [])
        root, depth = self.root, self.max_depth
        for token in tokens:
            token = int(token)
            seq.append(token)
            root.count += 1
            if len(nodes) == depth:  # the longest open suffix cannot grow past the depth
                nodes = nodes[1:]
            nodes.append(root)  # the empty suffix, about to grow by this token
            grown = []
            for node in nodes:
                child = node.children.get(token)
                if child is None:  # a new child: count 1, last of the order
                    child = node.child(token)
                    child.count = 1
                elif child.pos == 0 or node.order[child.pos - 1].count > child.count + 1:  # its place holds
                    child.count += 1
                else:
                    node.bump(child)
                grown.append(child)
            nodes = grown
        self._active[seq_id] = nodes

    def open_suffixes(self, seq_id: int) -> list[_Node]:
        """The nodes of sequence ``seq_id``'s last 1, 2, .. ``max_depth`` tokens (shortest first): its own
        matches, without walking the tree."""
        return self._active.get(seq_id, [])[::-1]

    def remove(self, seq_id: int) -> None:
        """Forget sequence ``seq_id``: every count it raised is lowered again."""
        seq = self._seqs.pop(seq_id, None)
        self._active.pop(seq_id, None)
        if seq is None:
            return
        for start in range(len(seq)):
            node = self.root
            node.count -= 1
            for token in seq[start:start + self.max_depth]:
                child = node.children[token]
                node.drop(token)
                if token not in node.children:  # it held this sequence only: gone with its subtree
                    break
                node = child

    def _match(self, pattern: Sequence[int]) -> _Node | None:
        node = self.root
        for token in pattern:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def speculate(self, pattern: Sequence[int], max_tokens: int, max_spec_factor: float = 1.0,
                  min_token_prob: float = 0.1, *, offset: float = 0.0, tree: bool = False) -> SuffixDraft:
        """The best draft after ``pattern`` (the context's last tokens) over every match length (module
        docstring); an empty draft when nothing matches."""
        factor, shift, floor = _f32(max_spec_factor), _f32(offset), _f32(min_token_prob)
        best = SuffixDraft()
        for m in range(1, len(pattern)):
            node = self._match(pattern[len(pattern) - m:])
            if node is None:
                break
            cap = max(0, min(max_tokens, int(_f32(_f32(m * factor) + shift) + 1e-6)))
            draft = (_tree if tree else _path)(node, cap, floor)
            if draft.score >= best.score:
                best = SuffixDraft(draft.tokens, draft.parents, draft.probs, draft.score, m)
        return best


def _path(node: _Node, cap: int, floor: float) -> SuffixDraft:
    """The chain of highest-count children from ``node`` while its probability is >= ``floor``."""
    tokens: list[int] = []
    probs: list[float] = []
    prob, score = 1.0, 0.0
    while len(tokens) < cap and node.order:
        child = node.order[0]
        if child.count != node.count:  # a ratio of 1 leaves the probability as it is
            prob = _f32(prob * _f32(child.count / node.count))
            if prob < floor:
                break
        tokens.append(child.token)
        probs.append(prob)
        score = _f32(score + prob)
        node = child
    return SuffixDraft(tuple(tokens), tuple(range(-1, len(tokens) - 1)), tuple(probs), score)


class _Item:
    """A heap entry ordered by probability only (the heap is arctic's max-heap on ``prob``)."""

    __slots__ = ("prob", "node", "token", "parent")

    def __init__(self, prob: float, node: _Node, token: int, parent: int) -> None:
        self.prob, self.node, self.token, self.parent = prob, node, token, parent

    def __lt__(self, other: _Item) -> bool:
        return self.prob > other.prob


def _tree(node: _Node, cap: int, floor: float) -> SuffixDraft:
    """Best-first by probability: every child of probability >= ``floor``, at most ``cap`` nodes."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    score = 0.0
    heap: list[_Item] = []
    _push_children(heap, node, 1.0, -1, floor)
    while heap and len(tokens) < cap:
        item = heapq.heappop(heap)
        tokens.append(item.token)
        parents.append(item.parent)
        probs.append(item.prob)
        score = _f32(score + item.prob)
        _push_children(heap, item.node, item.prob, len(tokens) - 1, floor)
    return SuffixDraft(tuple(tokens), tuple(parents), tuple(probs), score)


def _push_children(heap: list[_Item], node: _Node, prob: float, parent: int, floor: float) -> None:
    for child in node.order:
        p = _f32(prob * _f32(child.count / node.count))
        if p < floor:
            break
        heapq.heappush(heap, _Item(p, child, child.token, parent))


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

    def speculate(self, req: int, context: Sequence[int], max_tokens: int, max_spec_factor: float = 1.0,
                  min_token_prob: float = 0.1, *, tree: bool = False) -> SuffixDraft:
        """The draft after ``context`` (its last ``max_tree_depth`` tokens are matched): the request's own
        tree's, unless the global tree's scores strictly higher."""
        pattern = list(context[-self.max_tree_depth:])
        best = self._local[req].speculate(pattern, max_tokens, max_spec_factor, min_token_prob, tree=tree)
        if self.max_cached_requests > 0:
            other = self.global_tree.speculate(pattern, max_tokens, max_spec_factor, min_token_prob, tree=tree)
            if other.score > best.score:
                best = other
        return best


__all__ = ["SuffixCache", "SuffixDraft", "SuffixTree"]
