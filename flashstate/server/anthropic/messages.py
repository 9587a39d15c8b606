"""The chat pipeline's reply as an Anthropic message: a chat.completion body → a `message` object
(`message`), chat.completion.chunk dicts → Anthropic's stream events (`MessageEvents`).

Content blocks, in order: `thinking` (the chat message's reasoning), `text` (its content), one `tool_use`
per tool call (`input`: the parsed arguments). `stop_reason`: `tool_use` for tool calls, `max_tokens` at
the length limit, `stop_sequence` (with the sequence) when one of `stop_sequences` ended the text,
`end_turn` otherwise. A thinking block's `signature` is "" (nothing signs it here).

Usage follows Anthropic's convention: the prompt is split into `cache_read_input_tokens` (served from the
prefix cache: the chat usage's `prompt_tokens_details.cached_tokens`) and `input_tokens` (the rest, the
tokens prefilled for this request), so that input_tokens + cache_read_input_tokens +
cache_creation_input_tokens is the whole prompt; `cache_creation_input_tokens` is 0 (caching is
automatic and costs no extra write).

A stream is `message_start` (usage: the input split, output 0), then per block `content_block_start`,
its deltas (`text_delta`, `thinking_delta`, `input_json_delta`), `content_block_stop`, then
`message_delta` (stop_reason, stop_sequence, cumulative usage) and `message_stop`.
"""

from __future__ import annotations

import json
from typing import Any

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def message_id(chat_id: str) -> str:
    return "msg_" + chat_id.rpartition("-")[2]


def usage(chat_usage: dict[str, Any] | None) -> dict[str, int]:
    chat_usage = chat_usage or {}
    prompt = chat_usage.get("prompt_tokens", 0)
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": prompt - cached,
        "output_tokens": chat_usage.get("completion_tokens", 0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def stop_reason(
    finish_reason: str | None, matched: Any, stop_sequences: list[str] | None
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from the chat choice's finish_reason and stop_reason (the matched stop
    string, or the stop token id)."""
    if finish_reason == "stop" and isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn"), None


def tool_input(arguments: Any) -> Any:
    """A tool call's arguments (a JSON string from the chat pipeline) as the tool_use block's `input`."""
    if not isinstance(arguments, str):
        return arguments
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments  # not JSON: given as it came rather than lost


def reasoning_of(message: dict[str, Any]) -> str | None:
    """The chat message's (or delta's) reasoning text, under vLLM's old or new key."""
    return message.get("reasoning_content") or message.get("reasoning")


def message(body: dict[str, Any], stop_sequences: list[str] | None) -> dict[str, Any]:
    """A chat.completion body as an Anthropic message."""
    choice = body["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if reasoning := reasoning_of(msg):
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls") or []:
        fn = call["function"]
        content.append(
            {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": tool_input(fn["arguments"])}
        )
    reason, sequence = stop_reason(choice["finish_reason"], choice.get("stop_reason"), stop_sequences)
    if msg.get("tool_calls"):
        reason, sequence = "tool_use", None
    return {
        "id": message_id(body["id"]),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": body["model"],
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(body.get("usage")),
    }


class MessageEvents:
    """Chat chunks in, Anthropic stream events out, as (event name, data) pairs. `feed` each chunk, then
    `finish` once the chunks end. Blocks open one at a time: a delta of another kind closes the open one."""

    def __init__(self, stop_sequences: list[str] | None):
        self.stop_sequences = stop_sequences
        self.started = False
        self.index = -1  # the open block's index, -1 before the first
        self.kind: str | None = None  # the open block's type; None when none is open
        self.tool_blocks: dict[int, int] = {}  # chat tool-call index → block index
        self.finish_reason: str | None = None
        self.matched: Any = None
        self.usage: dict[str, Any] | None = None
        self.called = False

    def feed(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if not self.started:
            self.started = True
            start = {
                "id": message_id(chunk["id"]),
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": chunk["model"],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**usage(self.usage), "output_tokens": 0},
            }
            events.append(("message_start", {"type": "message_start", "message": start}))
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if reasoning := reasoning_of(delta):
                events += self._delta("thinking", {"type": "thinking_delta", "thinking": reasoning})
            if delta.get("content"):
                events += self._delta("text", {"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                events += self._tool_call(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                self.matched = choice.get("stop_reason")
        return events

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        events = self._close()
        reason, sequence = stop_reason(self.finish_reason, self.matched, self.stop_sequences)
        if self.called:
            reason, sequence = "tool_use", None
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}}
        events.append(("message_delta", {**delta, "usage": usage(self.usage)}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def _open(self, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        events = self._close()
        self.index += 1
        self.kind = block["type"]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return events

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.kind is None:
            return []
        self.kind = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _delta(self, kind: str, delta: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        events = []
        if self.kind != kind:
            block = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            events = self._open(block)
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})
        )
        return events

    def _tool_call(self, call: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        fn = call.get("function") or {}
        position = call.get("index", 0)
        if position not in self.tool_blocks:
            self.called = True
            events = self._open(
                {"type": "tool_use", "id": call.get("id") or "", "name": fn.get("name") or "", "input": {}}
            )
            self.tool_blocks[position] = self.index
        if fn.get("arguments"):
            delta = {"type": "input_json_delta", "partial_json": fn["arguments"]}
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": self.tool_blocks[position], "delta": delta},
                )
            )
        return events
