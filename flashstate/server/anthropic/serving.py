"""POST /v1/messages and /v1/messages/count_tokens: the request translated into a chat request
(protocol.py), served by the chat pipeline, the reply translated back (messages.py). Streams are
server-sent events with `event:` lines, as Anthropic sends them; an engine failure mid-stream is an
`error` event. Errors before a reply have Anthropic's shape (errors.py, ANTHROPIC_PATHS)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from flashstate.engine.async_engine import EngineError
from flashstate.server.anthropic.messages import MessageEvents, message
from flashstate.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from flashstate.server.serving_chat import OpenAIServingChat, render_chat
from flashstate.server.serving_engine import SSEResponse, anext_ready


def event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class AnthropicServingMessages:
    def __init__(self, chat: OpenAIServingChat):
        self.chat = chat

    async def create(self, req: MessagesRequest, raw: Request) -> Response:
        chat_req = req.to_chat_request()
        if req.stream:
            chunks = self.chat.completion_chunks(chat_req, raw)
            await anext_ready(chunks)  # a 4xx before the stream starts is a plain error response
            return SSEResponse(self._events(chunks, req.stop_sequences))
        return JSONResponse(message(await self.chat.completion(chat_req, raw), req.stop_sequences))

    async def count_tokens(self, req: CountTokensRequest) -> dict[str, int]:
        """The prompt's token count as the chat template renders it (tools and system included)."""
        chat_req = req.to_chat_request()
        self.chat.check_model(chat_req.model)
        prompt, _ = await asyncio.to_thread(
            render_chat, self.chat.tokenizer, chat_req, self.chat.unsalted_generated()
        )
        return {"input_tokens": len(prompt)}

    async def _events(
        self, chunks: AsyncIterator[dict[str, Any]], stop_sequences: list[str] | None
    ) -> AsyncIterator[str]:
        events = MessageEvents(stop_sequences)
        try:
            async for chunk in chunks:
                for name, data in events.feed(chunk):
                    yield event(name, data)
            for name, data in events.finish():
                yield event(name, data)
        except EngineError as e:
            yield event("error", self.chat.engine_error(e).anthropic_body())
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
