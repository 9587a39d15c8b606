"""A minimal discrete-event core: a clock, an event heap, and processes written as generators.

A process yields what it waits for and is resumed with its result:

    yield Sleep(seconds)          → None, `seconds` later
    yield Join([proc, ...])       → [each process's return value], when all have returned
    yield Wait()                  → whatever `resume(proc, value)` is later called with

Events at the same time run in the order they were scheduled, so a run is deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Sleep:
    seconds: float


@dataclass(slots=True)
class Join:
    procs: list[Process]


@dataclass(slots=True)
class Wait:
    pass


@dataclass(eq=False, slots=True)
class Process:
    gen: Generator[Any, Any, Any]
    done: bool = False
    result: Any = None
    waiters: list[Callable[[], None]] = field(default_factory=list)


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.halted = False  # processes are no longer resumed (plain events still run)

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._order), fn))

    def next_time(self) -> float:
        """When the next scheduled event runs (inf: none)."""
        return self._heap[0][0] if self._heap else float("inf")

    def spawn(self, gen: Generator[Any, Any, Any]) -> Process:
        proc = Process(gen)
        self.resume(proc, None)
        return proc

    def resume(self, proc: Process, value: Any) -> None:
        if self.halted or proc.done:
            return
        try:
            cmd = proc.gen.send(value)
        except StopIteration as stop:
            proc.done, proc.result = True, stop.value
            for w in proc.waiters:
                w()
            return
        if isinstance(cmd, Sleep):
            self.at(self.now + max(cmd.seconds, 0.0), lambda: self.resume(proc, None))
        elif isinstance(cmd, Join):
            self._join(proc, cmd.procs)
        elif not isinstance(cmd, Wait):
            raise TypeError(f"a process yielded {cmd!r}")

    def _join(self, proc: Process, procs: list[Process]) -> None:
        left = [p for p in procs if not p.done]
        if not left:
            self.resume(proc, [p.result for p in procs])
            return
        count = [len(left)]

        def one_done() -> None:
            count[0] -= 1
            if count[0] == 0:
                self.resume(proc, [p.result for p in procs])

        for p in left:
            p.waiters.append(one_done)

    def run(self, until: Callable[[], float | None]) -> None:
        """Run events in time order while the heap holds some before `until()` (None: no limit)."""
        while self._heap:
            limit = until()
            if limit is not None and self._heap[0][0] > limit:
                self.now = max(self.now, limit)
                return
            t, _, fn = heapq.heappop(self._heap)
            self.now = t
            fn()
