"""Anthropic Messages request bodies, parsed strictly (a wrong type is a 400 naming the field), and their
translation into the chat request (`ChatCompletionRequest`) the chat pipeline serves.

Honoured: `model`, `max_tokens`, `messages` (string content or blocks: `text`; `tool_use` in assistant
turns; `tool_result` in user turns, its content a string or text blocks, `is_error` written into the
result as an `Error: ` prefix; `thinking` in assistant turns, as the template's `reasoning_content`;
`redacted_thinking`, opaque, dropped), `system` (string or text blocks), `stop_sequences`, `temperature`,
`top_p`, `top_k`, `tools` (client tools: `name`, `description`, `input_schema`), `tool_choice` (`auto`,
`any` → required, `tool` → that function, `none`; `disable_parallel_tool_use` → parallel_tool_calls
false), `stream`, `thinking` (`enabled` / `adaptive` → the template's `enable_thinking=True`,
`disabled` → False; `budget_tokens` is checked as Anthropic does, ≥ 1024 and < max_tokens, and is a
bound only through max_tokens), `output_config.effort` (the template's `reasoning_effort`) and
`output_config.format` (a JSON-schema `response_format`), and vLLM's `chat_template_kwargs`.
Accepted with no effect on the output, as they only label the request: `metadata`, `service_tier`,
`cache_control` (top level and on blocks: the prefix cache is automatic), `speed: "standard"`,
`user_profile_id`, `workspace_id`, `citations` on text blocks.
`system` turns inside `messages` are rendered in place as user turns; `context_management` edits that
keep everything (`clear_thinking_*` with `keep: "all"`, sent by Claude Code) are accepted.
Refused with a 400 naming the field: image / document / search_result / server-tool blocks, server tools,
`container`, `mcp_servers`, other `context_management` edits, `diagnostics`, `inference_geo`,
`speed: "fast"`.

Unknown fields are ignored, as in the OpenAI API's bodies (protocol.py).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flashstate.server.errors import bad_request
from flashstate.server.protocol import ChatCompletionRequest

MIN_THINKING_BUDGET = 1024  # Anthropic's floor for budget_tokens


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ContentBlock(_Strict):
    """Any content block; which fields a `type` needs is checked where the block is translated."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    cache_control: dict[str, Any] | None = None
    citations: list[dict[str, Any]] | None = None


class Message(_Strict):
    # "system": an instruction inside the conversation (Claude Code sends its agent list this way); it is
    # rendered in place as a user turn, so the prompt before it stays a cacheable prefix
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" for client tools; the server tools' types are dated names
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


# Anthropic fields with no meaning here: refused unless absent or null.
_REFUSED = ("container", "mcp_servers", "diagnostics", "inference_geo")


