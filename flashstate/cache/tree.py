"""Token-granular radix tree: the KV path of every cached prefix, plus checkpoints at node ends.

A node covers the token positions [start, end) of its path; its edge is `tokens` (end - start ids).
It holds one reference on each KV block that covers its positions:

    blocks[i] is the block of index floor(start / B) + i,  for i < ceil(end / B) - floor(start / B)

and that block also holds valid KV for the positions of its index before `start` (inherited from the
parent, or a copy of the parent's block). A block straddling the boundary of a parent and its child
may be the same physical block (one writer continued) or a copy (a branch): the path's block table
takes, for each index, the block of the deepest node covering it.

`slot` is the state-pool slot with every linear layer's state right after position end - 1 (a
checkpoint), or None. A hit needs a node whose checkpoint sits at exactly the hit depth.
`lock` counts running sequences whose cache handle lies in this node's subtree: a locked node is
never evicted.

Cache salts (vLLM's `cache_salt`): each salt has a root of its own, so the paths of requests with
different salts never meet (salt None: the shared root, `root`). A salt's root goes when its last child
does.

`observer` (cache/eviction_index.py) is told of every node added, split or removed.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from flashstate.cache.block_pool import BlockPool


@dataclass(eq=False, slots=True)
class Node:
    parent: Node | None
    start: int
    tokens: list[int]
    blocks: list[int]
    slot: int | None = None
    children: dict[int, Node] = field(default_factory=dict)
    lock: int = 0
    # Policy bookkeeping (cache/policy.py).
    priority: float = 0.0  # GDS H
    last_access: float = 0.0
    frontier: bool = False  # a session's expected resume point (protected under leaf-last)
    ends_request: bool = False  # made by a request's end (its frontier checkpoint)
    # On a request's retry checkpoint (one token before its prompt's end): that request's end checkpoint,
    # so the next request resuming here instead is known to have left the reply's path (CacheManager)
    reply: Node | None = None
    retry_point: Node | None = None  # on a request's end checkpoint: that request's retry checkpoint
    resumed_at_prompt_end: bool = False  # on a retry checkpoint: its request had left its previous reply too
    # Insertion stamp: siblings sorted by it are in the order of their parent's `children` dict (roots: of
    # `RadixTree.roots`). The upper half of a split takes the cut node's, as it takes its dict entry.
    order: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def path(self) -> Iterator[Node]:
        """Root-exclusive ancestors, this node last."""
        chain = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            chain.append(node)
            node = node.parent
        return reversed(chain)

    def ancestor_checkpoint_depth(self) -> int:
        """Depth of the nearest checkpoint above this node (0: the empty prefix, always 'held')."""
        node = self.parent
        while node is not None and node.parent is not None:
            if node.slot is not None:
                return node.end
            node = node.parent
        return 0


def precedes(a: Node, b: Node) -> bool:
    """Whether `a` comes before `b` in `RadixTree.nodes()`: a pre-order that takes the last-inserted root
    first, and each node's last-inserted child first. Between two nodes of the tree it never changes (a
    split's upper half takes the cut node's place); nor does it for a removed node, whose ancestors stay."""
    la, lb = _lineage(a), _lineage(b)
    for x, y in zip(la, lb, strict=False):
        if x is not y:
            return x.order > y.order
    return len(la) < len(lb)


def _lineage(node: Node) -> list[Node]:
    """The root, each ancestor below it, and `node`."""
    chain = [node]
    while node.parent is not None:
        node = node.parent
        chain.append(node)
    chain.reverse()
    return chain


class TreeObserver(Protocol):
    def node_added(self, node: Node) -> None:
        """`node` hangs from its parent now (a new leaf)."""

    def node_split(self, upper: Node, lower: Node) -> None:
        """`upper`, new, took `lower`'s place; `lower` now starts at upper's end and hangs from it."""

    def node_removed(self, node: Node) -> None:
        """The leaf `node` left the tree; its `blocks` still name the blocks whose references it dropped."""


@dataclass(slots=True)
class Match:
    node: Node  # deepest node with a checkpoint usable by the request; the root when none
    depth: int  # its end: tokens restored (0 on a miss)
    kv_depth: int  # how far the request's tokens follow cached KV (>= depth)


class RadixTree:
    def __init__(self, block_pool: BlockPool):
        self.pool = block_pool
        self.block_size = block_pool.block_size
        self._orders = itertools.count()
        self.root = Node(None, 0, [], [], order=next(self._orders))
        self.roots: dict[str | None, Node] = {None: self.root}
        self._salts: dict[int, str] = {}  # id of a salt's root -> the salt
        self.observer: TreeObserver | None = None

    def root_for(self, salt: str | None, create: bool = False) -> Node | None:
        """The root of `salt`'s paths; None when it has none and `create` is off."""
        root = self.roots.get(salt)
        if root is None and create:
            root = self.roots[salt] = Node(None, 0, [], [], order=next(self._orders))
            self._salts[id(root)] = salt
        return root

    def _first(self, pos: int) -> int:
        return pos // self.block_size

    def _stop(self, pos: int) -> int:
        return -(-pos // self.block_size)

    def salt_of(self, node: Node) -> str | None:
        """The cache salt of the root `node` hangs from."""
        while node.parent is not None:
            node = node.parent
        return self._salts.get(id(node))

    def nodes(self) -> Iterator[Node]:
        stack = [child for root in self.roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ---- lookup ---------------------------------------------------------------------------------

    def match(self, tokens: list[int], limit: int | None = None, salt: str | None = None) -> Match:
        """Follow `tokens` down the tree of `salt`; the hit is the deepest checkpoint at depth <= limit."""
        limit = len(tokens) if limit is None else limit
        root = self.root_for(salt)
        if root is None:
            return Match(self.root, 0, 0)
        node, pos, best = root, 0, root
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common_prefix(child.tokens, tokens, pos)
            pos += n
            if n < len(child.tokens):
                break
            node = child
            if child.slot is not None and child.end <= limit:
                best = child
        return Match(best, best.end, pos)

    def path_tokens(self, node: Node) -> list[int]:
        """The token ids of positions [0, node.end)."""
        return [t for n in node.path() for t in n.tokens]

    def block_table(self, node: Node) -> list[int]:
        """Blocks holding the KV of positions [0, node.end): per block index, the deepest node's block."""
        table: list[int] = []
        for n in node.path():
            first = self._first(n.start)
            del table[first:]
            table.extend(n.blocks)
        return table

    def kv_blocks(self, tokens: list[int], depth: int, salt: str | None = None) -> list[int]:
        """Blocks holding the KV of positions [0, depth) of `tokens` (depth a multiple of the block size,
        at most match(tokens, salt=salt).kv_depth): the path may end inside a node."""
        table: list[int] = []
        node, pos = self.root_for(salt) if depth else self.root, 0
        while pos < depth:
            child = node.children[tokens[pos]]
            n = _common_prefix(child.tokens, tokens, pos, depth)
            del table[self._first(child.start) :]
            table.extend(child.blocks)
            node, pos = child, pos + n
        assert pos == depth and depth % self.block_size == 0
        return table[: depth // self.block_size]

    # ---- structure ------------------------------------------------------------------------------

    def split(self, node: Node, at: int) -> Node:
        """Cut `node` at position `at` (start < at < end); returns the new upper node (no checkpoint)."""
        assert node.start < at < node.end and node.parent is not None
        k = at - node.start
        first, cut = self._first(node.start), self._stop(at)
        upper = Node(node.parent, node.start, node.tokens[:k], node.blocks[: cut - first], order=node.order)
        upper.last_access, upper.priority = node.last_access, node.priority
        node.parent.children[node.tokens[0]] = upper
        keep_from = self._first(at) - first  # the straddling block (if any) stays in both
        self.pool.incref(node.blocks[keep_from : cut - first])
        node.tokens, node.blocks, node.start = node.tokens[k:], node.blocks[keep_from:], at
        node.parent = upper
        upper.children[node.tokens[0]] = node
        upper.lock = node.lock
        if self.observer is not None:
            self.observer.node_split(upper, node)
        return upper

    def insert(
        self, tokens: list[int], block_table: list[int], depth: int, salt: str | None = None
    ) -> tuple[Node, bool]:
        """Make the path tokens[:depth] exist under `salt`'s root; new nodes take references on
        `block_table`'s blocks.

        Returns (the node ending at `depth`, whether it was created or cut just now)."""
        node, pos = self.root_for(salt, create=depth > 0) or self.root, 0
        while pos < depth:
            child = node.children.get(tokens[pos])
            if child is None:
                new = Node(
                    node,
                    pos,
                    tokens[pos:depth],
                    block_table[self._first(pos) : self._stop(depth)],
                    order=next(self._orders),
                )
                self.pool.incref(new.blocks)
                node.children[tokens[pos]] = new
                if self.observer is not None:
                    self.observer.node_added(new)
                return new, True
            n = _common_prefix(child.tokens, tokens, pos, depth)
            if n < len(child.tokens):
                upper = self.split(child, pos + n)
                if pos + n == depth:
                    return upper, True
                node, pos = upper, pos + n
                continue
            node, pos = child, pos + n
        return node, False

    def remove_leaf(self, node: Node) -> None:
        """Detach a leaf without a checkpoint and drop its block references."""
        assert node.is_leaf and node.slot is None and node.lock == 0 and node.parent is not None
        parent = node.parent
        del parent.children[node.tokens[0]]
        self.pool.free(node.blocks)
        if self.observer is not None:
            self.observer.node_removed(node)
        node.blocks = []
        if not parent.children and parent.parent is None and parent is not self.root:
            del self.roots[self._salts.pop(id(parent))]

    def exclusive_blocks(self, node: Node) -> int:
        """Blocks freed if this leaf (and the checkpoint-less chain above it) went away: those no one else
        (another node, a running sequence) references."""
        chain, _ = self.removable_chain(node)
        rc = self.pool.ref_counts
        # A block strictly inside a node's range is held by no other node of the chain: exclusive iff its
        # ref count is 1. Only a node's first and last blocks can be shared with its chain neighbours.
        inner = sum(list(map(rc.__getitem__, n.blocks[1:-1])).count(1) for n in chain)
        ends = Counter(b for n in chain if n.blocks for b in {n.blocks[0], n.blocks[-1]})
        return inner + sum(1 for b, c in ends.items() if rc[b] == c)

    def removable_chain(self, node: Node) -> tuple[list[Node], Node]:
        """The leaf and the ancestors that would become checkpoint-less leaves after it goes; and the
        first ancestor that stays."""
        chain = [node]
        parent = node.parent
        while (
            parent is not None
            and parent.parent is not None
            and parent.slot is None
            and parent.lock == 0
            and len(parent.children) == 1
        ):
            chain.append(parent)
            parent = parent.parent
        return chain, parent


_SPAN = 256  # tokens compared per slice (C speed) before the token-by-token scan of the mismatching one


def _common_prefix(edge: list[int], tokens: list[int], pos: int, stop: int | None = None) -> int:
    """Length of the common prefix of `edge` and `tokens[pos:stop]`."""
    n = min(len(edge), (len(tokens) if stop is None else stop) - pos)
    i = 0
    while i < n and edge[i : min(i + _SPAN, n)] == tokens[pos + i : pos + min(i + _SPAN, n)]:
        i += _SPAN
    i = min(i, n)
    while i < n and edge[i] == tokens[pos + i]:
        i += 1
    return i
