"""How much memory the cache gets (`cache_budget`) and how it splits between KV blocks and state slots."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from flashstate.cache.cache_tensors import kv_bytes_per_block, kv_dtype, state_bytes_per_slot
from flashstate.cache.policy import vllm_geometry
from flashstate.cache.vllm_pages import VllmPagePool
from flashstate.config import EngineConfig
from flashstate.spec.model_spec import ModelSpec

SGLANG_STATE_FRACTION = 0.25  # SGLang sizes its state pool apart from the KV pool
# flashstate under a physical limit (no --kv-cache-memory-bytes on a GPU: the budget is what the weights
# leave): its checkpoint slots are allocated for at most this share of the shared budget, not the whole of
# it, so the plan accounts 1 / (1 + share) of that memory instead of half. Past it, a checkpoint evicts one
# (the slot pool binds before the bytes). Checkpoints held 8–18% of the budget at the end of the H200 runs
# of 2026-12-04 (benchmarks/RESULTS.md, a real-size model at real lengths).
CARD_CHECKPOINT_SHARE = 0.5


def cache_budget(config: EngineConfig, device: torch.device) -> int:
    """KV + state bytes this device can hold (per rank under tensor parallelism)."""
    if config.kv_cache_memory_bytes is not None:
        return config.kv_cache_memory_bytes
    if device.type == "cuda":
        gc.collect()  # engines closed in this process hand their memory back first
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        return max(int(total * config.gpu_memory_utilization) - used, 0)
    return config.cpu_cache_memory_bytes


@dataclass(frozen=True, slots=True)
class CachePlan:
    """| < working slots: max_num_seqs > | < checkpoint slots > |   | < KV blocks > |
    Working slots hold running sequences' states; checkpoint slots are the prefix cache's. With
    `working_charged` the slots are one pool, each serving either while the charge allows."""

    num_blocks: int
    block_size: int
    num_slots: int
    num_working_slots: int
    bytes_per_block: int
    bytes_per_slot: int
    # vllm policy: pages of the emulated vLLM pool (cache/vllm_pages.py) the budget buys; the physical
    # blocks and slots above are then over-provisioned so that they never bind before the emulated pool.
    num_pages: int | None = None
    # Shared budget: KV blocks in use plus checkpoint slots (held or being exported) are charged against
    # these bytes, so the cache manager trades one for the other. Physically each pool could take the
    # whole of it (blocks and slots over-provisioned; the charge binds first), but for the checkpoint
    # slots under a physical limit (CARD_CHECKPOINT_SHARE of it: there the slot pool may bind first).
    shared_bytes: int | None = None
    # The working slots a request holds are charged to the shared budget too (an explicit budget, where the
    # pools are over-provisioned): the memory of the idle ones holds KV blocks and checkpoints. Otherwise
    # (a physical limit, or --reserve-working-slots) the working slots are reserved apart from it.
    working_charged: bool = False

    @property
    def max_checkpoints(self) -> int:
        """Slots the prefix cache may hold as checkpoints: those beside the working ones, or every slot where
        the working ones are charged (the charge binds first)."""
        return self.num_slots if self.working_charged else self.num_slots - self.num_working_slots

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def state_bytes(self) -> int:
        return self.num_slots * self.bytes_per_slot

    @property
    def physical_bytes(self) -> int:
        return self.kv_bytes + self.state_bytes

    def describe(self) -> str:
        mib = 1 << 20
        checkpoints = self.max_checkpoints
        if self.shared_bytes is not None and self.working_charged:
            return (
                f"cache: one shared budget of {self.shared_bytes / mib:.1f} MiB for the working states of "
                f"the running requests (up to {self.num_working_slots}, {self.bytes_per_slot / mib:.2f} MiB "
                f"each), KV blocks ({self.block_size} tokens, {self.bytes_per_block / mib:.2f} MiB each, "
                f"up to {self.num_blocks}) and checkpoints (up to {checkpoints})"
            )
        if self.shared_bytes is not None:
            return (
                f"cache: {self.num_working_slots} working state slots "
                f"({self.num_working_slots * self.bytes_per_slot / mib:.1f} MiB), then one shared budget of "
                f"{self.shared_bytes / mib:.1f} MiB for KV blocks ({self.block_size} tokens, "
                f"{self.bytes_per_block / mib:.2f} MiB each, up to {self.num_blocks}) and checkpoints "
                f"({self.bytes_per_slot / mib:.2f} MiB each, up to {checkpoints})"
            )
        return (
            f"KV cache: {self.num_blocks} blocks × {self.block_size} tokens "
            f"({self.num_blocks * self.block_size} tokens, {self.kv_bytes / mib:.1f} MiB); "
            f"state pool: {self.num_slots} slots ({self.num_working_slots} working, "
            f"{checkpoints} checkpoints, {self.state_bytes / mib:.1f} MiB)"
            + ("" if self.num_pages is None else f"; emulated vLLM pool: {self.num_pages} pages (binding)")
        )


def plan_cache(
    spec: ModelSpec, config: EngineConfig, dtype: torch.dtype, budget_bytes: int, physical_limit: bool = False
) -> CachePlan:
    """The plan whose accounted budget is `budget_bytes`; with `physical_limit` (the budget is the memory
    the device has left), the largest plan whose over-provisioned pools still fit in it."""
    accounted = budget_bytes
    plan = _plan(spec, config, dtype, accounted, physical_limit)
    while physical_limit and plan.physical_bytes > budget_bytes:
        accounted = accounted * budget_bytes // plan.physical_bytes
        plan = _plan(spec, config, dtype, accounted, physical_limit)
    return plan


def _plan(
    spec: ModelSpec, config: EngineConfig, dtype: torch.dtype, budget_bytes: int, physical_limit: bool = False
) -> CachePlan:
    # KV blocks in the kv dtype (--kv-cache-dtype fp8: half of bf16's bytes), states in the model's
    block = max(kv_bytes_per_block(spec, config.block_size, kv_dtype(config.kv_cache_dtype, dtype)), 1)
    slot = max(state_bytes_per_slot(spec, dtype), 1)
    working = config.max_num_seqs
    hybrid = bool(spec.attention_layer_ids and spec.linear_layer_ids)
    if config.prefix_caching and config.cache_policy == "vllm" and hybrid:
        return _plan_vllm(spec, config, dtype, budget_bytes, block, slot)
    shared = config.shared_cache_budget
    if shared and not physical_limit and not config.reserve_working_slots:
        # each pool over-provisioned to the whole budget (every slot in use is charged, so no more slots
        # than the budget buys); the charge binds
        if budget_bytes < slot + block:
            raise ValueError(
                f"cache budget of {budget_bytes / (1 << 20):.1f} MiB cannot hold one working state ({slot} "
                f"bytes) and one KV block ({block} bytes): raise kv_cache_memory_bytes"
            )
        return CachePlan(budget_bytes // block, config.block_size, budget_bytes // slot, working, block, slot,
                         shared_bytes=budget_bytes, working_charged=True)  # fmt: skip
    left = budget_bytes - working * slot
    if left < block:
        raise ValueError(
            f"cache budget of {budget_bytes / (1 << 20):.1f} MiB cannot hold {working} working states "
            f"({slot} bytes each) plus one KV block ({block} bytes): raise kv_cache_memory_bytes "
            f"or lower max_num_seqs"
        )
    fraction = config.state_cache_fraction
    if shared:
        checkpoints = left // slot
        if physical_limit:
            checkpoints = min(checkpoints, max(int(left * CARD_CHECKPOINT_SHARE) // slot, 1))
        return CachePlan(left // block, config.block_size, working + checkpoints, working, block, slot,
                         shared_bytes=left)  # fmt: skip
    if fraction is None:
        fraction = SGLANG_STATE_FRACTION
    checkpoints = int(left * fraction) // slot if config.prefix_caching else 0
    num_blocks = (left - checkpoints * slot) // block
    if num_blocks < 1:
        raise ValueError(
            f"a state_cache_fraction of {fraction} leaves no KV block in the cache budget of "
            f"{budget_bytes / (1 << 20):.1f} MiB: lower it or raise kv_cache_memory_bytes"
        )
    return CachePlan(num_blocks, config.block_size, working + checkpoints, working, block, slot)


def _plan_vllm(
    spec: ModelSpec, config: EngineConfig, dtype: torch.dtype, budget_bytes: int, block: int, slot: int
) -> CachePlan:
    """The budget buys vLLM's page pool, which alone decides what the cache keeps. Physically this baseline
    is over-provisioned: blocks for twice the tokens all pages could hold as attention blocks (the tree
    may keep the KV under a state whose attention pages vLLM already evicted), and a checkpoint slot for
    every state the pages could hold, plus one in-flight export per running sequence."""
    geo = vllm_geometry(config, spec, dtype)
    pages = geo.num_pages(budget_bytes)
    if pages < 2:
        raise ValueError(
            f"cache budget of {budget_bytes} bytes buys {pages} vLLM pages of {geo.page_bytes} bytes; "
            f"the vllm policy needs at least 2: raise kv_cache_memory_bytes"
        )
    num_blocks = 2 * pages * -(-geo.block // config.block_size) + config.max_num_seqs
    checkpoints = pages // max(geo.num_state_groups, 1) + config.max_num_seqs
    working = config.max_num_seqs
    return CachePlan(num_blocks, config.block_size, working + checkpoints, working, block, slot, pages)


def vllm_page_pool(
    plan: CachePlan, config: EngineConfig, spec: ModelSpec, dtype: torch.dtype
) -> VllmPagePool | None:
    """The `vllm` policy's emulated vLLM page pool, of the pages the plan's budget buys; None for the
    other policies."""
    if plan.num_pages is None:
        return None
    geo = vllm_geometry(config, spec, dtype)
    return VllmPagePool(plan.num_pages, geo.block, geo.num_state_groups, config.max_num_batched_tokens)