class _Prompt(_Strict):
    """What a prompt is made of: the fields `count_tokens` and `create` share."""

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None
    speed: Literal["standard", "fast"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extension
    # refused when set (_REFUSED)
    container: Any = None
    mcp_servers: Any = None
    context_management: Any = None
    diagnostics: Any = None
    inference_geo: Any = None

    def chat_fields(self) -> dict[str, Any]:
        """The chat request's fields this part of the body decides."""
        for name in _REFUSED:
            if getattr(self, name) is not None:
                raise bad_request(f"{name} is not supported by this server", param=name)
        _check_context_management(self.context_management)
        if self.speed == "fast":
            raise bad_request('speed "fast" is not supported (only "standard")', param="speed")
        fields: dict[str, Any] = {"model": self.model, "messages": self._chat_messages()}
        kwargs = dict(self.chat_template_kwargs or {})
        if self.thinking is not None:
            kwargs["enable_thinking"] = self.thinking.type != "disabled"
        if self.output_config is not None:
            if self.output_config.effort is not None:
                kwargs["reasoning_effort"] = self.output_config.effort
            if self.output_config.format is not None:
                fields["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": self.output_config.format.json_schema},
                }
        if kwargs:
            fields["chat_template_kwargs"] = kwargs
        if self.tools:
            fields["tools"] = [_chat_tool(t, i) for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            fields.update(_chat_tool_choice(self.tool_choice, bool(self.tools)))
        return fields

    def _chat_messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.system is not None:
            system = self.system
            if not isinstance(system, str):
                system = "".join(_text(b, f"system[{j}]") for j, b in enumerate(system))
            out.append({"role": "system", "content": system})
        for i, message in enumerate(self.messages):
            out += _chat_turn(message, f"messages[{i}]")
        return out


class CountTokensRequest(_Prompt):
    """POST /v1/messages/count_tokens."""

    def to_chat_request(self) -> ChatCompletionRequest:
        return _validated(self.chat_fields())


class MessagesRequest(_Prompt):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None

    def to_chat_request(self) -> ChatCompletionRequest:
        if self.thinking is not None and self.thinking.type == "enabled":
            budget = self.thinking.budget_tokens
            if budget is None:
                raise bad_request("thinking.budget_tokens is required when thinking is enabled", "thinking")
            if not MIN_THINKING_BUDGET <= budget < self.max_tokens:
                raise bad_request(
                    f"thinking.budget_tokens must be >= {MIN_THINKING_BUDGET} and less than max_tokens "
                    f"({self.max_tokens}), got {budget}",
                    param="thinking.budget_tokens",
                )
        fields = self.chat_fields()
        fields.update(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p)
        fields.update(top_k=self.top_k, stop=self.stop_sequences, stream=self.stream)
        if self.stream:  # usage on every chunk: message_start reports the input tokens
            fields["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return _validated(fields)


def _validated(fields: dict[str, Any]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})


def _chat_tool(tool: Tool, i: int) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise bad_request(
            f"tools[{i}].type {tool.type!r}: server tools are not supported (client tools only)",
            param=f"tools[{i}].type",
        )
    if tool.input_schema is None:
        raise bad_request(f"tools[{i}].input_schema is required", param=f"tools[{i}].input_schema")
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: ToolChoice, has_tools: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if choice.disable_parallel_tool_use is not None:
        fields["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    if choice.type == "tool":
        if not choice.name:
            raise bad_request("tool_choice.name is required when tool_choice.type is 'tool'", "tool_choice")
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif has_tools or choice.type != "any":
        fields["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    else:
        raise bad_request("tool_choice 'any' needs tools", param="tool_choice")
    return fields


def _text(block: ContentBlock, where: str) -> str:
    if block.type != "text":
        raise bad_request(f"{where}.type {block.type!r} is not supported here (text only)", f"{where}.type")
    if block.text is None:
        raise bad_request(f"{where}.text is required", param=f"{where}.text")
    return block.text


def _check_context_management(value: Any) -> None:
    """Server-side context edits: only those that change nothing pass (Claude Code sends
    `clear_thinking_*` with `keep: "all"` on every request); any edit that would drop context is a 400."""
    if value is None:
        return
    edits = value.get("edits") if isinstance(value, dict) else None
    if not isinstance(edits, list) or set(value) - {"edits"}:
        raise bad_request("context_management must be {edits: [...]}", param="context_management")
    for i, edit in enumerate(edits):
        kind = edit.get("type", "") if isinstance(edit, dict) else ""
        if not (kind.startswith("clear_thinking") and edit.get("keep") == "all"):
            raise bad_request(
                f"context_management.edits[{i}]: {kind or edit!r} is not supported (only clear_thinking "
                'with keep "all", which keeps everything)',
                param=f"context_management.edits[{i}]",
            )


def _chat_turn(message: Message, where: str) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages, in block order: a user turn's tool results become `tool`
    messages, its text a user message; an assistant turn is one message (text, reasoning, tool calls)."""
    role = "user" if message.role == "system" else message.role
    if isinstance(message.content, str):
        return [{"role": role, "content": message.content}]
    if message.role == "assistant":
        return [_assistant(message.content, where)]
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(message.content):
        here = f"{where}.content[{j}]"
        if block.type == "tool_result":
            if texts:
                out.append({"role": "user", "content": "".join(texts)})
                texts = []
            out.append(_tool_result(block, here))
        else:
            texts.append(_text(block, here))
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant(blocks: list[ContentBlock], where: str) -> dict[str, Any]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        here = f"{where}.content[{j}]"
        if block.type == "tool_use":
            if block.id is None or block.name is None or not isinstance(block.input, dict | str):
                raise bad_request(f"{here}: a tool_use block needs id, name and an object input", here)
            # a string input: arguments that were not JSON (a call cut short), re-sent as they came
            arguments = (
                block.input if isinstance(block.input, str) else json.dumps(block.input, ensure_ascii=False)
            )
            calls.append(
                {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}
            )
        elif block.type == "thinking":
            if block.thinking is None:
                raise bad_request(f"{here}.thinking is required", param=f"{here}.thinking")
            reasoning.append(block.thinking)
        elif block.type != "redacted_thinking":  # opaque (encrypted by Anthropic): nothing to render
            texts.append(_text(block, here))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def _tool_result(block: ContentBlock, where: str) -> dict[str, Any]:
    if block.tool_use_id is None:
        raise bad_request(f"{where}.tool_use_id is required", param=f"{where}.tool_use_id")
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        text = "\n".join(_text(b, f"{where}.content[{k}]") for k, b in enumerate(content))
    if block.is_error:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}
