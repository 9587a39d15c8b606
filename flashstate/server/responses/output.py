"""The chat pipeline's reply as a Responses `response` object: a chat.completion body → the response
(`response`), chat.completion.chunk dicts → the stream events (`ResponseEvents`).

Output items, in order: `reasoning` (the chat message's reasoning, as one `reasoning_text` content part;
`summary` is []), `message` (its content, one `output_text` part), one `function_call` per tool call
(`call_id`: the chat tool call's id). `status` is "incomplete" with `incomplete_details.reason`
"max_output_tokens" when the length limit ended the output, else "completed".

Usage follows OpenAI's convention: `input_tokens` is the whole prompt, of which
`input_tokens_details.cached_tokens` came from the prefix cache; `output_tokens_details.reasoning_tokens`
is the chat usage's count when it gives one, else the reasoning text's token count.

A stream is `response.created`, `response.in_progress`, then per item `response.output_item.added`,
(for text and reasoning) `response.content_part.added`, the deltas (`response.output_text.delta`,
`response.reasoning_text.delta`, `response.function_call_arguments.delta`), their `.done`,
`response.content_part.done`, `response.output_item.done`; last `response.completed` (or
`response.incomplete`). Every event carries `sequence_number`, 0, 1, 2, ... in the order sent.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from flashstate.server.responses.protocol import ResponsesRequest

CountTokens = Callable[[str], int]


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def head(req: ResponsesRequest, response_id: str, model: str) -> dict[str, Any]:
    """The response object's fields that echo the request."""
    text = req.text.model_dump(by_alias=True, exclude_none=True) if req.text else {}
    reasoning = None
    if req.reasoning is not None:
        reasoning = {
            "effort": req.reasoning.effort,
            "summary": req.reasoning.summary or req.reasoning.generate_summary,
        }
    tools = [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": t.strict,
        }
        if t.type == "function"
        else t.model_dump(exclude_none=True)
        for t in req.tools or ()
    ]
    choice = req.tool_choice
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "metadata": req.metadata or {},
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": None,
        "reasoning": reasoning,
        "service_tier": "default",
        "store": False,  # nothing is kept
        "background": False,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "text": {"format": {"type": "text"}, **text},
        "tool_choice": choice.model_dump(exclude_none=True)
        if hasattr(choice, "model_dump")
        else choice or "auto",
        "tools": tools,
        "truncation": "disabled",
        "user": req.user,
        "error": None,
        "incomplete_details": None,
    }


def usage(chat_usage: dict[str, Any] | None, reasoning_tokens: int) -> dict[str, Any]:
    chat_usage = chat_usage or {}
    prompt = chat_usage.get("prompt_tokens", 0)
    completion = chat_usage.get("completion_tokens", 0)
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    counted = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": counted if counted is not None else reasoning_tokens},
        "total_tokens": prompt + completion,
    }


def finished(
    top: dict[str, Any], output: list[dict[str, Any]], finish_reason: str | None, usage_: dict[str, Any]
) -> dict[str, Any]:
    incomplete = finish_reason == "length"
    return {
        **top,
        "status": "incomplete" if incomplete else "completed",
        "completed_at": None if incomplete else int(time.time()),
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output,
        "usage": usage_,
    }


def reasoning_of(message: dict[str, Any]) -> str | None:
    """The chat message's (or delta's) reasoning text, under vLLM's old or new key."""
    return message.get("reasoning_content") or message.get("reasoning")


def _reasoning_item(rid: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}]
    return {"id": rid, "type": "reasoning", "summary": [], "content": content, "status": status}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(mid: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"id": mid, "type": "message", "role": "assistant", "status": status, "content": content}


