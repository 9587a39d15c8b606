"""Child processes that die with their parent, whatever signal ends it.

Three pieces, for the processes flashstate starts (bench servers, tensor-parallel workers):

- `die_with_parent(sig, parent_pid)`, called in the child: Linux's PR_SET_PDEATHSIG, so the kernel sends
  `sig` to the child when its parent goes, SIGKILL included. The kernel ties it to the parent *thread*
  that forked the child, so a child must be started from a thread that lives as long as the process:
- `in_lasting_thread(fn)` runs `fn` (a process start) on the main thread or on one daemon thread kept for
  the process's life, never on a short-lived thread that would take its children with it when it ends.
- `terminate_on_signals()`, in the parent: SIGTERM (and SIGHUP) raise `Terminated` in the main thread, as
  SIGINT raises KeyboardInterrupt, so the `finally` blocks that stop children run before the exit.

Elsewhere than Linux `die_with_parent` does nothing; the signal handlers still apply.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved once in the parent: a preexec_fn in a forked child then makes one foreign call, no lookup.
_prctl = _load_prctl()


def die_with_parent(sig: int = signal.SIGKILL, parent_pid: int | None = None) -> bool:
    """Ask the kernel to send `sig` to this process when its parent exits. If `parent_pid` is given and
    this process's parent is already another one (the parent died before the request), `sig` is sent to
    this process now. False where the platform has no such request."""
    if _prctl is None or _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)
    return True


def preexec_die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `subprocess.Popen(preexec_fn=...)` that makes the child die with this process."""
    parent = os.getpid()
    return lambda: die_with_parent(sig, parent)


class _Starter:
    """One daemon thread for the process's life; it runs the calls handed to it, in order."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="flashstate-child-starter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            fn, done, box = self._calls.get()
            try:
                box.append((True, fn()))
            except BaseException as e:  # noqa: BLE001 — raised again in the caller's thread
                box.append((False, e))
            done.set()

    def call(self, fn: Callable[[], T]) -> T:
        done, box = threading.Event(), []
        self._calls.put((fn, done, box))
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value


_starter: _Starter | None = None
_starter_lock = threading.Lock()


def in_lasting_thread(fn: Callable[[], T]) -> T:
    """`fn()` on a thread that lives as long as this process: this one if it is the main thread (or the
    starter thread itself), else the starter thread. Start child processes through it."""
    global _starter
    if threading.current_thread() is threading.main_thread():
        return fn()
    with _starter_lock:
        if _starter is None:
            _starter = _Starter()
    if threading.current_thread() is _starter._thread:
        return fn()
    return _starter.call(fn)


def spawn_child(cmd: list[str], log: IO[str]) -> subprocess.Popen:
    """`cmd` as a child that cannot outlive this process: its own session (so its whole group can be
    signalled), SIGTERM from the kernel when this process ends, started from a lasting thread; stdout and
    stderr to `log`."""
    return in_lasting_thread(
        lambda: subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec_die_with_parent(signal.SIGTERM),
        )
    )


class Terminated(BaseException):  # noqa: N818 — named like KeyboardInterrupt, its sibling
    """Raised in the main thread when the process is asked to stop (SIGTERM, SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def terminate_on_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, the first of `signums` raises `Terminated` in the main thread (later ones are
    ignored, so the clean-up it starts is not cut short); the previous handlers come back after. Outside
    the main thread this does nothing (Python runs signal handlers there only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, _frame):
        if raised:
            return
        raised.append(signum)
        raise Terminated(signum)

    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
