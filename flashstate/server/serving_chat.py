"""POST /v1/chat/completions: messages (with `tools`, `tool_choice`, assistant `tool_calls` and `tool`
results) rendered by the model's chat template, then generated like a completion. The token positions
where each message ends go to the engine as `checkpoint_positions`: where the prefix cache may keep a
checkpoint, because the agent's next turn re-sends exactly those prefixes.

The reply's message: the generated text as `content`, or, with tools or a reasoning parser, its
`reasoning_content`, `content` and `tool_calls` as chat_tools.py reads them (whole, or as deltas)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from flashstate.config import EngineConfig
from flashstate.engine.async_engine import AsyncEngine, EngineError
from flashstate.engine.output.request_output import RequestOutput
from flashstate.server.chat_tools import ChatParsing, OutputPlan
from flashstate.server.errors import bad_request
from flashstate.server.metrics import ServerMetrics
from flashstate.server.prompt_splice import GeneratedIds, splice_prompt
from flashstate.server.protocol import ChatCompletionRequest, now, usage
from flashstate.server.serving_engine import (
    OpenAIServing,
    SSEResponse,
    anext_ready,
    last_output,
    merge_streams,
    new_id,
    sse,
)
from flashstate.tokenizer import ChatTemplateError, Tokenizer, load_chat_template, message_positions

logger = logging.getLogger("flashstate.server")
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
        self.generated = GeneratedIds(config.chat_splice_bytes)  # prompt_splice.py; capacity 0: off

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        if req.stream:
            chunks = self.completion_chunks(req, raw)
            await anext_ready(chunks)  # a 4xx before the stream starts is a plain error response
            return SSEResponse(self._sse(chunks))
        return JSONResponse(await self.completion(req, raw))

    async def _start(
        self, req: ChatCompletionRequest, raw: Request
    ) -> tuple[dict[str, Any], list[RequestOutput], list[AsyncIterator[RequestOutput]], OutputPlan, str]:
        """The request queued: its head, and per choice (`n` of them) the first output and the stream."""
        self.check_model(req.model)
        req.check_priority(self.config.scheduling_policy)
        plan = self.parsing.plan(req)
        defaults = self.engine.engine.generation_defaults
        params = plan.sampling_params(req.to_sampling_params(defaults, self.config.max_logprobs))
        scope = self.tenant_salt(raw, req.cache_salt)
        text, prompt, positions = await asyncio.to_thread(_render, self.tokenizer, req, self.generated, scope)
        request_id, created = new_id("chatcmpl"), now()
        firsts, streams = await self.generate(
            raw, [prompt], params, request_id, positions, req.cache_salt, req.priority
        )
        head = {"id": request_id, "created": created, "model": self.model_name}
        return head, firsts, streams, plan, text, scope

    def unsalted_generated(self) -> GeneratedIds | None:
        """The remembered outputs a request without a cache salt or tenant splices from (/tokenize,
        count_tokens: they carry neither), or None where every request has a tenant."""
        return None if self.config.api_key_cache_isolation else self.generated

    def _remember_streamed(
        self, scope: str | None, out: RequestOutput, plan: OutputPlan, prompt: str
    ) -> None:
        """A streamed choice's reply, its message read as a non-streamed reply reads it. Best effort: the
        stream has been answered already, so a parser that refuses the whole text only loses the splice."""
        whole = plan.parser(prompt, streamed=False)
        try:
            message = {"content": out.text} if whole is None else whole.message(out.text)
        except Exception:  # noqa: BLE001 — the reply was sent; only the remembering is skipped
            logger.debug("reply of a streamed chat not remembered for splicing", exc_info=True)
            return
        self._remember(scope, out, message)

    def _remember(self, scope: str | None, out: RequestOutput, message: dict[str, Any]) -> None:
        """A finished choice's texts an agent re-sends (its text, content, call arguments) → its ids."""
        if self.generated.capacity <= 0 or not out.finished:
            return
        texts = [out.text, message.get("content") or ""]
        texts += [c["function"]["arguments"] for c in message.get("tool_calls") or ()]
        self.generated.remember_output(self.tokenizer, scope, out.token_ids, texts)

    async def completion(self, req: ChatCompletionRequest, raw: Request) -> dict[str, Any]:
        """The chat.completion body; raises APIError (4xx/5xx) on a bad request or a failed engine."""
        head, firsts, streams, plan, prompt, scope = await self._start(req, raw)
        finals = await self.collect(
            raw, asyncio.gather(*(last_output(f, s) for f, s in zip(firsts, streams, strict=True)))
        )
        choices = []
        for i, out in enumerate(finals):
            parser = plan.parser(prompt, streamed=False)
            if parser is None:
                message, finish_reason = {"role": "assistant", "content": out.text}, out.finish_reason
            else:
                message = parser.message(out.text)
                finish_reason = plan.finish_reason(out.finish_reason, parser.called)
            self._remember(scope, out, message)
            logprobs = None
            if req.logprobs:
                logprobs = self._logprobs(out.token_ids, out.logprobs, out.top_logprobs)
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason,
                    "stop_reason": out.stop_reason,
                    **({"token_ids": out.token_ids} if req.return_token_ids else {}),
                }
            )
        return {
            **head,
            "object": "chat.completion",
            "choices": choices,
            "usage": _usage(finals),
            "system_fingerprint": None,
        }

    async def completion_chunks(
        self, req: ChatCompletionRequest, raw: Request
    ) -> AsyncIterator[dict[str, Any]]:
        """The chat.completion.chunk dicts of a streamed reply. The first item is None, yielded once the
        request is accepted (errors before it raise APIError); an engine failure mid-stream raises
        EngineError after the chunks so far."""
        head, firsts, streams, plan, prompt, scope = await self._start(req, raw)
        head = {**head, "object": "chat.completion.chunk"}
        parsers = [plan.parser(prompt, streamed=True) for _ in firsts]
        yield None

        def chunk(
            i: int, delta: dict[str, Any], finish_reason: str | None, out: RequestOutput, logprobs=None
        ) -> dict[str, Any]:
            choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            if finish_reason is not None:  # vLLM's: the stop string or token id that ended it, else None
                choice["stop_reason"] = out.stop_reason
            body: dict[str, Any] = {**head, "choices": [choice]}
            if req.include_usage:
                body["usage"] = _usage([out]) if req.continuous_usage else None
            return body

        def delta(i: int, out: RequestOutput) -> dict[str, Any] | None:
            parser = parsers[i]
            n = len(out.delta_token_ids)
            finish_reason = out.finish_reason if out.finished else None
            if parser is None:
                content = {"content": out.delta_text} if out.delta_text else {}
            else:
                content = parser.feed(out.delta_text) or {}
                if out.finished:
                    content = _merge(content, parser.finish() or {})
                    finish_reason = plan.finish_reason(out.finish_reason, parser.called)
            if not (content or out.finished or ((req.logprobs or req.return_token_ids) and n)):
                return None  # nothing to send yet (e.g. text held back as a possible stop string)
            logprobs = None
            if req.logprobs:
                top = (out.top_logprobs or [])[-n:] if n else []
                logprobs = self._logprobs(out.delta_token_ids, (out.logprobs or [])[-n:] if n else [], top)
            body = chunk(i, content, finish_reason, out, logprobs)
            if req.return_token_ids:
                body["choices"][0]["token_ids"] = out.delta_token_ids
            return body

        latest = list(firsts)
        try:
            for i, first in enumerate(firsts):
                yield chunk(i, {"role": "assistant", "content": ""}, None, first)
            async with aclosing(merge_streams(firsts, streams)) as merged:  # a disconnect closes us
                async for i, out in merged:
                    latest[i] = out
                    if (c := delta(i, out)) is not None:
                        yield c
                    if out.finished:
                        self._remember_streamed(scope, out, plan, prompt)
            if req.include_usage:
                yield {**head, "choices": [], "usage": _usage(latest)}
        finally:
            for stream in streams:
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

    def _logprobs(
        self, ids: list[int], logprobs: list[float] | None, top: list[list[tuple[int, float]]] | None
    ) -> dict[str, Any]:
        """Chat logprobs: per token its logprob and the `top_logprobs` most likely tokens (raw logprobs)."""
        content = []
        top = top or []
        for k, (text, lp) in enumerate(zip(self.token_texts(ids), logprobs or [], strict=False)):
            alternatives = top[k] if k < len(top) else []
            texts = self.token_texts([t for t, _ in alternatives])
            content.append(
                {
                    "token": text,
                    "logprob": lp,
                    "bytes": list(text.encode()),
                    "top_logprobs": [
                        {"token": t, "logprob": v, "bytes": list(t.encode())}
                        for t, (_, v) in zip(texts, alternatives, strict=True)
                    ],
                }
            )
        return {"content": content}


