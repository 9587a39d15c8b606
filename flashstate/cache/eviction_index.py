"""EvictionIndex: the policy's next victim from heaps, without a scan of the tree.

A unit that may be evicted is an unlocked node of one of three classes: a leaf with a checkpoint, a leaf
without one (a KV-only path), an interior checkpoint. A victim kind evicts from some of them ("kv":
leaves; "state": checkpoints; "unit": all three). Each class has two heaps of entries (rank, record,
version), ordered by `Policy.unit_key`'s rank and then by `RadixTree.nodes()` order (`precedes`): the
smallest valid entry over a kind's classes is the first node with the smallest key, the node a scan of
every node (`scan_victim`) picks.

    unprotected   nodes `Policy.protected` does not shield at the time of the last query
    protected     leaf-last frontiers touched less than `leaf_idle_seconds` before it; one more heap, over
                  all classes, holds them by last access, the order in which they lose protection, and each
                  query first moves those that lost it to the unprotected heaps (while time goes forward;
                  when it goes back, every node is classified again)

Invalidation is lazy: each node's record has a version, bumped whenever the node's class, protection or
rank changes; an entry whose version is not its record's is stale, and dropped when it reaches the top of
its heap (or all at once, when they pile up: `_compact`). The tree (`TreeObserver`), the block pool
(`on_refs_changed`) and the cache manager (`touched`, `slot_changed`, `lock_changed`) report changes; the
nodes whose key they may change are marked dirty and re-keyed at the next query:

    stamp, frontier flag      the node (priority, last access, protection)
    slot set or cleared       the node; under GDS also every node below it down to the next checkpoints
                              (the checkpoint above them, so the prefill they save)
    lock taken or dropped     the node; under GDS also the leaf whose removable chain runs through it
    insert, split, removal    the nodes made, their parents (leaf or not), and under GDS the leaves whose
                              removable chains gain or lose a node or a block
    a block's ref count       under GDS, the leaf whose removable chain holds the block (its exclusive
                              blocks)

LRU ranks by last access alone, so only GDS tracks removable chains, block holders and checkpoint depths.
"""

from __future__ import annotations

import heapq
import itertools
import math

from flashstate.cache.policy import Policy
from flashstate.cache.tree import Node, RadixTree, precedes

LEAF, LEAF_KV, INNER = 0, 1, 2  # a leaf with a checkpoint, a leaf without one, an interior checkpoint
KINDS = {"kv": (LEAF, LEAF_KV), "state": (LEAF, INNER), "unit": (LEAF, LEAF_KV, INNER)}


def unit_class(node: Node) -> int | None:
    """The class of the unit at `node`; None for an interior node without a checkpoint (no unit)."""
    if node.is_leaf:
        return LEAF if node.slot is not None else LEAF_KV
    return INNER if node.slot is not None else None


def scan_victim(
    policy: Policy, tree: RadixTree, kind: str, now: float, exclude: Node | None = None
) -> Node | None:
    """The unit to evict first, by a look at every node: among the unlocked units of `kind` other than
    `exclude`, the first in `tree.nodes()` order with the smallest `policy.unit_key`. O(nodes): the
    reference the index is tested and measured against."""
    classes = KINDS[kind]
    best, best_key = None, None
    for node in tree.nodes():
        if node.lock or node is exclude or unit_class(node) not in classes:
            continue
        key = policy.unit_key(tree, node, now)
        if best_key is None or key < best_key:
            best, best_key = node, key
    return best


class _Record:
    """One node of the tree as the index holds it: the class, protection and rank its valid entries carry
    (class None: no valid entry)."""

    __slots__ = ("node", "version", "cls", "protected", "rank", "last_access")

    def __init__(self, node: Node):
        self.node = node
        self.version = 0
        self.cls: int | None = None
        self.protected = False
        self.rank = 0.0
        self.last_access = 0.0

    def __lt__(self, other: _Record) -> bool:  # a tie of ranks goes to the node a scan meets first
        return precedes(self.node, other.node)


Entry = tuple[float, _Record, int]  # (rank, record, version)


