"""HostWriter: the host tier's writer thread. Write-backs and removals reach the store in the order they were
queued, off the engine thread; while the tier is unavailable the thread asks it to reconnect every
`retry_seconds` (an outage may be noticed on another thread: a fetch, the start-up).

    writer.write(state, objects, event)   seal (checksum) and put each object once `event` has passed,
                                          then report what was put: `on_written(state, objects, written)`
    writer.remove(key)
    writer.pending                        jobs queued or running
    writer.close()

A StoreUnavailableError from a job goes to `on_unavailable`; any other failure is logged, and the thread
goes on with the next job.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from flashstate.cache.host.codec import ObjectBuilder
from flashstate.cache.host.store import HostStore, StoreUnavailableError

logger = logging.getLogger("flashstate.host")


@dataclass(slots=True)
class _Write:
    state: str
    objects: list[ObjectBuilder]  # new chunks first, the state object last
    event: object | None  # CUDA event after the device → host copies


@dataclass(slots=True)
class _Remove:
    key: str


class HostWriter:
    def __init__(
        self,
        store: HostStore,
        available: Callable[[], bool],
        on_written: Callable[[str, list[ObjectBuilder], list[ObjectBuilder]], None],
        on_unavailable: Callable[[Exception], None],
        reconnect: Callable[[], None],
        retry_seconds: float,
    ):
        self.store = store
        self._available = available
        self._on_written = on_written
        self._on_unavailable = on_unavailable
        self._reconnect = reconnect
        self.retry_seconds = retry_seconds
        self._queue: queue.Queue[_Write | _Remove | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="flashstate-host-writer", daemon=True)
        self._thread.start()

    def write(self, state: str, objects: list[ObjectBuilder], event: object | None) -> None:
        self._queue.put(_Write(state, objects, event))

    def remove(self, key: str) -> None:
        self._queue.put(_Remove(key))

    @property
    def pending(self) -> int:
        return self._queue.unfinished_tasks

    def close(self, timeout: float = 10) -> None:
        self._queue.put(None)
        self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=self.retry_seconds)
            except queue.Empty:
                if not self._available():
                    self._reconnect()
                continue
            try:
                if job is None:
                    return
                if isinstance(job, _Remove):
                    if self._available():
                        self.store.remove(job.key)
                else:
                    self._write(job)
            except StoreUnavailableError as e:
                self._on_unavailable(e)
            except Exception:  # the writer must outlive any one bad job
                logger.exception("host tier: write-back failed")
            finally:
                self._queue.task_done()

    def _write(self, job: _Write) -> None:
        if job.event is not None:
            job.event.synchronize()
        if not self._available():
            return
        written: list[ObjectBuilder] = []
        try:
            for obj in job.objects:
                if not self.store.put(obj.key, obj.seal()):
                    break
                written.append(obj)
        finally:
            self._on_written(job.state, job.objects, written)
