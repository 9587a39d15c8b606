"""The host tier an EngineConfig asks for."""

from __future__ import annotations

import torch

from flashstate import envs
from flashstate.cache.cache_tensors import CacheTensors
from flashstate.cache.cost import PrefillCost
from flashstate.cache.host.arena import HostArena
from flashstate.cache.host.codec import object_size
from flashstate.cache.host.layout import HostLayout, model_fingerprint
from flashstate.cache.host.store import HostStore, MemoryStore, StoreUnavailableError
from flashstate.cache.host.tier import HostTier
from flashstate.cache.host.transfer import StateTransfer
from flashstate.config import EngineConfig

DEFAULT_HOST_CACHE_BYTES = 4 << 30
# The Mooncake master starts evicting at 90% of the pool; the tier keeps below that.
MOONCAKE_FILL = 0.85
STAGING_BYTES = 4 << 30  # restores in flight from a store with pageable reads; a larger one copies directly


def chunk_tokens(block_size: int, target: int) -> int:
    """`target` tokens rounded down to whole KV blocks, at least one block."""
    return max(target // block_size, 1) * block_size


def host_capacity(config: EngineConfig) -> tuple[int, int]:
    """(the store's size, what the tier may fill of it): the Mooncake master evicts on its own near full."""
    capacity = config.host_cache_bytes or DEFAULT_HOST_CACHE_BYTES
    return capacity, int(capacity * MOONCAKE_FILL) if config.host_tier == "mooncake" else capacity


def host_secret(config: EngineConfig) -> bytes | None:
    """The deployment secret: the contents of host_cache_secret_file (trailing newlines dropped), else the
    environment's FLASHSTATE_HOST_CACHE_SECRET, else None. ValueError for an empty one."""
    if config.host_cache_secret_file is not None:
        with open(config.host_cache_secret_file, "rb") as f:
            secret = f.read().rstrip(b"\r\n")
        where = config.host_cache_secret_file
    else:
        secret = (envs.FLASHSTATE_HOST_CACHE_SECRET or "").encode() or None
        where = "FLASHSTATE_HOST_CACHE_SECRET"
        if secret is None:
            return None
    if not secret:
        raise ValueError(f"the host cache secret in {where} is empty")
    return secret


def build_host_tier(
    config: EngineConfig, model: torch.nn.Module, caches: CacheTensors, cost: PrefillCost
) -> HostTier | None:
    kind = config.host_tier
    if kind is None:
        return None
    secret = host_secret(config)  # before any memory is locked or a store joined: a bad file fails first
    spec = model.spec
    dtype = next(model.parameters()).dtype
    chunk = chunk_tokens(config.block_size, config.host_chunk_tokens)
    transfer = StateTransfer(caches, config.block_size)
    shapes = [str(s) for s in transfer.state_specs(1)]
    layout = HostLayout(model_fingerprint(model, spec, dtype, config.block_size, chunk, shapes), chunk)
    capacity, usable = host_capacity(config)
    cuda = transfer.device.type == "cuda"
    store: HostStore
    if kind == "memory":
        store = MemoryStore(capacity, pin=cuda)
    else:
        from flashstate.cache.host.mooncake import MooncakeStore

        largest = max(
            object_size(layout.chunk_key(layout.root), transfer.kv_specs(chunk)),
            object_size(layout.chunk_key(layout.root), transfer.state_specs(chunk)),
        )
        buffer = max(2 * largest, 16 << 20)
        store = MooncakeStore(
            config.mooncake_master,
            capacity,
            local_buffer_bytes=buffer,
            connect=False,
            timeout=config.host_cache_timeout,
        )
    # Mooncake's reads are pageable bytes: on CUDA a restore's objects pass through page-locked staging.
    staging = HostArena(min(capacity, STAGING_BYTES), pin=True) if cuda and kind == "mooncake" else None
    tier = HostTier(
        store,
        transfer,
        layout,
        cost,
        usable,
        pin=cuda,
        staging=staging,
        inline_fetch=config.host_inline,
        secret=secret,
        prefetch=config.host_prefetch,
    )
    if kind == "mooncake":
        try:
            store.connect(wait=config.host_cache_timeout)  # a hung master does not hold up start-up
        except StoreUnavailableError as e:  # serve on the GPU cache alone; the tier joins when it answers
            tier.mark_unavailable(e)
    return tier
