"""POST /v1/chat/completions: messages (with `tools`, `tool_choice`, assistant `tool_calls` and `tool`
results) rendered by the model's chat template, then generated like a completion. The token positions
where each message ends go to the engine as `checkpoint_positions`: where the prefix cache may keep a
checkpoint, because the agent's next turn re-sends exactly those prefixes.

The reply's message: the generated text as `content`, or, with tools or a reasoning parser, its
`reasoning_content`, `content` and `tool_calls` as chat_tools.py reads them (whole, or as deltas)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from flashstate.config import EngineConfig
from flashstate.engine.async_engine import AsyncEngine, EngineError
from flashstate.engine.output.request_output import RequestOutput
from flashstate.server.chat_tools import ChatParsing, OutputPlan
from flashstate.server.errors import bad_request
from flashstate.server.metrics import ServerMetrics
from flashstate.server.protocol import ChatCompletionRequest, now, usage
from flashstate.server.serving_engine import (
    OpenAIServing,
    SSEResponse,
    anext_ready,
    last_output,
    new_id,
    sse,
)
from flashstate.tokenizer import ChatTemplateError, Tokenizer, load_chat_template

_RESERVED_KWARGS = {"messages", "tools", "add_generation_prompt"}


class OpenAIServingChat(OpenAIServing):
    """The chat pipeline every dialect runs through: `completion` gives the body of a non-streamed reply,
    `completion_chunks` the chunks of a streamed one, both as OpenAI chat-completion dicts (the Anthropic
    Messages and Responses front ends translate from these); `create` serves them over HTTP."""

    def __init__(self, engine: AsyncEngine, config: EngineConfig, model_name: str, metrics: ServerMetrics):
        super().__init__(engine, config, model_name, metrics)
        if config.chat_template is not None:
            self.tokenizer = self.tokenizer.with_chat_template(load_chat_template(config.chat_template))
        self.parsing = ChatParsing(config, self.tokenizer)

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        if req.stream:
            chunks = self.completion_chunks(req, raw)
            await anext_ready(chunks)  # a 4xx before the stream starts is a plain error response
            return SSEResponse(self._sse(chunks))
        return JSONResponse(await self.completion(req, raw))

    async def _start(
        self, req: ChatCompletionRequest, raw: Request
    ) -> tuple[dict[str, Any], RequestOutput, AsyncIterator[RequestOutput], OutputPlan, str]:
        self.check_model(req.model)
        plan = self.parsing.plan(req)
        params = plan.sampling_params(req.to_sampling_params())
        text, prompt, positions = await asyncio.to_thread(_render, self.tokenizer, req)
        request_id, created = new_id("chatcmpl"), now()
        (first,), (stream,) = await self.generate(
            raw, [prompt], params, request_id, positions, req.cache_salt
        )
        head = {"id": request_id, "created": created, "model": self.model_name}
        return head, first, stream, plan, text

    async def completion(self, req: ChatCompletionRequest, raw: Request) -> dict[str, Any]:
        """The chat.completion body; raises APIError (4xx/5xx) on a bad request or a failed engine."""
        head, first, stream, plan, prompt = await self._start(req, raw)
        out = await self.collect(raw, last_output(first, stream))
        parser = plan.parser(prompt, streamed=False)
        if parser is None:
            message, finish_reason = {"role": "assistant", "content": out.text}, out.finish_reason
        else:
            message = parser.message(out.text)
            finish_reason = plan.finish_reason(out.finish_reason, parser.called)
        choice = {
            "index": 0,
            "message": message,
            "logprobs": self._logprobs(out.token_ids, out.logprobs) if req.logprobs else None,
            "finish_reason": finish_reason,
            "stop_reason": out.stop_reason,
        }
        return {
            **head,
            "object": "chat.completion",
            "choices": [choice],
            "usage": _usage(out),
            "system_fingerprint": None,
        }

    async def completion_chunks(
        self, req: ChatCompletionRequest, raw: Request
    ) -> AsyncIterator[dict[str, Any]]:
        """The chat.completion.chunk dicts of a streamed reply. The first item is None, yielded once the
        request is accepted (errors before it raise APIError); an engine failure mid-stream raises
        EngineError after the chunks so far."""
        head, first, stream, plan, prompt = await self._start(req, raw)
        head = {**head, "object": "chat.completion.chunk"}
        parser = plan.parser(prompt, streamed=True)
        yield None

        def chunk(delta: dict[str, Any], finish_reason: str | None, out: RequestOutput, logprobs=None):
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            body: dict[str, Any] = {**head, "choices": [choice]}
            if req.include_usage:
                body["usage"] = _usage(out) if req.continuous_usage else None
            return body

        def delta(out: RequestOutput) -> dict[str, Any] | None:
            n = len(out.delta_token_ids)
            finish_reason = out.finish_reason if out.finished else None
            if parser is None:
                content = {"content": out.delta_text} if out.delta_text else {}
            else:
                content = parser.feed(out.delta_text) or {}
                if out.finished:
                    content = _merge(content, parser.finish() or {})
                    finish_reason = plan.finish_reason(out.finish_reason, parser.called)
            if not (content or out.finished or (req.logprobs and n)):
                return None  # nothing to send yet (e.g. text held back as a possible stop string)
            logprobs = None
            if req.logprobs:
                logprobs = self._logprobs(out.delta_token_ids, (out.logprobs or [])[-n:] if n else [])
            return chunk(content, finish_reason, out, logprobs)

        last = first
        try:
            yield chunk({"role": "assistant", "content": ""}, None, first)
            if (c := delta(first)) is not None:
                yield c
            async for out in stream:
                last = out
                if (c := delta(out)) is not None:
                    yield c
            if req.include_usage:
                yield {**head, "choices": [], "usage": _usage(last)}
        finally:
            await stream.aclose()  # type: ignore[attr-defined] — a disconnect closes us mid-stream

    async def _sse(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
        try:
            async for body in chunks:
                yield sse(body)
        except EngineError as e:
            yield self.engine_error_chunk(e)
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        yield sse("[DONE]")

    def _logprobs(self, ids: list[int], logprobs: list[float] | None) -> dict[str, Any]:
        """Chat logprobs. The engine reports the chosen token's logprob only; `top_logprobs` holds it."""
        content = []
        for text, lp in zip(self.token_texts(ids), logprobs or [], strict=False):
            entry = {"token": text, "logprob": lp, "bytes": list(text.encode())}
            content.append({**entry, "top_logprobs": [entry]})
        return {"content": content}


