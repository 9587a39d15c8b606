"""A restore from the host tier in flight: the store read + verify runs on the tier's fetch thread while
the engine keeps stepping other sequences; then the host → device copies are issued (CUDA: on a side
stream, an event marks when they have landed; CPU: at once) and the sequence continues from the host
depth.

    | < shared: first_chunk * C tokens, KV blocks from the GPU tree > | < restored: chunks, tail, state > |
    0                                                                                             hit.depth
Phases: FETCHING (the future is pending) → COPYING (the event is pending; CUDA only) → READY; or FAILED
(an object missing or corrupt, or the store unreachable): nothing was copied, the sequence starts over.
The sequence owns `blocks` and `slot` throughout; `cancel` (abort) waits for copies already issued.
"""

from __future__ import annotations

import enum
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from flashstate.cache.host.index import HostHit
    from flashstate.cache.host.tier import HostTier


class RestorePhase(enum.Enum):
    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"


@dataclass(eq=False, slots=True)
class HostRestore:
    tier: HostTier
    hit: HostHit
    first_chunk: int  # chunks [0, first_chunk) are shared from the GPU tree, not fetched
    kv_depth: int  # how far the prompt follows cached KV (GPU tree or host state): for the export plan
    blocks: list[int]  # the sequence's block table: ceil(hit.depth / B) blocks
    slot: int
    future: Future
    event: torch.cuda.Event | None = None
    # Fetched objects, kept alive until the copies out of them have landed.
    objects: list[list[torch.Tensor]] | None = field(default=None, repr=False)
    copied: bool = False

    @property
    def depth(self) -> int:
        return self.hit.depth

    def poll(self) -> RestorePhase:
        """Engine thread: advance the restore as far as it can go without waiting."""
        if not self.copied:
            if not self.future.done():
                return RestorePhase.PENDING
            objects = self.future.result()
            if objects is None:
                return RestorePhase.FAILED
            self.objects, self.copied = objects, True
            self.event = self.tier.load(self.hit, objects, self.blocks, self.slot, self.first_chunk)
        if self.event is not None and not self.event.query():
            return RestorePhase.PENDING
        self.objects, self.event = None, None
        return RestorePhase.READY

    def wait(self, timeout: float) -> None:
        """Block until the current phase may have moved on (at most `timeout` seconds while fetching)."""
        if not self.copied:
            wait([self.future], timeout)
        elif self.event is not None:
            self.event.synchronize()

    def cancel(self) -> None:
        """The sequence is aborted: once this returns, nothing writes into its blocks or slot."""
        self.future.cancel()  # a fetch already running finishes on its own; its objects are dropped
        if self.event is not None:
            self.event.synchronize()
        self.objects, self.event = None, None


def wait_any(restores: list[HostRestore], timeout: float) -> None:
    """Block until one of `restores` may be ready (the engine has nothing else to run)."""
    copying = [r for r in restores if r.copied]
    if copying:
        copying[0].wait(timeout)
    elif restores:
        wait([r.future for r in restores], timeout, FIRST_COMPLETED)
