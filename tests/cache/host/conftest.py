import uuid

import pytest
import torch

from flashstate.cache.cache_tensors import CacheTensors
from flashstate.cache.cost import PrefillCost
from flashstate.cache.host.layout import HostLayout
from flashstate.cache.host.store import MemoryStore
from flashstate.cache.host.tier import HostTier
from flashstate.cache.host.transfer import StateTransfer

BLOCK = 4
CHUNK = 8


def make_caches(num_blocks: int = 64, num_slots: int = 8, seed: int = 0) -> CacheTensors:
    """Two attention layers, one linear layer, random contents (the last block and slot are the pad rows)."""
    g = torch.Generator().manual_seed(seed)
    kv = [
        (torch.randn(num_blocks, BLOCK, 2, 3, generator=g), torch.randn(num_blocks, BLOCK, 2, 5, generator=g))
        for _ in range(2)
    ]
    states = [(torch.randn(num_slots, 6, 3, generator=g), torch.randn(num_slots, 2, 3, 3, generator=g))]
    return CacheTensors(kv, states, pad_block=num_blocks - 1, pad_slot=num_slots - 1)


def make_tier(
    store,
    caches: CacheTensors,
    capacity: int | None = None,
    retry: float = 0.1,
    staging=None,
    secret: bytes | None = None,
    fingerprint: str | None = None,
    prefetch: bool = False,
) -> HostTier:
    layout = HostLayout(fingerprint or f"test-{uuid.uuid4().hex[:8]}", CHUNK)
    cost = PrefillCost(1e-5, 1e-8)
    inline = prefetch and isinstance(store, MemoryStore)  # the engine's rule: in-process stores read inline
    transfer = StateTransfer(caches, BLOCK)
    return HostTier(
        store, transfer, layout, cost, capacity, retry, staging=staging, secret=secret, inline_fetch=inline,
        prefetch=prefetch,
    )  # fmt: skip


@pytest.fixture(params=["memory", "mooncake"])
def new_store(request):
    """make(capacity) → a fresh store of the parameter's kind (mooncake: a client of the session's master)."""
    from flashstate.cache.host.mooncake import MooncakeStore

    stores = []

    def make(capacity: int = 16 << 20):
        if request.param == "memory":
            store = MemoryStore(capacity)
        else:
            store = MooncakeStore(request.getfixturevalue("mooncake_master").address, capacity)
        stores.append(store)
        return store

    yield make
    for s in stores:
        s.close()
