"""BlockPool: the paged KV blocks shared by every attention layer — ref counts and a free queue.

A block id indexes the same row of every attention layer's KV tensor. A block is free exactly when
its ref count is 0; the free queue holds every free block once, least recently freed first.

`on_refs_changed`, when set, is called with the blocks of every `incref` and `free` (after the counts
change); `allocate` takes only free blocks, which nothing else references.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need at least one block of at least one token, got {num_blocks} × {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_queue: deque[int] = deque(range(num_blocks))
        self.on_refs_changed: Callable[[list[int]], None] | None = None

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise MemoryError(f"asked for {n} KV blocks, {len(self.free_queue)} free")
        blocks = [self.free_queue.popleft() for _ in range(n)]
        for b in blocks:
            self.ref_counts[b] = 1
        return blocks

    def incref(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref_counts[b] == 0:
                raise ValueError(f"block {b} is free: cannot share it")
            self.ref_counts[b] += 1
        if self.on_refs_changed is not None:
            self.on_refs_changed(blocks)

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block; blocks reaching 0 go back to the free queue."""
        for b in blocks:
            if self.ref_counts[b] <= 0:
                raise ValueError(f"block {b} freed more times than it was referenced")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue.append(b)
        if self.on_refs_changed is not None:
            self.on_refs_changed(blocks)

    def check_integrity(self, expected_refs: dict[int, int]) -> None:
        """`expected_refs`: block → number of owners (sequences, cache nodes) that reference it."""
        free = set(self.free_queue)
        if len(free) != len(self.free_queue):
            raise AssertionError("a block is in the free queue twice")
        for b in range(self.num_blocks):
            want = expected_refs.get(b, 0)
            if self.ref_counts[b] != want:
                raise AssertionError(f"block {b}: ref count {self.ref_counts[b]}, owners {want}")
            if (want == 0) != (b in free):
                raise AssertionError(f"block {b}: ref count {want} but free-queue membership {b in free}")
