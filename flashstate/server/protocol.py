"""Request bodies of the OpenAI API (the fields we serve, plus vLLM's sampling extensions), parsed strictly:
a wrong type is a 400 naming the field, never a silent coercion. Unknown fields are ignored, as OpenAI
clients send fields a server may not know.

Extensions (vLLM names): `top_k`, `min_p`, `ignore_eos`, `stop_token_ids`, `include_stop_str_in_output`,
`skip_special_tokens`, `cache_salt`; chat also `chat_template_kwargs`, `add_generation_prompt` and
`include_reasoning`.
Not supported, answered with 400 when asked for: `n` > 1, `best_of` > 1, `echo`, `suffix`, non-zero
penalties, `logit_bias`, non-text content parts.
Output constraints (`response_format`, `structured_outputs`, `guided_*`): server/structured_fields.py.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flashstate.sampling_params import SamplingParams
from flashstate.server.errors import bad_request
from flashstate.server.structured_fields import ResponseFormat, StructuredOutputsField, structured_output
from flashstate.tokenizer import JsonObject

MAX_CACHE_SALT_CHARS = 1024


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Open(BaseModel):
    """A part of the body that reaches the chat template as given: unknown keys are kept."""

    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage on every chunk


class _SamplingFields(_Strict):
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    n: int = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    return_token_ids: bool = False  # vLLM: generated token ids on each choice (delta ids when streaming)
    # vLLM: prefix-cache hits only between requests of the same salt (multi-tenant isolation)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)
    # output constraints (server/structured_fields.py)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """Build SamplingParams; its ValueError ("top_p must be ...") becomes a 400 naming the field."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0):
                raise bad_request(f"{name} is not supported (only 0)", param=name)
        if self.repetition_penalty not in (None, 1):
            raise bad_request("repetition_penalty is not supported (only 1)", param="repetition_penalty")
        if self.logit_bias:
            raise bad_request("logit_bias is not supported", param="logit_bias")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream=true", param="stream_options")
        fields: dict[str, Any] = {
            "n": self.n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": self.seed,
            "max_tokens": max_tokens,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos,
            "logprobs": logprobs,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "structured_output": structured_output(self),  # compiled here: a 400 naming its field
        }
        try:
            # None: the field's default, except max_tokens, where None means up to max_model_len.
            return SamplingParams(**{k: v for k, v in fields.items() if v is not None or k == "max_tokens"})
        except ValueError as e:
            field = str(e).split(" ", 1)[0]
            raise bad_request(str(e), param=field if field in fields else None) from e

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. `prompt`: text, token ids, or a list of either (a batch: one choice each)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]
        if not prompt:
            raise bad_request("prompt must not be empty", param="prompt")
        return list(prompt)

    def to_sampling_params(self) -> SamplingParams:
        if self.echo:
            raise bad_request("echo is not supported", param="echo")
        if self.suffix:
            raise bad_request("suffix is not supported", param="suffix")
        if self.best_of not in (None, 1):
            raise bad_request("best_of > 1 is not supported", param="best_of")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad_request(f"logprobs must be in [0, 20], got {self.logprobs}", param="logprobs")
        return self._sampling_params(self.max_tokens, self.logprobs)


class TextPart(_Open):
    type: str
    text: str | None = None


class FunctionCall(_Open):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def to_template(self) -> dict[str, Any]:
        """The message as the chat template sees it (OpenAI shape; unset fields left out). As in vLLM:
        `content: null` beside `tool_calls` is "" (templates concatenate it), and each call's `arguments`
        JSON text is an object (templates iterate `arguments|items`) that writes back as the same text."""
        if isinstance(self.content, list):
            bad = next((p.type for p in self.content if p.type != "text"), None)
            if bad is not None:
                raise bad_request(f"content parts of type {bad!r} are not supported (text only)")
        if self.content is None and not self.tool_calls:
            raise bad_request(f"a {self.role} message needs content or tool_calls", param="messages")
        message = self.model_dump(exclude_none=True)
        if self.content is None:
            message["content"] = ""
        for call in message.get("tool_calls", ()):
            call["function"]["arguments"] = _arguments_object(call["function"]["arguments"])
        return message


def _arguments_object(arguments: str | dict[str, Any]) -> str | dict[str, Any]:
    """A call's `arguments` as a dict: JSON text of an object parses (keeping its text for `tojson`);
    anything else (a dict already, text that is no JSON object) stays as it is, for templates that print
    it."""
    if not isinstance(arguments, str):
        return arguments
    text = arguments if arguments.strip() else "{}"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return arguments
    return JsonObject(value, text) if isinstance(value, dict) else arguments


class FunctionDef(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: dict[str, str]


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions. `tools` and `tool_choice` reach the chat template; assistant messages may
    carry `tool_calls`, and `tool` messages the results."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    include_reasoning: bool = True  # vLLM: False drops the reasoning a reasoning parser splits off

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise bad_request("top_logprobs needs logprobs=true", param="top_logprobs")
            if not 0 <= self.top_logprobs <= 20:
                raise bad_request(f"top_logprobs must be in [0, 20], got {self.top_logprobs}", "top_logprobs")
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._sampling_params(max_tokens, logprobs)

    def template_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            if self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice):
                raise bad_request("tool_choice needs tools", param="tool_choice")
            return None
        tools = [t.model_dump(exclude_none=True) for t in self.tools]
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.get("name")
            if name not in {t["function"]["name"] for t in tools}:
                raise bad_request(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        return tools

    def template_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.chat_template_kwargs or {})
        if self.tool_choice is not None:
            choice = self.tool_choice
            kwargs["tool_choice"] = choice.model_dump() if isinstance(choice, NamedToolChoice) else choice
        return kwargs


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def now() -> int:
    return int(time.time())
