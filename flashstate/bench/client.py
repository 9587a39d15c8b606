"""One streamed request to an OpenAI-compatible server: `/v1/completions` with a token-id prompt, or
`/v1/chat/completions` with messages; `stream_options.include_usage` for the prompt and cached token counts
(`usage.prompt_tokens_details.cached_tokens`).

Times are `time.perf_counter()` seconds: `t_send` before the request is written, `t_first` at the first
streamed token (TTFT = t_first − t_send), `t_end` at `[DONE]` or the end of the stream.
Generated token ids come back when the server echoes them (`choices[].token_ids`, asked for with vLLM's
`return_token_ids`); otherwise `token_ids` is None and only the text and counts are known.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(slots=True)
class Completion:
    t_send: float
    t_first: float | None = None
    t_end: float | None = None
    prompt_tokens: int | None = None  # from usage
    cached_tokens: int | None = None  # from usage.prompt_tokens_details; None: the server did not say
    completion_tokens: int = 0
    chunks: int = 0  # streamed chunks that carried tokens
    text: str = ""  # the content (chat: `delta.content`)
    reasoning: str = ""  # chat: `delta.reasoning_content` (a server with a reasoning parser)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # chat: the calls, deltas merged
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    error: str | None = None
    too_long: bool = False  # the server refused the prompt as longer than its context (HTTP 400)
    retryable: bool = False  # the server (or a router's replica) failed: the same request may be sent again
    _ids: list[int] = field(default_factory=list)


RETRYABLE_STATUS = (502, 503, 504)  # a router with no healthy replica, or a replica going away
ROUTER_SEND_FAILED = "Request failed:"  # vllm-router's 500 when it cannot reach the replica it picked
_TOO_LONG = ("context_length_exceeded", "max_model_len", "maximum context length")


def completion_body(
    model: str | None, prompt: list[int], max_tokens: int, temperature: float
) -> dict[str, Any]:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    return body | ({"model": model} if model else {})


def chat_body(
    model: str | None,
    messages: list[dict[str, Any]],
    max_tokens: int,
    temperature: float,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str = "auto",
) -> dict[str, Any]:
    body = {
        "messages": messages,
        **({"tools": tools, "tool_choice": tool_choice} if tools else {}),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    return body | ({"model": model} if model else {})


def _absorb(c: Completion, chunk: dict[str, Any], now: float) -> None:
    usage = chunk.get("usage")
    if usage:
        c.prompt_tokens = usage.get("prompt_tokens", c.prompt_tokens)
        c.completion_tokens = usage.get("completion_tokens", c.completion_tokens)
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            c.cached_tokens = details["cached_tokens"]
    for choice in chunk.get("choices") or []:
        text = choice.get("text")
        delta = choice.get("delta") or {}
        if text is None:
            text = delta.get("content") or ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        c.reasoning += reasoning
        calls = delta.get("tool_calls") or []
        for call in calls:
            _merge_call(c.tool_calls, call)
        ids = choice.get("token_ids")
        if ids:
            c._ids.extend(ids)
            c.token_ids = c._ids
        if text or ids or reasoning or calls:
            c.chunks += 1
            c.text += text
            if c.t_first is None:
                c.t_first = now
        if choice.get("finish_reason"):
            c.finish_reason = choice["finish_reason"]


def _merge_call(calls: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    """A streamed tool-call delta into the calls so far: by `index`, id/name once, arguments appended."""
    index = delta.get("index", len(calls))
    while len(calls) <= index:
        calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call, fn = calls[index], delta.get("function") or {}
    call["id"] = delta.get("id") or call["id"]
    call["function"]["name"] += fn.get("name") or ""
    call["function"]["arguments"] += fn.get("arguments") or ""


async def stream(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], timeout_s: float, t_send: float | None = None
) -> Completion:
    """POST `body` to `url` and read the SSE stream (`t_send`: when the caller sent it, default now).
    HTTP and protocol failures land in `error`."""
    c = Completion(t_send=time.perf_counter() if t_send is None else t_send)
    try:
        async with http.stream("POST", url, json=body, timeout=timeout_s) as resp:
            if resp.status_code != 200:
                detail = (await resp.aread()).decode("utf-8", "replace")[:300]
                c.error = f"HTTP {resp.status_code}: {detail}"
                c.too_long = resp.status_code == 400 and any(m in detail for m in _TOO_LONG)
                c.retryable = resp.status_code in RETRYABLE_STATUS or (
                    resp.status_code == 500 and detail.startswith(ROUTER_SEND_FAILED)
                )
                c.t_end = time.perf_counter()
                return c
            done = False
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    c.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    break
                _absorb(c, chunk, time.perf_counter())
            if not done and c.error is None:  # a replica that died mid-stream, its response cut by a router
                c.error, c.retryable = "the stream ended before [DONE]", True
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        c.error = f"{type(e).__name__}: {e}"[:300]
        c.retryable = isinstance(e, httpx.TransportError)
    c.t_end = time.perf_counter()
    if c.error is None and c.t_first is None and c.completion_tokens:
        c.t_first = c.t_end  # a server that sends the text in the last chunk only
    return c
