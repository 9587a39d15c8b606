"""StatePool: slots, each holding every linear layer's recurrent + conv state at one token position.

Slot ids index the same row of every linear layer's state tensors (see cache/cache_tensors.py). A slot
is either free or owned by exactly one holder (a running sequence's working state, or a checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable


class StatePool:
    def __init__(self, num_slots: int, copy_fn: Callable[[int, int], None] | None = None):
        if num_slots < 1:
            raise ValueError(f"need at least one state slot, got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out the lowest id first
        self._used = [False] * num_slots
        self._copy_fn = copy_fn

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise MemoryError("no free state slot")
        slot = self._free.pop()
        self._used[slot] = True
        return slot

    def free(self, slot: int) -> None:
        if not self._used[slot]:
            raise ValueError(f"state slot {slot} is already free")
        self._used[slot] = False
        self._free.append(slot)

    def copy(self, src: int, dst: int) -> None:
        """Copy every layer's state in `src` into `dst` (both must be allocated)."""
        if not (self._used[src] and self._used[dst]):
            raise ValueError(f"copy between unallocated slots {src} → {dst}")
        if self._copy_fn is not None and src != dst:
            self._copy_fn(src, dst)

    def check_integrity(self, owned: list[int]) -> None:
        """`owned`: every slot some holder references; each must be allocated and held once."""
        if len(owned) != len(set(owned)):
            raise AssertionError(f"a state slot has two owners: {sorted(owned)}")
        used = {s for s in range(self.num_slots) if self._used[s]}
        if used != set(owned):
            raise AssertionError(f"allocated slots {sorted(used)} != owned slots {sorted(owned)}")
        if len(self._free) + len(used) != self.num_slots:
            raise AssertionError("state slot free list is inconsistent")
