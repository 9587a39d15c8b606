"""Work that shares one CPU in simulated time (processor sharing): while k items are unfinished, each
progresses at 1/k of the clock's rate, and one submitted alone takes its own length.

The server renders each chat request's template and splices its prompt in a thread of its own
(`asyncio.to_thread`), and those threads share one interpreter lock: chat prompts that arrive together are
prepared together, each slower. On the two chat card runs the part of a request's overhead beyond the
profile's price correlates 0.57 and 0.41 with this sharing of the per-token part (0.36 and 0.32 with a queue
served one at a time); on six token-mode runs 0.02–0.18, which sim/replay.py leaves unshared
(`benchmarks/overhead_sharing.py`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from flashstate.sim.events import EventLoop

# an item whose work left is within this of the least is done with it (the float sums of a shared clock)
_EPS_S = 1e-12


class SharedCPU:
    def __init__(self, loop: EventLoop):
        self.loop = loop
        self._left: dict[int, float] = {}  # item -> seconds of its own work left, as of self._t
        self._done: dict[int, Callable[[], None]] = {}
        self._t = loop.now
        self._ids = itertools.count()
        self._version = 0  # the one scheduled finish that is still current

    @property
    def busy(self) -> int:
        """Items unfinished."""
        return len(self._left)

    def submit(self, work_s: float, done: Callable[[], None]) -> None:
        """Run `work_s` seconds of work beside what is running; `done()` when it is finished (at once for
        none)."""
        if work_s <= 0:
            done()
            return
        self._advance()
        item = next(self._ids)
        self._left[item], self._done[item] = work_s, done
        self._schedule()

    def _advance(self) -> None:
        now = self.loop.now
        if self._left and now > self._t:
            share = (now - self._t) / len(self._left)
            for item in self._left:
                self._left[item] -= share
        self._t = now

    def _schedule(self) -> None:
        self._version += 1
        if not self._left:
            return
        version = self._version
        least = max(min(self._left.values()), 0.0)
        self.loop.at(self.loop.now + least * len(self._left), lambda: self._finish(version))

    def _finish(self, version: int) -> None:
        if version != self._version:  # an item submitted since moved the finish
            return
        self._advance()
        least = min(self._left.values())
        finished = [item for item, left in self._left.items() if left <= least + _EPS_S]
        callbacks = [self._done.pop(item) for item in finished]
        for item in finished:
            del self._left[item]
        self._schedule()
        for done in callbacks:
            done()