def render_chat(
    tokenizer: Tokenizer,
    req: ChatCompletionRequest,
    generated: GeneratedIds | None = None,
    scope: str | None = None,
) -> tuple[list[int], list[int]]:
    """Prompt token ids, and the positions where messages end (Tokenizer.chat_message_boundaries)."""
    _, ids, positions = _render(tokenizer, req, generated, scope)
    return ids, positions


def _render(
    tokenizer: Tokenizer,
    req: ChatCompletionRequest,
    generated: GeneratedIds | None = None,
    scope: str | None = None,
) -> tuple[str, list[int], list[int]]:
    """The prompt's text, its token ids, and the positions where messages end. With `generated` (the
    server's remembered outputs, prompt_splice.py), assistant spans this server generated in `scope` are
    their generated ids; the text is the same either way."""
    messages = [m.to_template() for m in req.messages]
    tools = req.template_tools()
    kwargs = req.template_kwargs()
    if reserved := _RESERVED_KWARGS & kwargs.keys():
        raise bad_request(
            f"chat_template_kwargs may not set {sorted(reserved)}", param="chat_template_kwargs"
        )
    try:
        text, char_ends = tokenizer.chat_message_ends(messages, tools, req.add_generation_prompt, **kwargs)
    except ChatTemplateError as e:
        raise bad_request(str(e), param="messages") from e
    if generated is not None and generated.capacity > 0 and len(generated):
        spliced = splice_prompt(
            tokenizer, generated, scope, messages, tools, req.add_generation_prompt, kwargs, text, char_ends
        )
        if spliced is not None:
            return text, *spliced
    ids, token_ends = tokenizer.encode_with_ends(text)
    return text, ids, message_positions(token_ends, char_ends)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two chunk deltas as one: text fields joined, tool-call pieces in order."""
    out = dict(a)
    for key, value in b.items():
        if key == "tool_calls":
            out[key] = [*out.get(key, []), *value]
        else:
            out[key] = out.get(key, "") + value
    return out


def _usage(outs: list[RequestOutput]) -> dict[str, Any]:
    """Of one request's choices: the prompt counted once (as vLLM), the completions summed."""
    return usage(
        len(outs[0].prompt_token_ids),
        sum(len(o.token_ids) for o in outs),
        outs[0].stats.num_cached_tokens,
    )
