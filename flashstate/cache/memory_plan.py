"""Split a memory budget between KV blocks and state slots."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashstate.config import EngineConfig
from flashstate.engine.cache_tensors import kv_bytes_per_block, state_bytes_per_slot
from flashstate.models.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class CachePlan:
    """| < working slots: max_num_seqs > | < checkpoint slots > |   | < KV blocks > |
    Working slots hold running sequences' states; checkpoint slots are the prefix cache's."""

    num_blocks: int
    block_size: int
    num_slots: int
    num_working_slots: int
    bytes_per_block: int
    bytes_per_slot: int

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def state_bytes(self) -> int:
        return self.num_slots * self.bytes_per_slot

    def describe(self) -> str:
        mib = 1 << 20
        return (
            f"KV cache: {self.num_blocks} blocks × {self.block_size} tokens "
            f"({self.num_blocks * self.block_size} tokens, {self.kv_bytes / mib:.1f} MiB); "
            f"state pool: {self.num_slots} slots ({self.num_working_slots} working, "
            f"{self.num_slots - self.num_working_slots} checkpoints, {self.state_bytes / mib:.1f} MiB)"
        )


def plan_cache(spec: ModelSpec, config: EngineConfig, dtype: torch.dtype, budget_bytes: int) -> CachePlan:
    block = max(kv_bytes_per_block(spec, config.block_size, dtype), 1)
    slot = max(state_bytes_per_slot(spec, dtype), 1)
    working = config.max_num_seqs
    left = budget_bytes - working * slot
    checkpoints = int(left * config.state_cache_fraction) // slot if config.enable_prefix_caching else 0
    num_blocks = (left - checkpoints * slot) // block
    if num_blocks < 1:
        raise ValueError(
            f"cache budget of {budget_bytes / (1 << 20):.1f} MiB cannot hold {working} working states "
            f"({slot} bytes each) plus one KV block ({block} bytes): raise kv_cache_memory_bytes "
            f"or lower max_num_seqs"
        )
    return CachePlan(num_blocks, config.block_size, working + checkpoints, working, block, slot)
