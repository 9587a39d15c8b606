"""OpenAI Responses request bodies, parsed strictly (a wrong type is a 400 naming the field), and their
translation into the chat request (`ChatCompletionRequest`) the chat pipeline serves.

The server keeps nothing between requests: each one carries its whole conversation in `input`.

Honoured: `model`, `input` (a string, or items: `message` with role user / system / developer / assistant
and string content or `input_text` / `output_text` / `refusal` parts; `function_call` {call_id, name,
arguments}, joined to the assistant turn before it; `function_call_output` {call_id, output};
`reasoning` items, their `reasoning_text` content given to the template as the next assistant turn's
`reasoning_content`, their summaries and encrypted content dropped), `instructions` (the system
message), `tools` (type function: name, description, parameters, strict), `tool_choice` (none, auto,
required, {type: function, name}), `parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`,
`top_k` (vLLM's), `stream`, `text.format` (text; json_schema and json_object → the chat request's
`response_format`), `reasoning.effort` (the template's `reasoning_effort`; "none" also sets
`enable_thinking` false), `metadata` (echoed back), `user` / `safety_identifier` (as chat's `user`).
Accepted with no effect on the output: `store` (vLLM's rule: with nothing stored, `store=true`, OpenAI's
default, is answered as `store: false`), `reasoning.summary` (reasoning comes back as `reasoning_text`
content, never summarized: `summary` is []), `include: ["reasoning.encrypted_content"]` (reasoning is
not encrypted), `prompt_cache_key` (the prefix cache is shared by every request anyway),
`prompt_cache_retention: "in_memory"`, `truncation: "disabled"`, `service_tier` auto / default,
`max_tool_calls` (it bounds built-in tools, which do not exist here), `stream_options`, `top_logprobs: 0`.
Refused with a 400 naming the field: `previous_response_id` and `conversation` (stateless server),
`background`, `prompt`, built-in tools, other `include` values, `truncation: "auto"`, `top_logprobs` > 0,
`text.verbosity`, non-text input parts (images, files, audio), item types other than the above.

Unknown fields are ignored, as in the chat API's bodies (protocol.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flashstate.server.errors import bad_request
from flashstate.server.protocol import ChatCompletionRequest

# OpenAI fields with no meaning on a stateless server without built-in tools: refused unless null.
_REFUSED = {
    "previous_response_id": "not supported: this server is stateless (send the whole conversation in input)",
    "conversation": "not supported: this server is stateless (send the whole conversation in input)",
    "prompt": "prompt templates are not supported",
    "context_management": "context management is not supported",
    "moderation": "moderation is not supported",
    "image": "image generation is not supported",
    "access_programs": "access programs are not supported",
    "background_options": "background mode is not supported",
    "prompt_cache_options": "prompt_cache_options is not supported",
}
_INCLUDABLE = {"reasoning.encrypted_content"}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ContentPart(_Strict):
    type: str
    text: str | None = None
    refusal: str | None = None


class InputItem(_Strict):
    """Any input item; which fields a `type` needs is checked where the item is translated. A message
    may leave out `type`."""

    type: str | None = None
    role: str | None = None
    content: str | list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None
    id: str | None = None
    status: str | None = None


class FunctionTool(_Strict):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    tools: list[FunctionTool] | None = None  # a `namespace` tool's functions
    external_web_access: bool | None = None  # `web_search`


class ToolChoiceFunction(_Strict):
    type: str
    name: str | None = None


class TextFormat(_Strict):
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # summary's old name


class ResponsesRequest(_Strict):
    """POST /v1/responses."""

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    store: bool | None = None
    include: list[str] | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    max_tool_calls: int | None = None
    stream_options: dict[str, Any] | None = None
    # refused when set (_REFUSED)
    previous_response_id: Any = None
    conversation: Any = None
    prompt: Any = None
    context_management: Any = None
    moderation: Any = None
    image: Any = None
    access_programs: Any = None
    background_options: Any = None
    prompt_cache_options: Any = None

    def to_chat_request(self) -> ChatCompletionRequest:
        self._refuse()
        fields: dict[str, Any] = {
            "model": self.model,
            "messages": self._chat_messages(),
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stream": self.stream,
            "user": self.user or self.safety_identifier,
            "parallel_tool_calls": self.parallel_tool_calls,
        }
        if self.stream:  # usage on every chunk: the final response's usage
            fields["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        if functions := self.functions():
            fields["tools"] = [_chat_tool(t, where) for _, t, where in functions]
        if self.tool_choice is not None:
            fields["tool_choice"] = _chat_tool_choice(self.tool_choice)
        if self.text is not None and self.text.format is not None and self.text.format.type != "text":
            fields["response_format"] = _response_format(self.text.format)
        if self.reasoning is not None and self.reasoning.effort is not None:
            kwargs: dict[str, Any] = {"reasoning_effort": self.reasoning.effort}
            if self.reasoning.effort == "none":
                kwargs["enable_thinking"] = False
            fields["chat_template_kwargs"] = kwargs
        return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})

    def functions(self) -> list[tuple[str | None, FunctionTool, str]]:
        """The function tools offered to the model: (namespace, tool, where in the body). A `namespace`
        tool's functions are offered by their own names; a `web_search` tool without external web access
        (what Codex CLI sends) is accepted and not offered: this server runs no hosted tools."""
        out = []
        for i, tool in enumerate(self.tools or ()):
            if tool.type == "namespace":
                if not tool.name:
                    raise bad_request(f"tools[{i}].name is required", param=f"tools[{i}].name")
                out += [(tool.name, t, f"tools[{i}].tools[{j}]") for j, t in enumerate(tool.tools or ())]
            elif tool.type == "web_search" and tool.external_web_access is False:
                continue
            else:
                out.append((None, tool, f"tools[{i}]"))
        names = [t.name for _, t, _ in out]
        if len(set(names)) < len(names):
            raise bad_request("two tools share a name (namespaces included)", param="tools")
        return out

    def tool_namespaces(self) -> dict[str, str]:
        """Function name → its namespace, for the function_call items of the reply."""
        return {t.name: ns for ns, t, _ in self.functions() if ns is not None and t.name}

    def _refuse(self) -> None:
        for name, why in _REFUSED.items():
            if getattr(self, name) is not None:
                raise bad_request(f"{name}: {why}", param=name)
        if self.background:
            raise bad_request("background mode is not supported (nothing is stored)", param="background")
        for value in self.include or ():
            if value not in _INCLUDABLE:
                raise bad_request(f"include {value!r} is not supported", param="include")
        if self.truncation == "auto":
            raise bad_request('truncation "auto" is not supported (only "disabled")', param="truncation")
        if self.top_logprobs:
            raise bad_request("top_logprobs is not supported", param="top_logprobs")
        if self.service_tier not in (None, "auto", "default"):
            raise bad_request(f"service_tier {self.service_tier!r} is not supported", param="service_tier")
        if self.prompt_cache_retention == "24h":
            raise bad_request('prompt_cache_retention "24h" is not supported', param="prompt_cache_retention")
        if self.text is not None and self.text.verbosity is not None:
            raise bad_request("text.verbosity is not supported", param="text.verbosity")

    def _chat_messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.instructions is not None:
            out.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            out.append({"role": "user", "content": self.input})
            return out
        assistant: dict[str, Any] | None = None  # the open assistant turn, which function calls join
        reasoning: list[str] = []
        for i, item in enumerate(self.input):
            where = f"input[{i}]"
            kind = item.type or ("message" if item.role is not None else None)
            if kind == "reasoning":
                reasoning += [p.text or "" for p in item.content or [] if isinstance(p, ContentPart)]
                continue
            if (kind == "message" and item.role == "assistant") or kind == "function_call":
                if kind == "message" or assistant is None:
                    assistant = {"role": "assistant", "content": ""}
                    out.append(assistant)
                if reasoning:
                    assistant["reasoning_content"] = "".join(reasoning)
                    reasoning = []
                if kind == "message":
                    assistant["content"] = _text(item.content, f"{where}.content", assistant=True)
                else:
                    assistant.setdefault("tool_calls", []).append(_tool_call(item, where))
                continue
            assistant = None
            if kind == "message":
                if item.role not in ("user", "system", "developer"):
                    raise bad_request(f"{where}.role {item.role!r} is not a message role", f"{where}.role")
                role = "system" if item.role == "developer" else item.role
                out.append({"role": role, "content": _text(item.content, f"{where}.content")})
            elif kind == "function_call_output":
                if item.call_id is None or item.output is None:
                    raise bad_request(f"{where}: a function_call_output needs call_id and output", where)
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": item.call_id,
                        "content": _text(item.output, f"{where}.output"),
                    }
                )
            else:
                raise bad_request(
                    f"{where}.type {kind!r}: this input item type is not supported", f"{where}.type"
                )
        return out


def _text(content: str | list[ContentPart] | None, where: str, assistant: bool = False) -> str:
    if content is None:
        raise bad_request(f"{where} is required", param=where)
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type in ("input_text", "output_text") and part.text is not None:
            texts.append(part.text)
        elif assistant and part.type == "refusal" and part.refusal is not None:
            texts.append(part.refusal)
        else:
            raise bad_request(
                f"{where}[{j}]: content parts of type {part.type!r} are not supported (text only)",
                param=f"{where}[{j}].type",
            )
    return "".join(texts)


def _tool_call(item: InputItem, where: str) -> dict[str, Any]:
    if item.call_id is None or item.name is None or item.arguments is None:
        raise bad_request(f"{where}: a function_call needs call_id, name and arguments", param=where)
    return {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }


def _chat_tool(tool: FunctionTool, where: str) -> dict[str, Any]:
    if tool.type != "function":
        raise bad_request(
            f"{where}.type {tool.type!r}: only function tools (alone or in a namespace) are supported",
            param=f"{where}.type",
        )
    if not tool.name:
        raise bad_request(f"{where}.name is required", param=f"{where}.name")
    function: dict[str, Any] = {"name": tool.name}
    for key in ("description", "parameters", "strict"):
        if (value := getattr(tool, key)) is not None:
            function[key] = value
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | ToolChoiceFunction) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.type != "function" or not choice.name:
        raise bad_request(
            f"tool_choice of type {choice.type!r} is not supported (none, auto, required, or a function "
            "by name)",
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(fmt: TextFormat) -> dict[str, Any]:
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise bad_request("text.format.schema is required for json_schema", param="text.format.schema")
    spec: dict[str, Any] = {"name": fmt.name or "output", "schema": fmt.schema_}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    if fmt.description is not None:
        spec["description"] = fmt.description
    return {"type": "json_schema", "json_schema": spec}
