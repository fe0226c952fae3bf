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
- **Global tree bound** (``core/suffix_cache.py``): ``max_cached_requests`` responses, the oldest evicted
  first (first in, first out: arctic's ``_maybe_evict_requests`` and vLLM's field docstring say FIFO, not
  LRU); 0 disables the global tree. A request's own response joins the global tree while it is generated.

Probabilities and scores are rounded to float32 where arctic computes in float (``_f32``), so ties and
the ``min_token_prob`` cut fall where arctic's do.
"""
from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable, Iterator, Sequence
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


@dataclass(frozen=True)
class SuffixPath:
    """The highest-count chain after one match: its tokens, their probabilities (non-increasing: each is the
    last times a count ratio <= 1) and the running sums of those (float32, as arctic adds them)."""

    match_len: int
    tokens: tuple[int, ...]
    probs: tuple[float, ...]
    scores: tuple[float, ...]


def _cap(m: int, max_tokens: int, max_spec_factor: float, offset: float = 0.0) -> int:
    """The most tokens a match of length ``m`` may draft: min(N, floor(m·α + offset)) (arctic's arithmetic)."""
    return max(0, min(max_tokens, int(_f32(_f32(m * _f32(max_spec_factor)) + _f32(offset)) + 1e-6)))


def choose(paths: Sequence[SuffixPath], max_tokens: int, max_spec_factor: float = 1.0, min_token_prob: float = 0.1,
           offset: float = 0.0) -> SuffixDraft:
    """The chain draft of one tree from its paths: each cut to its match-length cap and to the tokens of
    probability >= ``min_token_prob``, the highest score winning (ties: the longer match)."""
    floor, best = _f32(min_token_prob), SuffixDraft()
    for path in paths:
        k = min(_cap(path.match_len, max_tokens, max_spec_factor, offset), len(path.tokens))
        probs = path.probs
        while k and probs[k - 1] < floor:  # non-increasing: the cut keeps a prefix
            k -= 1
        score = path.scores[k - 1] if k else 0.0
        if score >= best.score:
            best = SuffixDraft(path.tokens[:k], tuple(range(-1, k - 1)), probs[:k], score, path.match_len)
    return best


def choose_between(local: Sequence[SuffixPath], shared: Sequence[SuffixPath], max_tokens: int,
                   max_spec_factor: float = 1.0, min_token_prob: float = 0.1) -> SuffixDraft:
    """A request's chain draft: its own tree's, unless the global tree's scores strictly higher (arctic's
    ``SuffixDecodingCache.speculate``)."""
    best = choose(local, max_tokens, max_spec_factor, min_token_prob)
    other = choose(shared, max_tokens, max_spec_factor, min_token_prob)
    return other if other.score > best.score else best


class SuffixTree:
    """Counts of every substring of length <= ``max_depth`` of a set of token sequences.

    A trie held in flat integer lists (node ids index them; node 0 is the root) and one dict from
    ``(node, token)`` to the child: no Python object per node, so a tree of many thousand nodes costs the
    garbage collector nothing to walk. Each node's children are a doubly linked sibling list in arctic's
    order (``head_child``: sorted by count, highest first): a new child joins at the end; a child whose count
    rises from c to c + 1 goes first among the children of count c + 1 if no sibling before it had count c,
    else last among them; a child whose count falls goes first among the children of its new count
    (``_increment_count``, ``_decrement_count``, ``_insert_into_siblings_*`` in ``suffix_tree.cc``).
    """

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"a suffix tree needs max_depth >= 1, got {max_depth}")
        self.max_depth = max_depth
        # Per node: count, token, first and last child, previous and next sibling (-1: none).
        self._count, self._token = [0], [-1]
        self._head, self._tail, self._prev, self._next = [-1], [-1], [-1], [-1]
        self._child: dict[int, int] = {}  # (node << 32) | token -> child
        self._free: list[int] = []
        self._seqs: dict[int, list[int]] = {}
        self._active: dict[int, list[int]] = {}  # seq -> the nodes of its last tokens' suffixes, longest first

    @property
    def total(self) -> int:
        """Tokens held (the root's count)."""
        return self._count[0]

    def _new_child(self, node: int, token: int) -> int:
        """A child of ``node`` for ``token``: count 1, last of its siblings."""
        if self._free:
            c = self._free.pop()
            self._count[c], self._token[c], self._head[c], self._tail[c] = 1, token, -1, -1
        else:
            c = len(self._count)
            self._count.append(1)
            self._token.append(token)
            self._head.append(-1)
            self._tail.append(-1)
            self._prev.append(-1)
            self._next.append(-1)
        self._child[(node << 32) | token] = c
        last = self._tail[node]
        self._prev[c], self._next[c] = last, -1
        if last < 0:
            self._head[node] = c
        else:
            self._next[last] = c
        self._tail[node] = c
        return c

    def _unlink(self, node: int, c: int) -> None:
        p, n = self._prev[c], self._next[c]
        if p < 0:
            self._head[node] = n
        else:
            self._next[p] = n
        if n < 0:
            self._tail[node] = p
        else:
            self._prev[n] = p

    def _link_after(self, node: int, c: int, q: int) -> None:
        """Put child ``c`` right after sibling ``q`` (``q`` = -1: first)."""
        n = self._head[node] if q < 0 else self._next[q]
        self._prev[c], self._next[c] = q, n
        if q < 0:
            self._head[node] = c
        else:
            self._next[q] = c
        if n < 0:
            self._tail[node] = c
        else:
            self._prev[n] = c

    def _bump(self, node: int, c: int) -> None:
        """Add one to child ``c``'s count and move it to its place among its siblings."""
        count, prev = self._count, self._prev
        k, p = count[c], prev[c]
        if p < 0 or count[p] > k + 1:  # its place holds
            count[c] = k + 1
            return
        limit = k + 1 if count[p] > k else k  # first among count k + 1 if it led its group, else last
        q = p
        while q >= 0 and count[q] <= limit:
            q = prev[q]
        self._unlink(node, c)
        self._link_after(node, c, q)
        count[c] = k + 1

    def _drop(self, node: int, token: int) -> int:
        """Take one from the count of ``node``'s child for ``token``; a child reaching 0 goes with its
        subtree. Returns the child, or -1 when it went."""
        key = (node << 32) | token
        c = self._child[key]
        count, nxt = self._count, self._next
        k = count[c]
        if k == 1:
            del self._child[key]
            self._unlink(node, c)
            self._free_subtree(c)
            return -1
        q = nxt[c]
        if q >= 0 and count[q] >= k:  # equal siblings after it: it goes first among the next count down
            while q >= 0 and count[q] >= k:
                last, q = q, nxt[q]
            self._unlink(node, c)
            self._link_after(node, c, last)
        count[c] = k - 1
        return c

    def _free_subtree(self, c: int) -> None:
        stack = [c]
        while stack:
            n = stack.pop()
            child = self._head[n]
            while child >= 0:
                del self._child[(n << 32) | self._token[child]]
                stack.append(child)
                child = self._next[child]
            self._free.append(n)

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (created if new): every substring ending at each new token
        (of length <= max_depth) has its count raised by one."""
        seq = self._seqs.setdefault(seq_id, [])
        nodes = self._active.get(seq_id, [])
        depth, child_of, count, prev = self.max_depth, self._child, self._count, self._prev
        for token in tokens:
            token = int(token)
            seq.append(token)
            count[0] += 1
            if len(nodes) == depth:  # the longest open suffix cannot grow past the depth
                nodes = nodes[1:]
            nodes.append(0)  # the empty suffix (the root), about to grow by this token
            grown = []
            for node in nodes:
                c = child_of.get((node << 32) | token, -1)
                if c < 0:
                    c = self._new_child(node, token)
                elif prev[c] < 0 or count[prev[c]] > count[c] + 1:  # its place among its siblings holds
                    count[c] += 1
                else:
                    self._bump(node, c)
                grown.append(c)
            nodes = grown
        self._active[seq_id] = nodes

    def remove(self, seq_id: int) -> None:
        """Forget sequence ``seq_id``: every count it raised is lowered again."""
        seq = self._seqs.pop(seq_id, None)
        self._active.pop(seq_id, None)
        if seq is None:
            return
        for start in range(len(seq)):
            node = 0
            self._count[0] -= 1
            for token in seq[start:start + self.max_depth]:
                node = self._drop(node, token)
                if node < 0:  # it held this sequence only: gone with its subtree
                    break

    def _match(self, pattern: Sequence[int]) -> int:
        node, child_of = 0, self._child
        for token in pattern:
            node = child_of.get((node << 32) | token, -1)
            if node < 0:
                return -1
        return node

    def speculate(self, pattern: Sequence[int], max_tokens: int, max_spec_factor: float = 1.0,
                  min_token_prob: float = 0.1, *, offset: float = 0.0, tree: bool = False) -> SuffixDraft:
        """The best draft after ``pattern`` (the context's last tokens) over every match length (module
        docstring); an empty draft when nothing matches."""
        if not tree:
            return choose(self.paths(pattern, max_tokens, max_spec_factor, offset), max_tokens, max_spec_factor,
                          min_token_prob, offset)
        floor, best = _f32(min_token_prob), SuffixDraft()
        for m, node in self._matches(pattern):
            draft = self._tree(node, _cap(m, max_tokens, max_spec_factor, offset), floor)
            if draft.score >= best.score:
                best = SuffixDraft(draft.tokens, draft.parents, draft.probs, draft.score, m)
        return best

    def _matches(self, pattern: Sequence[int]) -> Iterator[tuple[int, int]]:
        """(match length, node) for the pattern's last 1, 2, .. tokens, while they occur (never the whole
        pattern: arctic's ``match_len < context.size()``)."""
        for m in range(1, len(pattern)):
            node = self._match(pattern[len(pattern) - m:])
            if node < 0:
                return
            yield m, node

    def paths(self, pattern: Sequence[int], limit: int, max_spec_factor: float | None = None,
              offset: float = 0.0) -> list[SuffixPath]:
        """Per match length, the chain of highest-count children after it, up to ``limit`` tokens (and to the
        match-length cap of ``max_spec_factor`` when given), with no probability cut: :func:`choose` cuts it."""
        out = []
        for m, node in self._matches(pattern):
            cap = limit if max_spec_factor is None else _cap(m, limit, max_spec_factor, offset)
            out.append(self._path(node, m, cap))
        return out

    def _path(self, node: int, m: int, cap: int) -> SuffixPath:
        """The chain of highest-count children from ``node``, at most ``cap`` tokens."""
        count, head, token_of = self._count, self._head, self._token
        tokens: list[int] = []
        probs: list[float] = []
        scores: list[float] = []
        prob, score = 1.0, 0.0
        while len(tokens) < cap:
            child = head[node]
            if child < 0:
                break
            if count[child] != count[node]:  # a ratio of 1 leaves the probability as it is
                prob = _f32(prob * _f32(count[child] / count[node]))
            tokens.append(token_of[child])
            probs.append(prob)
            score = _f32(score + prob)
            scores.append(score)
            node = child
        return SuffixPath(m, tuple(tokens), tuple(probs), tuple(scores))

    def _tree(self, node: int, cap: int, floor: float) -> SuffixDraft:
        """Best-first by probability: every child of probability >= ``floor``, at most ``cap`` nodes."""
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[float] = []
        score = 0.0
        heap: list[_Item] = []
        self._push_children(heap, node, 1.0, -1, floor)
        while heap and len(tokens) < cap:
            item = heapq.heappop(heap)
            tokens.append(self._token[item.node])
            parents.append(item.parent)
            probs.append(item.prob)
            score = _f32(score + item.prob)
            self._push_children(heap, item.node, item.prob, len(tokens) - 1, floor)
        return SuffixDraft(tuple(tokens), tuple(parents), tuple(probs), score)

    def _push_children(self, heap: list[_Item], node: int, prob: float, parent: int, floor: float) -> None:
        child = self._head[node]
        while child >= 0:
            p = _f32(_f32(prob * self._count[child]) / self._count[node])  # arctic's order of operations here
            if p < floor:
                break
            heapq.heappush(heap, _Item(p, child, parent))
            child = self._next[child]


class _Item:
    """A heap entry ordered by probability only (arctic's max-heap on ``prob``)."""

    __slots__ = ("prob", "node", "parent")

    def __init__(self, prob: float, node: int, parent: int) -> None:
        self.prob, self.node, self.parent = prob, node, parent

    def __lt__(self, other: _Item) -> bool:
        return self.prob > other.prob


__all__ = ["SuffixDraft", "SuffixPath", "SuffixTree", "choose", "choose_between"]
