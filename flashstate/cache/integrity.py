"""The cache manager's invariants, checked after every step in tests (`CacheManager.check_integrity`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashstate.engine.sequence import Sequence

if TYPE_CHECKING:
    from flashstate.cache.manager import CacheManager


def check_manager(m: CacheManager, live: list[Sequence]) -> None:
    """Every block and slot is free or owned by exactly the nodes/sequences that reference it; locks, node
    shapes, the checkpoint count, the shared budget and the vLLM page pool agree with the owners."""
    refs: dict[int, int] = {}
    slots = list(m._inflight)
    locks: dict[int, int] = {}
    for seq in live:
        r = seq.restore
        if r is not None and (
            seq.num_computed_tokens
            or seq.cache_handle is not None
            or r.blocks != seq.block_table
            or len(r.blocks) != m.block_pool.blocks_for(r.depth)
            or r.slot != seq.state_slot
        ):
            raise AssertionError(f"restoring request {seq.request_id} holds the wrong resources")
        for b in seq.block_table:
            refs[b] = refs.get(b, 0) + 1
        if seq.state_slot is not None:
            slots.append(seq.state_slot)
        if seq.cache_handle is not None:
            for n in seq.cache_handle.path():
                locks[id(n)] = locks.get(id(n), 0) + 1
    count = 0
    for node in m.tree.nodes():
        for b in node.blocks:
            refs[b] = refs.get(b, 0) + 1
        if node.slot is not None:
            slots.append(node.slot)
            count += 1
        bs = m.block_size
        if len(node.blocks) != -(-node.end // bs) - node.start // bs or not node.tokens:
            raise AssertionError(f"node [{node.start}, {node.end}) holds {len(node.blocks)} blocks")
        if node.parent.parent is not None and node.start != node.parent.end:
            raise AssertionError("a node does not start where its parent ends")
        if node.parent.children.get(node.tokens[0]) is not node:
            raise AssertionError("a node is not indexed under its first token")
        if node.is_leaf and node.slot is None and node.lock == 0 and not m.policy.decode_kv:
            raise AssertionError(f"leaf [{node.start}, {node.end}) holds no checkpoint")
        if node.lock != locks.get(id(node), 0):
            raise AssertionError(f"node lock {node.lock} != {locks.get(id(node), 0)} running handles")
    if count != m.num_checkpoints or count > max(m.max_checkpoints, 0) + len(m._inflight):
        raise AssertionError(f"{count} checkpoints (counted {m.num_checkpoints}, max {m.max_checkpoints})")
    m.block_pool.check_integrity(refs)
    m.state_pool.check_integrity(slots)
    if m.byte_budget is not None and m.enabled and m.charged_bytes > m.byte_budget:
        raise AssertionError(f"{m.charged_bytes} bytes charged against a budget of {m.byte_budget}")
    if m.pages is not None:
        _check_pages(m, live)


def _check_pages(m: CacheManager, live: list[Sequence]) -> None:
    """The pool's own accounting holds, it holds pages for exactly the live sequences, and every tree
    checkpoint is a state the pool holds."""
    m.pages.check_integrity()
    if set(m.pages.requests) != {seq.request_id for seq in live}:
        raise AssertionError(f"pool requests {sorted(m.pages.requests)} != live sequences")
    for node in m.tree.nodes():
        if node.slot is not None and not m.pages.holds_state(m.tree.path_tokens(node), node.end):
            raise AssertionError(f"checkpoint at {node.end} is not held by the vLLM page pool")
