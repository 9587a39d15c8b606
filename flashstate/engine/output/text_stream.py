"""TextStream: a request's output text, detokenised when someone reads it rather than in the step loop.

A request whose stop decision needs no text (no stop strings: eos, stop token ids and max_tokens are
decided on token ids) gets one. The engine registers each output it emits; reading an output's text feeds
the request's StopChecker the generated tokens up to that output, in order, exactly as the step loop used
to, so deltas, held-back text and the final flush are the same:

    tokens: | < prompt > | < fed to the checker > | < emitted, not yet read > | < not yet emitted > |
            0            start                    fed                                             len
    text:   | < released through the last passed output > |

Outputs are passed in the order they were registered; reading one passes every earlier one too (a
consumer that only reads the final output, like `LLM.generate`, still gets the same text). Thread-safe:
the engine thread registers while a server thread reads.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Protocol

from flashstate.engine.output.stop_checker import StopChecker


class _Resolvable(Protocol):
    _end: int
    _stream: TextStream | None

    def _set_text(self, stream: TextStream, start: int, end: int) -> None: ...


class TextStream:
    def __init__(self, checker: StopChecker, tokens: list[int], start: int):
        """`tokens`: the sequence's token list (only ever appended to); generated tokens start at `start`."""
        self._checker = checker
        self._tokens = tokens
        self._fed = start
        self.text = ""  # released so far
        self._pending: deque[_Resolvable] = deque()
        self._lock = threading.Lock()

    def register(self, output: _Resolvable) -> None:
        """An output covering the generated tokens before `output._end` was emitted (engine side)."""
        with self._lock:
            self._pending.append(output)

    def resolve(self, output: _Resolvable) -> None:
        """Pass every pending output up to and including `output` (each gets its text span set)."""
        with self._lock:
            if output._stream is None:  # passed already (read from another thread)
                return
            while self._pending:
                head = self._pending.popleft()
                before = len(self.text)
                parts = [self.text]
                while self._fed < head._end:
                    parts.append(self._checker.append(self._tokens[self._fed]))
                    self._fed += 1
                self.text = "".join(parts)
                head._set_text(self, before, len(self.text))
                if head is output:
                    return
