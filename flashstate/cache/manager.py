"""CacheManager: the one facade the scheduler sees over the block pool and the state pool.

Verbs: `admit` (a working state slot, and later the prefix-cache match), `allocate` (KV blocks for the
next chunk), `free` (everything a sequence holds), `check_integrity`.
"""

from __future__ import annotations

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.state_pool import StatePool
from flashstate.cache.stats import CacheStats
from flashstate.engine.sequence import Sequence


class CacheManager:
    def __init__(self, block_pool: BlockPool, state_pool: StatePool):
        self.block_pool = block_pool
        self.state_pool = state_pool
        self.stats = CacheStats()

    @property
    def block_size(self) -> int:
        return self.block_pool.block_size

    def can_ever_fit(self, num_tokens: int) -> bool:
        return self.block_pool.blocks_for(num_tokens) <= self.block_pool.num_blocks

    def admit(self, seq: Sequence) -> bool:
        """Give a waiting sequence its working state slot; False when none is free."""
        if self.state_pool.num_free == 0:
            return False
        seq.state_slot = self.state_pool.allocate()
        return True

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make the block table cover num_computed_tokens + num_new_tokens; False (nothing taken) if short."""
        need = self.block_pool.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need <= 0:
            return True
        if need > self.block_pool.num_free:
            return False
        seq.block_table.extend(self.block_pool.allocate(need))
        return True

    def free(self, seq: Sequence) -> None:
        """Return every block and the working slot of a finished, aborted or preempted sequence."""
        self.block_pool.free(seq.block_table)
        seq.block_table = []
        if seq.state_slot is not None:
            self.state_pool.free(seq.state_slot)
            seq.state_slot = None

    def check_integrity(self, live: list[Sequence]) -> None:
        refs: dict[int, int] = {}
        for seq in live:
            for b in seq.block_table:
                refs[b] = refs.get(b, 0) + 1
        self.block_pool.check_integrity(refs)
        self.state_pool.check_integrity([s.state_slot for s in live if s.state_slot is not None])
