"""Triton kernels compiled while serving. A kernel variant first met inside a step (another specialization of
its integer arguments, an autotuning key not tuned yet) is compiled in that step: seconds on a machine with no
Triton cache, a stall for every request in the batch. The start-up warm-up is meant to compile them all;
`CompileWatch` (installed after it) names each one it missed.

    watch = CompileWatch().install()   # False where Triton (or its runtime hooks) is missing
    ...
    watch.describe()                   # "3 kernel variants built while serving (4.2 s): _conv_kernel ×2, ..."
    watch.uninstall()

Through `triton.knobs.runtime`'s JIT hooks (Triton ≥ 3.4): the cache hook runs before a variant is compiled or
loaded from the on-disk cache, the post-compile hook after; hooks already set are chained, never replaced.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

logger = logging.getLogger("flashstate.ops")


class CompileWatch:
    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()  # kernel name → variants compiled
        self.seconds = 0.0
        self._runtime = None
        self._previous: tuple = (None, None)
        self._started = threading.local()

    def install(self) -> bool:
        try:
            from triton import knobs
        except ImportError:
            return False
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_cache_hook"):
            return False
        self._runtime = runtime
        self._previous = (runtime.jit_cache_hook, getattr(runtime, "jit_post_compile_hook", None))
        runtime.jit_cache_hook = self._before
        runtime.jit_post_compile_hook = self._after
        return True

    @property
    def installed(self) -> bool:
        return self._runtime is not None

    def uninstall(self) -> None:
        if self._runtime is not None:
            self._runtime.jit_cache_hook, self._runtime.jit_post_compile_hook = self._previous
            self._runtime = None

    def _before(self, **kwargs):
        self._started.at = time.perf_counter()
        previous = self._previous[0]
        return previous(**kwargs) if previous is not None else None

    def _after(self, **kwargs):
        started = getattr(self._started, "at", None)
        seconds = time.perf_counter() - started if started is not None else 0.0
        self._started.at = None
        name = str(kwargs.get("repr", "?"))
        self.counts[name.split("[", 1)[0].split("(", 1)[0]] += 1
        self.seconds += seconds
        logger.info("Triton: a kernel variant first built while serving (%.2f s): %s", seconds, name[:400])
        previous = self._previous[1]
        return previous(**kwargs) if previous is not None else None

    def describe(self) -> str:
        n = sum(self.counts.values())
        if not n:
            return "no kernel variant built while serving"
        top = ", ".join(f"{k} ×{c}" for k, c in self.counts.most_common(8))
        return f"{n} kernel variants built while serving ({self.seconds:.1f} s): {top}"
