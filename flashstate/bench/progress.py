"""A one-line progress bar on stderr while a replay runs (redrawn in place on a terminal, a line every
tenth of the run otherwise)."""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(
        self, total_s: float, warmup_s: float, label: str = "", stream: TextIO | None = None, width: int = 24
    ):
        self.total_s, self.warmup_s, self.label, self.width = total_s, warmup_s, label, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self._last_decile = -1

    def line(
        self, elapsed: float, requests: int, active: int, completed: int, errors: int, hit_rate: float | None
    ) -> str:
        frac = min(1.0, elapsed / self.total_s) if self.total_s > 0 else 1.0
        filled = round(frac * self.width)
        phase = "warm-up" if elapsed < self.warmup_s else "measure"
        hit = "-" if hit_rate is None else f"{hit_rate:.0%}"
        return (
            f"{self.label}[{'#' * filled}{'.' * (self.width - filled)}] {elapsed:5.0f}/{self.total_s:.0f}s "
            f"{phase} | req {requests} | agents {active} active, {completed} done | hit {hit} | err {errors}"
        )

    def update(self, elapsed: float, **counts) -> None:
        text = self.line(elapsed, **counts)
        if self.tty:
            self.stream.write("\r" + text)
            self.stream.flush()
            return
        decile = int(10 * min(1.0, elapsed / self.total_s)) if self.total_s > 0 else 10
        if decile != self._last_decile:
            self._last_decile = decile
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