def render_chat(tokenizer: Tokenizer, req: ChatCompletionRequest) -> tuple[list[int], list[int]]:
    """Prompt token ids, and the positions where messages end (Tokenizer.chat_message_boundaries)."""
    _, ids, positions = _render(tokenizer, req)
    return ids, positions


def _render(tokenizer: Tokenizer, req: ChatCompletionRequest) -> tuple[str, list[int], list[int]]:
    """The prompt's text, its token ids, and the positions where messages end."""
    messages = [m.to_template() for m in req.messages]
    tools = req.template_tools()
    kwargs = req.template_kwargs()
    if reserved := _RESERVED_KWARGS & kwargs.keys():
        raise bad_request(
            f"chat_template_kwargs may not set {sorted(reserved)}", param="chat_template_kwargs"
        )
    try:
        text = tokenizer.apply_chat_template(messages, tools, req.add_generation_prompt, **kwargs)
        positions = tokenizer.chat_message_boundaries(messages, tools, req.add_generation_prompt, **kwargs)
    except ChatTemplateError as e:
        raise bad_request(str(e), param="messages") from e
    return text, tokenizer.encode(text, add_special_tokens=False), positions


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two chunk deltas as one: text fields joined, tool-call pieces in order."""
    out = dict(a)
    for key, value in b.items():
        if key == "tool_calls":
            out[key] = [*out.get(key, []), *value]
        else:
            out[key] = out.get(key, "") + value
    return out


def _usage(out: RequestOutput) -> dict[str, Any]:
    return usage(len(out.prompt_token_ids), len(out.token_ids), out.stats.num_cached_tokens)
