"""AsyncEngine: the server's driver. The LLMEngine steps on a background thread; each request streams its
RequestOutputs into an asyncio queue. Leaving the `generate` iterator early (client disconnect,
cancellation) aborts the request and frees its cache resources."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

from flashstate.config import EngineConfig
from flashstate.engine.llm_engine import LLMEngine
from flashstate.engine.outputs import RequestOutput
from flashstate.sampling_params import SamplingParams

logger = logging.getLogger("flashstate")


class EngineDeadError(RuntimeError):
    pass


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None):
        self.engine = engine or LLMEngine(config)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._error: BaseException | None = None
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread = threading.Thread(target=self._loop, name="flashstate-engine", daemon=True)
        self._thread.start()

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        checkpoint_positions: list[int] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request (errors for bad input raise here, before anything is queued) and stream its
        outputs until it finishes."""
        if self._error is not None:
            raise EngineDeadError(f"engine loop failed: {self._error}")
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            rid = self.engine.add_request(prompt, params, request_id, checkpoint_positions)
            self._streams[rid] = (asyncio.get_running_loop(), queue)
        self._wake.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"engine loop failed: {item}") from item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(rid)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)
            self.engine.abort(request_id)

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.engine.shutdown()

    def _loop(self) -> None:
        while not self._stopped:
            with self._lock:
                busy = self.engine.has_unfinished()
            if not busy:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                with self._lock:
                    outputs = self.engine.step()
                    targets = [(o, self._streams.get(o.request_id)) for o in outputs]
                    for o in outputs:
                        if o.finished:
                            self._streams.pop(o.request_id, None)
            except BaseException as e:  # noqa: BLE001 — every waiter must hear of it
                logger.exception("engine step failed")
                self._error = e
                with self._lock:
                    streams, self._streams = self._streams, {}
                for loop, queue in streams.values():
                    loop.call_soon_threadsafe(queue.put_nowait, e)
                return
            for out, target in targets:
                if target is not None:
                    loop, queue = target
                    loop.call_soon_threadsafe(queue.put_nowait, out)
