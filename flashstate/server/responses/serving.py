"""POST /v1/responses: the request translated into a chat request (protocol.py), served by the chat
pipeline, the reply translated back (output.py). Streams are server-sent events with `event:` lines, as
OpenAI sends them; an engine failure mid-stream is an `error` event followed by `response.failed`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from flashstate.engine.async_engine import EngineError
from flashstate.server.responses.output import ResponseEvents, head, item_id, response
from flashstate.server.responses.protocol import ResponsesRequest
from flashstate.server.serving_chat import OpenAIServingChat
from flashstate.server.serving_engine import SSEResponse, anext_ready


def event(data: dict[str, Any]) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class OpenAIServingResponses:
    def __init__(self, chat: OpenAIServingChat):
        self.chat = chat

    def _count_tokens(self, text: str) -> int:
        return len(self.chat.tokenizer.encode(text, add_special_tokens=False))

    async def create(self, req: ResponsesRequest, raw: Request) -> Response:
        chat_req = req.to_chat_request()
        top = head(req, item_id("resp"), self.chat.model_name)
        if req.stream:
            chunks = self.chat.completion_chunks(chat_req, raw)
            await anext_ready(chunks)  # a 4xx before the stream starts is a plain error response
            events = ResponseEvents(top, self._count_tokens, req.tool_namespaces())
            return SSEResponse(self._events(chunks, events))
        body = await self.chat.completion(chat_req, raw)
        return JSONResponse(response(top, body, self._count_tokens, req.tool_namespaces()))

    async def _events(
        self, chunks: AsyncIterator[dict[str, Any]], events: ResponseEvents
    ) -> AsyncIterator[str]:
        try:
            for data in events.start():
                yield event(data)
            async for chunk in chunks:
                for data in events.feed(chunk):
                    yield event(data)
            for data in events.finish():
                yield event(data)
        except EngineError as e:
            error = self.chat.engine_error(e)
            yield event(
                {
                    "type": "error",
                    "sequence_number": events.seq,
                    "code": error.code,
                    "message": error.message,
                    "param": None,
                }
            )
            events.seq += 1
            failed = {**events.top, "status": "failed", "output": events.output, "usage": None}
            failed["error"] = {"code": "server_error", "message": error.message}
            yield event({"type": "response.failed", "sequence_number": events.seq, "response": failed})
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
