"""CPU seconds of each thread of this process (Linux, /proc/self/task), by name: a Python thread's, a
native thread's under its kernel name. Under one GIL the Python threads' interpreter time is serialised
with the engine thread's, so `flashstate serve` logs this at shutdown: what the engine thread shared the
interpreter with (an empty dict where /proc is missing)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def thread_cpu_seconds() -> dict[str, float]:
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    names = {t.native_id: t.name for t in threading.enumerate()}
    seconds: dict[str, float] = {}
    for task in Path("/proc/self/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        comm, _, rest = stat.partition(" (")[2].rpartition(") ")
        fields = rest.split()  # from field 3 (state) on: utime and stime are fields 14 and 15
        name = names.get(int(task.name), comm)
        seconds[name] = seconds.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return seconds


def describe(seconds: dict[str, float], top: int = 8) -> str:
    """'name 12.3 s, …' for the `top` busiest threads and the rest summed."""
    ranked = sorted(seconds.items(), key=lambda kv: -kv[1])
    parts = [f"{name} {s:.1f} s" for name, s in ranked[:top]]
    if len(ranked) > top:
        parts.append(f"{len(ranked) - top} others {sum(s for _, s in ranked[top:]):.1f} s")
    return ", ".join(parts)
