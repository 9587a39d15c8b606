"""StackSampler: where one thread spends its wall time, from its Python stack sampled every `interval`
seconds by a daemon thread (a poor man's py-spy, for machines without one). The AsyncEngine samples its
engine thread when FLASHSTATE_STACK_SAMPLE=PATH is set, and writes the report to PATH when it stops (`%p`
in PATH: the process id, for several servers started with one environment).

    sampler = StackSampler(thread_id).start()
    …
    sampler.stop()
    sampler.report(title)   # text: per function, the share of samples it was on the stack (inclusive)
                            # and innermost (self), functions as file:function

A sample needs the GIL, so a thread in C code that holds it is seen once that code returns: shares are
a guide to where the time goes, not a timer.
"""

from __future__ import annotations

import collections
import sys
import sysconfig
import threading
import time
from pathlib import Path


class StackSampler:
    def __init__(self, thread_id: int, interval: float = 0.002):
        self.thread_id = thread_id
        self.interval = interval
        self.samples = 0
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.innermost: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flashstate-stack-sampler", daemon=True)

    def start(self) -> StackSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            self.samples += 1
            seen = set()
            first = True
            while frame is not None:
                code = frame.f_code
                name = f"{_short(code.co_filename)}:{code.co_name}"
                if first:
                    self.innermost[f"{name}:{frame.f_lineno}"] += 1
                    first = False
                if name not in seen:
                    seen.add(name)
                    self.inclusive[name] += 1
                frame = frame.f_back

    def report(self, title: str = "", top: int = 60) -> str:
        n = max(self.samples, 1)
        lines = [f"{title}{': ' if title else ''}{self.samples} samples every {1e3 * self.interval:.0f} ms "
                 f"({time.strftime('%F %T')})", ""]  # fmt: skip
        lines.append("on the stack (inclusive):")
        lines += [f"{100 * c / n:6.1f}%  {name}" for name, c in self.inclusive.most_common(top)]
        lines += ["", "innermost (self, with line):"]
        lines += [f"{100 * c / n:6.1f}%  {name}" for name, c in self.innermost.most_common(top)]
        return "\n".join(lines) + "\n"


def _forms(path: Path) -> set[str]:
    return {str(path).replace("\\", "/").rstrip("/"), str(path.resolve()).replace("\\", "/").rstrip("/")}


# This package's own folder, from this module's file (never from the checkout's folder name), and the
# interpreter's library folders, longest first: a source path is shown relative to them.
_PACKAGE_NAME = __name__.partition(".")[0]
_PACKAGE_DIRS = _forms(Path(__file__).parents[1])
_LIBRARY_DIRS = sorted(
    {f for k, v in sysconfig.get_paths().items() if k.endswith(("stdlib", "lib")) for f in _forms(Path(v))},
    key=len,
    reverse=True,
)


def _short(path: str) -> str:
    """A source path from its package on (flashstate/…, torch/…, asyncio/…), else its file name."""
    path = path.replace("\\", "/")
    for root in _PACKAGE_DIRS:
        if path.startswith(root + "/"):
            return f"{_PACKAGE_NAME}/{path[len(root) + 1 :]}"
    for root in _LIBRARY_DIRS:
        if path.startswith(root + "/"):
            return path[len(root) + 1 :]
    return path.rpartition("/")[2]
