"""A restore from the host tier in flight: the store read + verify runs on the tier's fetch thread while
the engine keeps stepping other sequences; then the host → device copies are issued (CUDA: on a side
stream, which the engine's stream waits for, so the sequence runs in the very step that issued them; CPU:
at once) and the sequence continues from the host depth.

    | < shared: first_chunk * C tokens, KV blocks from the GPU tree > | < restored: chunks, tail, state > |
    0                                                                                             hit.depth
Phases: FETCHING (the future is pending) → READY (copies issued); or FAILED (an object missing or corrupt,
or the store unreachable): nothing was copied, the sequence starts over. The fetched objects stay referenced
until their copies have landed, and their state pinned against eviction from the start of the fetch
(`Landing`).
The sequence owns `blocks` and `slot` throughout; `cancel` (an abort before READY) drops the fetch.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from flashstate.cache.host.index import HostHit
    from flashstate.cache.host.prefetch import HostPrefetch


class RestoringTier(Protocol):
    """What a restore needs of the tier that started it (HostTier)."""

    landing: Landing

    def unpin(self, hit: HostHit) -> None: ...

    def load(
        self, hit: HostHit, objects: list[list[torch.Tensor]], blocks: list[int], slot: int, first_chunk: int
    ) -> torch.cuda.Event | None: ...


class RestorePhase(enum.Enum):
    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"


@dataclass(eq=False, slots=True)
class HostRestore:
    tier: RestoringTier
    hit: HostHit
    first_chunk: int  # chunks [0, first_chunk) are shared from the GPU tree, not fetched
    kv_depth: int  # how far the prompt follows cached KV (GPU tree or host state): for the export plan
    blocks: list[int]  # the sequence's block table: ceil(hit.depth / B) blocks
    slot: int
    future: Future | None = None  # the fetch (set by the tier once submitted)
    inline: bool = False  # fetched on the engine thread at admission: the sequence joins the admitting step
    fetched_at: float | None = None  # time.monotonic() when the fetch finished (the fetch thread sets it)
    # a read-ahead taken over (prefetch.py): `future` is its read, whose first `skip` objects are chunks the
    # GPU tree has shared since it began
    prefetch: HostPrefetch | None = None
    skip: int = 0

    @property
    def depth(self) -> int:
        return self.hit.depth

    def ready(self) -> bool:
        """The fetch has finished: `poll` would not answer PENDING (reads nothing, issues nothing)."""
        return self.future.done()

    def poll(self) -> RestorePhase:
        """Engine thread: advance the restore as far as it can go without waiting. READY once the copies
        are issued: the engine's current stream waits for them, so whatever it runs next reads the state."""
        if not self.future.done():
            return RestorePhase.PENDING
        objects = self.future.result()
        if self.prefetch is not None:
            self.fetched_at = self.prefetch.fetched_at
        if objects is None:
            self.tier.unpin(self.hit)
            return RestorePhase.FAILED
        objects = objects[self.skip :]
        event = self.tier.load(self.hit, objects, self.blocks, self.slot, self.first_chunk)
        if event is not None:
            event.wait()  # the current stream
        self.tier.landing.hold(self.hit, event, objects)
        return RestorePhase.READY

    def cancel(self) -> None:
        """The sequence is aborted before its copies were issued: a fetch already running finishes on its
        own, and its objects are dropped (its state unpinned once it has)."""
        tier, hit = self.tier, self.hit  # not self: the future must not refer back to the restore
        self.future.cancel()
        self.future.add_done_callback(lambda _: tier.unpin(hit))


def wait_any(restores: list[HostRestore], timeout: float) -> None:
    """Block until one of `restores` may be ready (the engine has nothing else to run)."""
    if restores:
        wait([r.future for r in restores], timeout, FIRST_COMPLETED)


class Landing:
    """Restores whose copies are in flight (CUDA): their fetched objects (staging ranges among them) stay
    referenced, and their states pinned in the index, until the copies have landed."""

    def __init__(self, unpin: Callable[[HostHit], None]):
        self._unpin = unpin
        self._flying: list[tuple[torch.cuda.Event, HostHit, list[list[torch.Tensor]]]] = []

    def hold(self, hit: HostHit, event: torch.cuda.Event | None, objects: list[list[torch.Tensor]]) -> None:
        """`event` marks when the copies out of `objects` have landed (None: they already have)."""
        if event is None:
            self._unpin(hit)
        else:
            self._flying.append((event, hit, objects))

    def prune(self) -> None:
        """Let go of the restores whose copies have landed (engine thread)."""
        flying, self._flying = self._flying, []
        for event, hit, objects in flying:
            if event.query():
                self._unpin(hit)
            else:
                self._flying.append((event, hit, objects))

    def drain(self) -> None:
        """Wait for every copy in flight and let go of all (shutdown)."""
        for event, hit, _ in self._flying:
            event.synchronize()
            self._unpin(hit)
        self._flying.clear()
