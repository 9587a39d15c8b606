"""Python's cyclic garbage collector in a long-running process: its pauses, and a set-up keeping them short.

A collection runs in whichever thread allocates past a threshold and holds the GIL throughout: a full
(generation 2) collection walks every tracked container object, ~140 ms for the ~240k objects of a
headline-sized simulator run, a stall for the engine's step or for a client's clock. `for_serving()`
collects once, moves every object alive after start-up (the model, the workload) to the permanent
generation, which collections never walk, and raises the young generation's threshold so fewer
short-lived objects are promoted. `GcPauses` counts the collections and their time per generation."""

from __future__ import annotations

import gc
import time

from flashstate import envs
from flashstate.diagnostics.gc_census import GcCensus

# Python's default is 2,000 (3.13) or 700 (3.12 and before). A young collection walks every element of the
# young lists (a prompt's token ids among them). At 50,000 the H200 headline's server paused 27 times in 270
# s, 180 ms on average, while every host restore left a reference cycle holding its fetched tensors (~43k
# young tensors a collection, gc_census.py); without those cycles, twice (docs/history/benchmarks-2026-11.md).
# In the simulator, the interpreter's default spent 4x the collector time with twice the pauses over 50 ms
# (benchmarks/gc_pauses.py).
GEN0_THRESHOLD = 50_000


def for_serving() -> int:
    """Collect, freeze what is alive, raise the generation-0 threshold, and count the pauses from here on
    (`serving_pauses`); returns the objects frozen."""
    global _serving
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    if _serving is None:
        _serving = GcPauses(census=envs.FLASHSTATE_GC_CENSUS).install()
    return gc.get_freeze_count()


def serving_pauses() -> GcPauses | None:
    """The pauses counted since `for_serving` (None: never called in this process)."""
    return _serving


class GcPauses:
    """Per generation: collections, seconds, the longest pause and how many were long (from `gc.callbacks`,
    while installed)."""

    LONG = 0.05  # a pause this long counts as long

    def __init__(self, census: bool = False) -> None:
        self.census = GcCensus() if census else None
        self.count = [0, 0, 0]
        self.long = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self.collected = [0, 0, 0]  # unreachable objects freed: cyclic garbage, not growth
        self._start = 0.0

    def install(self) -> GcPauses:
        gc.callbacks.append(self._on_gc)
        return self

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            if self.census is not None and info["generation"] < 2:
                self.census.take(info["generation"])
            self._start = time.perf_counter()
            return
        g, pause = info["generation"], time.perf_counter() - self._start
        self.count[g] += 1
        self.collected[g] += info["collected"]
        self.seconds[g] += pause
        self.longest[g] = max(self.longest[g], pause)
        self.long[g] += pause >= self.LONG

    def describe(self) -> str:
        return ", ".join(
            f"gen{g} {self.count[g]} × {1e3 * self.seconds[g] / max(self.count[g], 1):.2f} ms "
            f"(longest {1e3 * self.longest[g]:.1f} ms, {self.long[g]} over {1e3 * self.LONG:.0f} ms, "
            f"{self.collected[g]} objects collected)"
            for g in range(3)
        )


_serving: GcPauses | None = None
