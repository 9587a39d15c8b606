"""A host hit read ahead while its request waits in the queue: the store read and the checksums run on the
tier's fetch thread when the request is queued, so the step that admits it only copies the objects in
(`load`) instead of reading and verifying them on the engine thread (an inline restore's `start_restore`,
most of a restore's engine-thread time on the in-process store).

A request admitted while its read is running waits for it on the engine thread, which leaves the fetch thread
the interpreter meanwhile, so the rest of the read takes no longer than reading inline would and the request
runs in the step that admits it; a read still queued behind others is dropped and the restore reads inline.

    | < first_chunk * C tokens: KV the GPU tree held when queued, not read > | < read ahead: chunks, state > |
    0                                                                                               hit.depth

The state is pinned in the tier's index from the read's start until a restore takes the prefetch over (the
pin passes to it) or the prefetch is dropped: the request was admitted from a deeper hit, from the GPU, with
no hit, or left the queue. A dropped read already running finishes on its own and unpins in its done
callback, which refers to the tier and the hit, never back to the prefetch or its sequence.

Off by default (`--host-prefetch`): on the H200 (benchmarks/RESULTS.md, 2026-12-05) most host hits were
admitted before their read landed, and while such a request was polled until its read landed it joined a
step later than an inline restore: the runs lost TPM and TTFT p90 to the engine thread's inline reads. The
wait at admission replaces that polling and is not measured on the card yet.

Only the in-process store reads ahead: its reads are views of the store's own arena, so a prefetch holds no
memory of its own. Mooncake's restores are read in the background at admission already, into staging memory
a read ahead would have to share.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flashstate.cache.host.index import HostHit

# Read-aheads in flight or waiting to be taken over, at most: each pins a state against eviction, so a long
# queue of host hits must not pin a large share of the tier; the queue's head is admitted first.
MAX_PREFETCHES = 8


@dataclass(eq=False, slots=True)
class ReadAhead:
    """What a read-ahead read, the tier's and the simulator's (sim/host.py) alike."""

    hit: HostHit
    first_chunk: int  # chunks [0, first_chunk) were left to the GPU tree's KV: not read

    def covers(self, hit: HostHit, first_chunk: int) -> bool:
        """It read what a restore of `hit` from chunk `first_chunk` needs."""
        return hit.key == self.hit.key and first_chunk >= self.first_chunk


@dataclass(eq=False, slots=True)
class HostPrefetch(ReadAhead):
    future: Future  # -> the objects from first_chunk on (chunks, then the state object), or None: a miss
    release: Callable[[HostHit], None]  # the tier's: unpins the state of a read-ahead not taken over
    fetched_at: float | None = None  # time.monotonic() when the read finished (the fetch thread sets it)

    def drop(self) -> None:
        """Not taken over: cancel the read, or let a running one finish; the state is unpinned then."""
        release, hit = self.release, self.hit  # not self: the callback must not refer back to the prefetch
        self.future.cancel()
        self.future.add_done_callback(lambda _: release(hit))
