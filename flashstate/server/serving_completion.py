"""POST /v1/completions. `prompt` is text, token ids, or a list of either: a batch, `n` choices per prompt
(prompt j's choice i at `index` j * n + i, as vLLM), all queued together; usage sums over the batch.
`echo`: each choice's text starts with its prompt's (the first chunk of a stream carries it)."""

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
        req.check_priority(self.config.scheduling_policy)
        params = req.to_sampling_params(self.engine.engine.generation_defaults, self.config.max_logprobs)
        given = req.prompts()
        prompts = [await self.tokenize(p) for p in given]
        # per choice: the prompt text `echo` puts before it
        echoes = [self._echo(g, p) if req.echo else "" for g, p in zip(given, prompts, strict=True)]
        echoes = [e for e in echoes for _ in range(params.n)]
        request_id, created = new_id("cmpl"), now()
        firsts, streams = await self.generate(
            raw, prompts, params, request_id, cache_salt=req.cache_salt, priority=req.priority
        )
        head = {"id": request_id, "object": "text_completion", "created": created, "model": self.model_name}
        if req.stream:
            return SSEResponse(self._stream(req, head, firsts, streams, echoes))
        finals = await self.collect(
            raw, asyncio.gather(*(last_output(f, s) for f, s in zip(firsts, streams, strict=True)))
        )
        choices = [
            {
                "index": i,
                "text": echoes[i] + out.text,
                "logprobs": self._logprobs(out.token_ids, out.logprobs, out.top_logprobs, 0)
                if req.logprobs is not None
                else None,
                "finish_reason": out.finish_reason,
                "stop_reason": out.stop_reason,
                **({"token_ids": out.token_ids} if req.return_token_ids else {}),
            }
            for i, out in enumerate(finals)
        ]
        return JSONResponse(
            {**head, "choices": choices, "usage": _total_usage(finals, req.n), "system_fingerprint": None}
        )

    def _echo(self, given: str | list[int], ids: list[int]) -> str:
        """The prompt as text: as given, or its token ids decoded."""
        return given if isinstance(given, str) else self.tokenizer.decode(ids, skip_special_tokens=False)

    async def _stream(
        self,
        req: CompletionRequest,
        head: dict[str, Any],
        firsts: list[RequestOutput],
        streams: list[AsyncIterator[RequestOutput]],
        echoes: list[str],
    ) -> AsyncIterator[str]:
        latest = list(firsts)
        offsets = [0] * len(firsts)  # characters of text sent per choice (logprobs' text_offset)
        for i, echo in enumerate(echoes):
            if echo:
                choice = {
                    "index": i,
                    "text": echo,
                    "logprobs": None,
                    "finish_reason": None,
                    "stop_reason": None,
                }
                yield sse({**head, "choices": [choice]})
        try:
            async with aclosing(
                merge_streams(firsts, streams)
            ) as merged:  # a disconnect closes us mid-stream
                async for i, out in merged:
                    latest[i] = out
                    if (chunk := self._chunk(req, head, i, out, offsets)) is not None:
                        yield chunk
            if req.include_usage:
                yield sse({**head, "choices": [], "usage": _total_usage(latest, req.n)})
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
            top = (out.top_logprobs or [])[-n:] if n else []
            logprobs = self._logprobs(
                out.delta_token_ids, (out.logprobs or [])[-n:] if n else [], top, offsets[i]
            )
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
            chunk["usage"] = _total_usage([out], 1) if req.continuous_usage else None
        return sse(chunk)

    def _logprobs(
        self,
        ids: list[int],
        logprobs: list[float] | None,
        top: list[list[tuple[int, float]]] | None,
        offset: int,
    ) -> dict[str, Any]:
        """Legacy completions logprobs. Each `top_logprobs` entry maps the chosen token, then the `logprobs`
        most likely ones, to their logprobs (vLLM's: k or k + 1 entries)."""
        tokens = self.token_texts(ids)
        lps = list(logprobs or [])
        top = top or []
        text_offset, tops = [], []
        for k, (t, lp) in enumerate(zip(tokens, lps, strict=False)):
            text_offset.append(offset)
            offset += len(t)
            alternatives = top[k] if k < len(top) else []
            texts = self.token_texts([a for a, _ in alternatives])
            tops.append({t: lp} | {a: v for a, (_, v) in zip(texts, alternatives, strict=True) if a != t})
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": text_offset}


def _total_usage(outs: list[RequestOutput], n: int) -> dict[str, Any]:
    """Each prompt counted once (its `n` choices share it, as in vLLM), the completions summed."""
    return usage(
        sum(len(o.prompt_token_ids) for o in outs[::n]),
        sum(len(o.token_ids) for o in outs),
        sum(o.stats.num_cached_tokens for o in outs[::n]),
    )