class EvictionIndex:
    def __init__(self, tree: RadixTree, policy: Policy):
        self.tree = tree
        self.policy = policy
        self._gds = policy.eviction == "gds"
        self._records: dict[Node, _Record] = {}  # every node of the tree but the roots
        self._heaps: dict[tuple[int, bool], list[Entry]] = {
            (cls, protected): [] for cls in (LEAF, LEAF_KV, INNER) for protected in (False, True)
        }
        self._expiry: list[tuple[float, int, _Record, int]] = []  # (last access, serial, record, version)
        self._serial = itertools.count()
        self._entries = 0  # in all heaps, valid or stale
        self._dirty: set[Node] = set()
        self._now = -math.inf  # the time of the last query
        # GDS: the nodes holding each block (one here, any others in `_more_holders`), and the nodes whose
        # removable chain's leaf is to be re-keyed.
        self._holder: list[Node | None] = [None] * tree.pool.num_blocks if self._gds else []
        self._more_holders: dict[int, list[Node]] = {}
        self._chains: set[Node | None] = set()
        tree.observer = self
        tree.pool.on_refs_changed = self._refs_changed if self._gds else None
        for node in tree.nodes():
            self._add(node)

    # ---- the query ------------------------------------------------------------------------------

    def victim(self, kind: str, now: float, exclude: Node | None = None) -> Node | None:
        """What `scan_victim(policy, tree, kind, now, exclude)` gives, from the heaps."""
        self._refresh(now)
        for protected in (False, True):
            best = None
            for cls in KINDS[kind]:
                top = self._top(self._heaps[cls, protected], exclude)
                if top is not None and (best is None or top < best):
                    best = top
            if best is not None:
                return best[1].node
        return None

    def _top(self, heap: list[Entry], exclude: Node | None) -> Entry | None:
        """The smallest valid entry of `heap` that is not `exclude`'s."""
        self._drop_stale(heap)
        if not heap or heap[0][1].node is not exclude:
            return heap[0] if heap else None
        held = heapq.heappop(heap)
        self._drop_stale(heap)
        top = heap[0] if heap else None
        heapq.heappush(heap, held)
        return top

    def _drop_stale(self, heap: list[Entry]) -> None:
        while heap and heap[0][2] != heap[0][1].version:
            heapq.heappop(heap)
            self._entries -= 1

    # ---- reports from the cache manager ---------------------------------------------------------

    def touched(self, node: Node) -> None:
        """`node` was stamped, or its frontier flag changed."""
        self._dirty.add(node)

    def slot_changed(self, node: Node) -> None:
        """`node`'s checkpoint was set or cleared."""
        self._dirty.add(node)
        if self._gds:  # the checkpoint above each node down to the next checkpoints
            stack = list(node.children.values())
            while stack:
                below = stack.pop()
                self._dirty.add(below)
                if below.slot is None:
                    stack.extend(below.children.values())

    def lock_changed(self, node: Node) -> None:
        """`node`'s lock went from 0 to held, or back."""
        self._dirty.add(node)
        if self._gds and len(node.children) == 1:
            self._chains.update(node.children.values())

    # ---- reports from the tree (TreeObserver) and the block pool --------------------------------

    def node_added(self, node: Node) -> None:
        self._add(node)
        parent = node.parent
        if parent.parent is None:  # a root: no unit, in no removable chain
            return
        self._dirty.add(parent)
        if self._gds and len(parent.children) == 2:  # the parent leaves its other child's chain
            self._chains.update(c for c in parent.children.values() if c is not node)

    def node_split(self, upper: Node, lower: Node) -> None:
        self._add(upper)
        if self._gds:
            # `lower` keeps only its first block of those `upper` took (one straddling both).
            moved = upper.blocks[:-1] if upper.blocks[-1] == lower.blocks[0] else upper.blocks
            self._unhold(lower, moved)
            self._chains.add(lower)

    def node_removed(self, node: Node) -> None:
        record = self._records.pop(node)
        record.version += 1
        if self._gds:
            self._unhold(node, node.blocks)
        parent = node.parent
        if parent.parent is None:
            return
        self._dirty.add(parent)
        if self._gds and len(parent.children) == 1:  # the parent may join its remaining child's chain
            self._chains.update(parent.children.values())

    def _refs_changed(self, blocks: list[int]) -> None:
        self._chains.update(map(self._holder.__getitem__, blocks))  # None for a block no node holds
        more = self._more_holders
        if more:
            for b in more.keys() & blocks:
                self._chains.update(more[b])

    def _add(self, node: Node) -> None:
        self._records[node] = _Record(node)
        self._dirty.add(node)
        if self._gds:
            holder, more = self._holder, self._more_holders
            for b in node.blocks:
                if holder[b] is None:
                    holder[b] = node
                else:
                    more.setdefault(b, []).append(node)

    def _unhold(self, node: Node, blocks: list[int]) -> None:
        holder, more = self._holder, self._more_holders
        for b in blocks:
            others = more.get(b)
            if holder[b] is node:
                holder[b] = others.pop() if others else None
            else:
                others.remove(node)
            if others is not None and not others:
                del more[b]

    # ---- re-keying ------------------------------------------------------------------------------

    def _refresh(self, now: float) -> None:
        """Bring every entry up to date for a query at `now`."""
        if now < self._now:  # protection lost as time went forward may come back
            self._reclassify()
        self._now = now
        if self._chains:
            self._chains.discard(None)
            seen: set[Node] = set()
            for node in self._chains:
                leaf = self._chain_leaf(node, seen)
                if leaf is not None:
                    self._dirty.add(leaf)
            self._chains.clear()
        for node in self._dirty:
            self._rekey(node, now)
        self._dirty.clear()
        self._expire(now)
        if self._entries > 4 * len(self._records) + 1024:
            self._compact()

    def _chain_leaf(self, node: Node, seen: set[Node]) -> Node | None:
        """The leaf whose removable chain (`RadixTree.removable_chain`) holds `node`, if any; None as well
        when the walk reaches a node of `seen` (whose leaf was found already)."""
        while node in self._records and node not in seen:
            seen.add(node)
            if node.is_leaf:
                return node
            if node.slot is not None or node.lock or len(node.children) != 1:
                return None
            node = next(iter(node.children.values()))
        return None

    def _rekey(self, node: Node, now: float) -> None:
        record = self._records.get(node)
        if record is None:  # removed since
            return
        cls = None if node.lock else unit_class(node)
        if cls is None:
            if record.cls is not None:
                record.cls = None
                record.version += 1
            return
        protected, rank = self.policy.unit_key(self.tree, node, now)
        last_access = node.last_access
        if (
            record.cls == cls
            and record.protected == protected
            and record.rank == rank
            and (not protected or record.last_access == last_access)
        ):
            return  # its entries still hold
        record.version += 1
        record.cls, record.protected, record.rank, record.last_access = cls, protected, rank, last_access
        self._push(record)

    def _push(self, record: _Record) -> None:
        heapq.heappush(self._heaps[record.cls, record.protected], (record.rank, record, record.version))
        self._entries += 1
        if record.protected:
            entry = (record.last_access, next(self._serial), record, record.version)
            heapq.heappush(self._expiry, entry)
            self._entries += 1

    def _expire(self, now: float) -> None:
        """Move the nodes no longer protected at `now` to the unprotected heaps. At a given time, a node
        touched earlier loses protection no later than one touched after it."""
        expiry = self._expiry
        while expiry:
            _, _, record, version = expiry[0]
            valid = version == record.version
            if valid and self.policy.protected(record.node, now):
                return
            heapq.heappop(expiry)
            self._entries -= 1
            if valid:
                record.version += 1
                record.protected = False
                self._push(record)

    def _reclassify(self) -> None:
        """Drop every entry and re-key every node."""
        for record in self._records.values():
            record.cls = None
            record.version += 1
        for heap in self._heaps.values():
            heap.clear()
        self._expiry.clear()
        self._entries = 0
        self._dirty.update(self._records)

    def _compact(self) -> None:
        """Drop every stale entry (each heap's entries end with record, version)."""
        for heap in [*self._heaps.values(), self._expiry]:
            heap[:] = [e for e in heap if e[-1] == e[-2].version]
            heapq.heapify(heap)
        self._entries = sum(map(len, self._heaps.values())) + len(self._expiry)
