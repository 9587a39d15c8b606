"""AsyncEngine: the server's driver. The LLMEngine steps on a background thread; each request streams its
RequestOutputs into an asyncio queue. Leaving the `generate` iterator early (client disconnect,
cancellation) aborts the request and frees its cache resources."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from flashstate import envs
from flashstate.config import EngineConfig
from flashstate.diagnostics.stack_sampler import StackSampler
from flashstate.diagnostics.thread_cpu import describe, thread_cpu_seconds
from flashstate.engine.llm_engine import LLMEngine
from flashstate.engine.output.request_output import RequestOutput
from flashstate.engine.request_state import RequestState
from flashstate.gc_pauses import serving_pauses
from flashstate.sampling_params import SamplingParams

logger = logging.getLogger("flashstate")
Delivery = RequestOutput | Exception  # what a request's stream receives
T = TypeVar("T")


class EngineError(RuntimeError):
    """The engine could not serve a request (a 500, or an error event mid-stream)."""


class EngineDeadError(EngineError):
    """The engine loop has stopped: no request can be served any more."""


class RequestFailedError(EngineError):
    """The engine failed this one request (finish reason "error") and went on serving the others."""


class AsyncEngine:
    """Only the engine thread touches the LLMEngine's queues and cache. The event loop checks a request
    (`LLMEngine.new_request`, which raises for bad input before anything is queued) and hands it over through
    an inbox that the engine thread drains before every step; aborts travel the same way, in order. So a
    request never waits for a step to end before it is accepted, and a busy engine cannot starve arrivals."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        engine: LLMEngine | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
    ):
        """`on_dead` is called on the engine thread once the loop has stopped for good (after every waiting
        stream has heard of it); the server uses it to exit non-zero."""
        self.engine = engine  # when None, built on the engine thread before the constructor returns
        self._wake = threading.Event()
        self._stopped = False
        self._error: BaseException | None = None
        self._on_dead = on_dead
        self.last_progress = time.monotonic()  # the engine thread's last step or idle wait
        # a request to add, the id of one to abort, or a call to make on the engine thread
        self._inbox: deque[RequestState | str | EngineCall] = deque()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        built = threading.Event()
        failed: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(config, built, failed), name="flashstate-engine", daemon=True
        )
        self._thread.start()
        built.wait()
        if failed:
            raise failed[0]

    def _run(self, config: EngineConfig | None, built: threading.Event, failed: list[BaseException]) -> None:
        # The engine is built where it steps: on the CPU, torch ops in a thread other than the one whose
        # OpenMP pool ran first are 2-3x slower (benchmarks/server_stream.py).
        try:
            if self.engine is None:
                self.engine = LLMEngine(config)
        except BaseException as e:  # noqa: BLE001 — raised again in the constructor's thread
            failed.append(e)
            return
        finally:
            built.set()
        path = envs.FLASHSTATE_STACK_SAMPLE
        sampler = StackSampler(threading.get_ident()).start() if path else None
        try:
            self._loop()
        finally:
            if sampler is not None:
                sampler.stop()
                c = self.engine.config
                title = f"engine thread, cache policy {c.cache_policy}, host tier {c.host_tier}"
                Path(path.replace("%p", str(os.getpid()))).write_text(sampler.report(title))

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        checkpoint_positions: list[int] | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        fork_of: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request (errors for bad input raise here, before anything is queued) and stream its
        outputs until it finishes. `priority`, `fork_of`: as LLMEngine.add_request's."""
        if self._error is not None:
            raise EngineDeadError(f"engine loop failed: {self._error}")
        req = self.engine.new_request(
            prompt, params, request_id, checkpoint_positions, cache_salt, priority, fork_of
        )
        rid = req.seq.request_id
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in use")
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = (asyncio.get_running_loop(), queue)
        self._inbox.append(req)
        self._wake.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                error = None
                # A consumer that fell behind gets one output for all the steps it missed.
                while isinstance(item, RequestOutput) and not item.finished and not queue.empty():
                    nxt = queue.get_nowait()
                    if isinstance(nxt, BaseException):
                        error = nxt
                        break
                    item = nxt.absorb(item)
                if isinstance(item, BaseException):
                    error, item = item, None
                if item is not None:
                    finished = item.finished
                    yield item
                    if finished:
                        return
                if error is not None:
                    if isinstance(error, ValueError | RequestFailedError) and error is not self._error:
                        finished = True  # refused or failed by the engine thread: no longer queued
                        raise error
                    raise EngineDeadError(f"engine loop failed: {error}") from error
        finally:
            if not finished:
                self.abort(rid)

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(engine)` on the engine thread between two steps and return what it returns."""
        if self._error is not None:
            raise EngineDeadError(f"engine loop failed: {self._error}")
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._inbox.append(EngineCall(fn, loop, future))
        self._wake.set()
        return await future

    def abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._inbox.append(request_id)
        self._wake.set()

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    @property
    def dead(self) -> bool:
        return self._error is not None

    def stalled(self, seconds: float) -> bool:
        """The engine thread has work and has not finished a step (or an idle wait) for `seconds`."""
        busy = bool(self._inbox) or self.engine.has_unfinished()
        return busy and time.monotonic() - self.last_progress > seconds

    @property
    def num_waiting(self) -> int:
        """Requests accepted but not running yet (in the inbox or the scheduler's queue)."""
        return len(self._inbox) + len(self.engine.scheduler.waiting)

    def shutdown(self) -> None:
        if not self._stopped and self._thread.is_alive():
            logger.info("threads' CPU seconds: %s", describe(thread_cpu_seconds()))
            if self.engine.compiles.installed:
                logger.info("Triton: %s", self.engine.compiles.describe())
            if (pauses := serving_pauses()) is not None:
                logger.info("garbage collector pauses: %s", pauses.describe())
                if pauses.census is not None:
                    logger.info("garbage collector census: %s", pauses.census.describe())
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.engine.close()

    def _drain_inbox(self) -> None:
        while self._inbox:
            item = self._inbox.popleft()
            if isinstance(item, str):
                self.engine.abort(item)
            elif isinstance(item, EngineCall):
                item.run(self.engine)
            elif item.seq.request_id in self._streams:  # not aborted while in the inbox
                try:
                    self.engine.add(item)
                except Exception as e:  # noqa: BLE001 — refused before it was queued: its own failure
                    # ValueError: its id is still held by a request the engine has not let go
                    error = e if isinstance(e, ValueError) else RequestFailedError(f"not queued: {e}")
                    loop, queue = self._streams.pop(item.seq.request_id)
                    loop.call_soon_threadsafe(queue.put_nowait, error)

    def _loop(self) -> None:
        while not self._stopped:
            try:
                self._drain_inbox()
                if not self.engine.has_unfinished():
                    self.last_progress = time.monotonic()
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    self.last_progress = time.monotonic()
                    continue
                outputs = self._step()
            except BaseException as e:  # noqa: BLE001 — every waiter must hear of it
                logger.exception("engine loop failed: the engine cannot go on")
                self._die(e)
                return
            self.last_progress = time.monotonic()
            batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Delivery]]] = {}
            for out in outputs:
                target = self._streams.get(out.request_id)
                if out.finished:
                    self._streams.pop(out.request_id, None)
                if target is not None:
                    item = out if out.error is None else RequestFailedError(out.error)
                    batches.setdefault(target[0], []).append((target[1], item))
            for loop, items in batches.items():  # one wake-up of each event loop per step
                loop.call_soon_threadsafe(_deliver, items)

    def _step(self) -> list[RequestOutput]:
        """One engine step; a step that raises fails the request that caused it (LLMEngine.recover), and
        raises only when the engine cannot go on."""
        try:
            return self.engine.step()
        except Exception as e:  # noqa: BLE001 — a request's failure, if recover() can pin it on one
            logger.exception("engine step failed")
            return self.engine.recover(e)

    def _die(self, error: BaseException) -> None:
        self._error = error
        streams, self._streams = self._streams, {}
        for loop, queue in streams.values():
            loop.call_soon_threadsafe(queue.put_nowait, error)
        if self._on_dead is not None:
            self._on_dead(error)


@dataclass(slots=True)
class EngineCall:
    fn: Callable[[LLMEngine], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future

    def run(self, engine: LLMEngine) -> None:
        try:
            result = self.fn(engine)
        except Exception as e:  # noqa: BLE001 — the caller's to handle
            self.loop.call_soon_threadsafe(_settle, self.future, None, e)
        else:
            self.loop.call_soon_threadsafe(_settle, self.future, result, None)


def _settle(future: asyncio.Future, result: Any, error: Exception | None) -> None:
    if future.done():  # the caller went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _deliver(items: list[tuple[asyncio.Queue, Delivery]]) -> None:
    for queue, out in items:
        queue.put_nowait(out)