def _call_item(
    fid: str, call_id: str, name: str, arguments: str, status: str, namespaces: dict[str, str]
) -> dict[str, Any]:
    item = {
        "id": fid,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
    if name in namespaces:
        item["namespace"] = namespaces[name]
    return item


def response(
    top: dict[str, Any], body: dict[str, Any], count_tokens: CountTokens, namespaces: dict[str, str]
) -> dict[str, Any]:
    """A chat.completion body as a response object (`top`: from `head`)."""
    choice = body["choices"][0]
    msg = choice["message"]
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    output: list[dict[str, Any]] = []
    reasoning = reasoning_of(msg)
    if reasoning:
        output.append(_reasoning_item(item_id("rs"), reasoning, status))
    if msg.get("content"):
        output.append(_message_item(item_id("msg"), msg["content"], status))
    for call in msg.get("tool_calls") or []:
        fn = call["function"]
        fc = _call_item(item_id("fc"), call["id"], fn["name"], fn["arguments"], "completed", namespaces)
        output.append(fc)
    tokens = count_tokens(reasoning) if reasoning else 0
    return finished(top, output, choice["finish_reason"], usage(body.get("usage"), tokens))


class ResponseEvents:
    """Chat chunks in, Responses stream events out. `start` once, `feed` each chunk, `finish` once the
    chunks end. Items open one at a time: a delta of another kind closes the open one."""

    def __init__(self, top: dict[str, Any], count_tokens: CountTokens, namespaces: dict[str, str]):
        self.top = top
        self.count_tokens = count_tokens
        self.namespaces = namespaces
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # items done, then the open one
        self.open: dict[str, Any] | None = None  # {"kind", "id", "text", and for calls "call_id", "name"}
        self.tool_items: dict[int, dict[str, Any]] = {}  # chat tool-call index → its open item
        self.finish_reason: str | None = None
        self.chat_usage: dict[str, Any] | None = None
        self.reasoning: list[str] = []

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        snapshot = {**self.top, "status": "in_progress", "output": [], "usage": None}
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if chunk.get("usage"):
            self.chat_usage = chunk["usage"]
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if reasoning := reasoning_of(delta):
                self.reasoning.append(reasoning)
                events += self._text_delta("reasoning", reasoning)
            if delta.get("content"):
                events += self._text_delta("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._tool_call(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[dict[str, Any]]:
        events = self._close()
        reasoning = "".join(self.reasoning)
        final = finished(
            self.top,
            self.output,
            self.finish_reason,
            usage(self.chat_usage, self.count_tokens(reasoning) if reasoning else 0),
        )
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=final)]

    def _status(self) -> str:
        return "incomplete" if self.finish_reason == "length" else "completed"

    def _text_delta(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self.open is None or self.open["kind"] != kind:
            events = self._close()
            iid = item_id("rs" if kind == "reasoning" else "msg")
            self.open = {"kind": kind, "id": iid, "text": []}
            if kind == "reasoning":
                item, part = _reasoning_item(iid, "", "in_progress"), {"type": "reasoning_text", "text": ""}
                item["content"] = []
            else:
                item, part = _message_item(iid, None, "in_progress"), _text_part("")
            index = len(self.output)
            events.append(self._event("response.output_item.added", output_index=index, item=item))
            events.append(
                self._event(
                    "response.content_part.added", item_id=iid, output_index=index, content_index=0, part=part
                )
            )
        self.open["text"].append(text)
        where = {"item_id": self.open["id"], "output_index": len(self.output), "content_index": 0}
        if kind == "reasoning":
            events.append(self._event("response.reasoning_text.delta", delta=text, **where))
        else:
            events.append(self._event("response.output_text.delta", delta=text, logprobs=[], **where))
        return events

    def _tool_call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        fn = call.get("function") or {}
        position = call.get("index", 0)
        if position not in self.tool_items:
            events = self._close()
            fid = item_id("fc")
            self.open = {
                "kind": "function_call",
                "id": fid,
                "text": [],
                "call_id": call.get("id") or fid,
                "name": fn.get("name") or "",
            }
            self.tool_items[position] = self.open
            item = _call_item(
                fid, self.open["call_id"], self.open["name"], "", "in_progress", self.namespaces
            )
            events.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
        if fn.get("arguments"):
            item = self.tool_items[position]
            item["text"].append(fn["arguments"])
            where = {"item_id": item["id"], "output_index": len(self.output)}
            events.append(
                self._event("response.function_call_arguments.delta", delta=fn["arguments"], **where)
            )
        return events

    def _close(self) -> list[dict[str, Any]]:
        """Close the open item: its done events, and the item joins the output."""
        if self.open is None:
            return []
        item_open, self.open = self.open, None
        iid, text, index = item_open["id"], "".join(item_open["text"]), len(self.output)
        where = {"item_id": iid, "output_index": index}
        kind = item_open["kind"]
        if kind == "function_call":
            item = _call_item(
                iid, item_open["call_id"], item_open["name"], text, "completed", self.namespaces
            )
            events = [
                self._event(
                    "response.function_call_arguments.done", arguments=text, name=item["name"], **where
                )
            ]
        elif kind == "reasoning":
            item = _reasoning_item(iid, text, self._status())
            part = item["content"][0]
            events = [
                self._event("response.reasoning_text.done", text=text, content_index=0, **where),
                self._event("response.content_part.done", content_index=0, part=part, **where),
            ]
        else:
            item = _message_item(iid, text, self._status())
            part = item["content"][0]
            events = [
                self._event("response.output_text.done", text=text, logprobs=[], content_index=0, **where),
                self._event("response.content_part.done", content_index=0, part=part, **where),
            ]
        self.output.append(item)
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events
