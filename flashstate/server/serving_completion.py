"""POST /v1/completions. `prompt` is text, token ids, or a list of either: a batch, one choice per prompt
(`choices[i].index` = i), all queued together; usage sums over the batch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from flashstate.engine.async_engine import EngineError
from flashstate.engine.output.request_output import RequestOutput
from flashstate.server.protocol import CompletionRequest, now, usage
from flashstate.server.serving_engine import (
    OpenAIServing,
    SSEResponse,
    last_output,
    merge_streams,
    new_id,
    sse,
)


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, req: CompletionRequest, raw: Request) -> Response:
        self.check_model(req.model)
        params = req.to_sampling_params()
        prompts = [await self.tokenize(p) for p in req.prompts()]
        request_id, created = new_id("cmpl"), now()
        firsts, streams = await self.generate(raw, prompts, params, request_id, cache_salt=req.cache_salt)
        head = {"id": request_id, "object": "text_completion", "created": created, "model": self.model_name}
        if req.stream:
            return SSEResponse(self._stream(req, head, firsts, streams))
        finals = await self.collect(
            raw, asyncio.gather(*(last_output(f, s) for f, s in zip(firsts, streams, strict=True)))
        )
        choices = [
            {
                "index": i,
                "text": out.text,
                "logprobs": self._logprobs(out.token_ids, out.logprobs, 0)
                if req.logprobs is not None
                else None,
                "finish_reason": out.finish_reason,
                "stop_reason": out.stop_reason,
                **({"token_ids": out.token_ids} if req.return_token_ids else {}),
            }
            for i, out in enumerate(finals)
        ]
        return JSONResponse(
            {**head, "choices": choices, "usage": _total_usage(finals), "system_fingerprint": None}
        )

    async def _stream(
        self,
        req: CompletionRequest,
        head: dict[str, Any],
        firsts: list[RequestOutput],
        streams: list[AsyncIterator[RequestOutput]],
    ) -> AsyncIterator[str]:
        latest = list(firsts)
        offsets = [0] * len(firsts)  # characters of text sent per choice (logprobs' text_offset)
        try:
            async with aclosing(
                merge_streams(firsts, streams)
            ) as merged:  # a disconnect closes us mid-stream
                async for i, out in merged:
                    latest[i] = out
                    if (chunk := self._chunk(req, head, i, out, offsets)) is not None:
                        yield chunk
            if req.include_usage:
                yield sse({**head, "choices": [], "usage": _total_usage(latest)})
        except EngineError as e:
            yield self.engine_error_chunk(e)
        yield sse("[DONE]")

    def _chunk(
        self, req: CompletionRequest, head: dict[str, Any], i: int, out: RequestOutput, offsets: list[int]
    ) -> str | None:
        n = len(out.delta_token_ids)
        if not (out.delta_text or out.finished or ((req.logprobs is not None or req.return_token_ids) and n)):
            return None  # nothing to send yet (e.g. text held back as a possible stop string)
        logprobs = None
        if req.logprobs is not None:
            logprobs = self._logprobs(out.delta_token_ids, (out.logprobs or [])[-n:] if n else [], offsets[i])
        offsets[i] += len(out.delta_text)
        choice = {
            "index": i,
            "text": out.delta_text,
            "logprobs": logprobs,
            "finish_reason": out.finish_reason if out.finished else None,
            "stop_reason": out.stop_reason if out.finished else None,
        }
        if req.return_token_ids:
            choice["token_ids"] = out.delta_token_ids
        chunk: dict[str, Any] = {**head, "choices": [choice]}
        if req.include_usage:
            chunk["usage"] = _total_usage([out]) if req.continuous_usage else None
        return sse(chunk)

    def _logprobs(self, ids: list[int], logprobs: list[float] | None, offset: int) -> dict[str, Any]:
        """Legacy completions logprobs. The engine reports the chosen token's logprob only, so each
        `top_logprobs` entry holds that token alone."""
        tokens = self.token_texts(ids)
        lps = list(logprobs or [])
        text_offset = []
        for t in tokens:
            text_offset.append(offset)
            offset += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": lps,
            "top_logprobs": [{t: lp} for t, lp in zip(tokens, lps, strict=False)],
            "text_offset": text_offset,
        }


def _total_usage(outs: list[RequestOutput]) -> dict[str, Any]:
    return usage(
        sum(len(o.prompt_token_ids) for o in outs),
        sum(len(o.token_ids) for o in outs),
        sum(o.stats.num_cached_tokens for o in outs),
    )
