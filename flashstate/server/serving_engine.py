"""OpenAIServing: what the completions and chat endpoints share — model-name check, overload bound, handing
requests to the AsyncEngine, client-disconnect cancellation, metrics, SSE framing.

A request's life here:
    parse body (400) → model name (404) → tokenize (400) → capacity (503) → engine.generate: its first
    output is awaited before any response byte is sent, so every error the engine raises on add (prompt
    too long, bad token id) is still a proper status code → stream or collect the rest.
If the client disconnects at any point, the awaiting task is cancelled; the engine stream's `finally`
aborts the request and its blocks and slots go back to the pools.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable
from http import HTTPStatus
from typing import Any, TypeVar

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from flashstate.config import EngineConfig
from flashstate.engine.async_engine import AsyncEngine, EngineDeadError, EngineError
from flashstate.engine.output.request_output import RequestOutput
from flashstate.engine.scheduler import RequestTooLargeError
from flashstate.sampling_params import SamplingParams, branch
from flashstate.server.errors import APIError, bad_request
from flashstate.server.metrics import ServerMetrics

logger = logging.getLogger("flashstate.server")
T = TypeVar("T")
Prompt = str | list[int]


# Request fields the engine checks against the model (LLMEngine._bounded) besides the prompt.
_ENGINE_CHECKED = {"stop_token_ids", "logprobs", "logit_bias", "allowed_token_ids", "priority"}


class ClientGone(Exception):
    """The client disconnected before the response started."""


class SSEResponse(StreamingResponse):
    """Server-sent events; the body iterator is always closed, so a stream cut by a disconnect aborts."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str]):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[union-attr]


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def until_disconnect(raw: Request, awaitable: Awaitable[T]) -> T:
    """Await `awaitable` in this task; if the client disconnects first, cancel it and raise ClientGone.
    The body must already be read (the next receive() is then the disconnect)."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await raw.receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        return await awaitable
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise ClientGone from None
    finally:
        watcher.cancel()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIServing:
    def __init__(self, engine: AsyncEngine, config: EngineConfig, model_name: str, metrics: ServerMetrics):
        self.engine = engine
        self.config = config
        self.model_name = model_name
        self.metrics = metrics
        self.tokenizer = engine.engine.tokenizer
        self.healthy = True  # false once the engine loop has died
        self._reserved = 0  # requests past the capacity check whose add has not run yet

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(
                HTTPStatus.NOT_FOUND,
                f"The model `{name}` does not exist (this server serves `{self.model_name}`).",
                code="model_not_found",
                param="model",
            )

    def _check_capacity(self, n: int) -> None:
        waiting = self.engine.num_waiting + self._reserved
        bound = self.config.max_waiting_requests
        if waiting + n > bound:
            self.metrics.rejected.labels(self.model_name, "overload").inc()
            # a request sent now would wait about as long as the oldest queued one has
            retry = max(1, math.ceil(self.engine.engine.stats.oldest_wait_seconds))
            raise APIError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"The server is overloaded: {waiting} requests are waiting (limit {bound}). Retry later.",
                code="overloaded",
                headers={"Retry-After": str(retry)},
            )

    async def generate(
        self,
        raw: Request,
        prompts: list[list[int]],
        params: SamplingParams,
        request_id: str,
        checkpoint_positions: list[int] | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> tuple[list[RequestOutput], list[AsyncIterator[RequestOutput]]]:
        """Queue every prompt and wait for each one's first output. Returns those and the streams of the rest.
        Raises APIError (400 bad prompt, 503 overload, 500 engine dead) or ClientGone; on any error nothing
        stays queued. `cache_salt`: the request's, which joins its tenant's (see `tenant_salt`).
        With `params.n` > 1 each prompt is n engine requests (branches), prompt j's branch i at index
        j * n + i (vLLM's choice order): branch 0 prefills the prompt, the others start from its state
        (LLMEngine.add, `fork_of`), each with `branch(params, i)`."""
        n = params.n
        self._check_capacity(len(prompts) * n)
        count = len(prompts) * n
        ids = [request_id] if count == 1 else [f"{request_id}-{k}" for k in range(count)]
        salt = self.tenant_salt(raw, cache_salt)
        streams = [
            self._tracked(
                self.engine.generate(
                    p, branch(params, i), ids[j * n + i], checkpoint_positions, salt, priority,
                    ids[j * n] if i else None,
                )
            )
            for j, p in enumerate(prompts)
            for i in range(n)
        ]  # fmt: skip
        unstarted = len(streams)
        self._reserved += unstarted

        async def first(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
            nonlocal unstarted
            unstarted -= 1
            self._reserved -= 1  # the engine's add runs next, in this same step of the event loop
            return await anext(stream)

        tasks: list[asyncio.Future] = []
        try:
            if len(streams) == 1:
                return [await until_disconnect(raw, first(streams[0]))], streams
            tasks = [asyncio.ensure_future(first(s)) for s in streams]
            return await until_disconnect(raw, asyncio.gather(*tasks)), streams
        except BaseException as e:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for s in streams:
                await s.aclose()  # type: ignore[attr-defined]
            if isinstance(e, RequestTooLargeError):
                param = "max_tokens"
                if any(not self._fits(len(p)) for p in prompts):
                    param = "messages" if checkpoint_positions is not None else "prompt"
                raise bad_request(str(e), param=param, code="context_length_exceeded") from e
            if isinstance(e, EngineError):
                raise self.engine_error(e) from e
            if isinstance(e, ValueError):  # the engine's message starts with the field it refuses
                field = str(e).split(" ", 1)[0]
                raise bad_request(str(e), param=field if field in _ENGINE_CHECKED else "prompt") from e
            raise
        finally:
            self._reserved -= unstarted
            unstarted = 0

    def tenant_salt(self, raw: Request, cache_salt: str | None) -> str | None:
        """The salt the cache sees. With API-key cache isolation every request's salt starts with its key's
        tenant digest (which holds no "/"), so no client salt of one tenant can name another's."""
        if not self.config.api_key_cache_isolation:
            return cache_salt
        tenant = raw.state.tenant
        return tenant if cache_salt is None else f"{tenant}/{cache_salt}"

    def _fits(self, num_tokens: int) -> bool:
        llm = self.engine.engine
        return num_tokens <= llm.max_model_len and llm.cache.can_ever_fit(num_tokens)

    async def _tracked(self, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
        first, finished = True, False
        try:
            async for out in stream:
                self.metrics.observe(out, first)
                first, finished = False, out.finished
                yield out
        except EngineDeadError:
            self.healthy = False
            raise
        except ValueError:
            finished = first  # refused on add: never queued, so not an abort
            raise
        finally:
            if not finished:  # queued, then left early: the engine stream's finally aborted it
                self.metrics.aborted.labels(self.model_name).inc()
                await stream.aclose()  # type: ignore[attr-defined]

    async def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise bad_request("prompt must not be empty", param="prompt")
            return await asyncio.to_thread(self.tokenizer.encode, prompt)
        if not prompt:
            raise bad_request("prompt must not be empty", param="prompt")
        return list(prompt)

    def engine_error(self, e: EngineError) -> APIError:
        """The 500 for a request the engine failed alone, or for a dead engine (then unhealthy for good)."""
        if isinstance(e, EngineDeadError):
            self.healthy = False
            return APIError(HTTPStatus.INTERNAL_SERVER_ERROR, str(e), code="engine_dead")
        return APIError(HTTPStatus.INTERNAL_SERVER_ERROR, str(e), code="request_failed")

    def engine_error_chunk(self, e: EngineError) -> str:
        return sse(self.engine_error(e).body())

    async def collect(self, raw: Request, awaitable: Awaitable[T]) -> T:
        """Await the rest of a non-streamed response; the engine's failures become their 500."""
        try:
            return await until_disconnect(raw, awaitable)
        except EngineError as e:
            raise self.engine_error(e) from e

    def token_texts(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids]


async def merge_streams(
    firsts: list[RequestOutput], streams: list[AsyncIterator[RequestOutput]]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(index, output) of several requests as they come: the first outputs, then the rest interleaved.
    Closing this iterator (a disconnect) cancels every stream, which aborts its request."""
    for i, out in enumerate(firsts):
        yield i, out
    live = [i for i, out in enumerate(firsts) if not out.finished]
    if len(live) <= 1:
        for i in live:
            async for out in streams[i]:
                yield i, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async for out in streams[i]:
                queue.put_nowait((i, out))
        except Exception as e:  # noqa: BLE001 — handed to the consumer
            queue.put_nowait((i, e))
        finally:
            queue.put_nowait((i, None))

    pumps = [asyncio.ensure_future(pump(i)) for i in live]
    try:
        remaining = len(pumps)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for p in pumps:
            p.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for s in streams:
            await s.aclose()  # type: ignore[attr-defined]


async def last_output(first: RequestOutput, stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    last = first
    async for out in stream:
        last = out
    return last


async def anext_ready(chunks: AsyncIterator[Any]) -> None:
    """Run a chunk generator to its first item, the None it yields once the request is accepted: errors
    raised before that (a 400, a 503) reach the caller while a plain error response can still be sent."""
    if await anext(chunks) is not None:
        raise AssertionError("a chunk generator must yield None first")
