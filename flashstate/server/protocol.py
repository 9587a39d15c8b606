"""Request bodies of the OpenAI API (the fields we serve, plus vLLM's sampling extensions), parsed strictly:
a wrong type is a 400 naming the field, never a silent coercion.

Every field vLLM's ChatCompletionRequest / CompletionRequest knows is either served or, set to anything but
its default, a 400 naming it (`UNSERVED`, `CHAT_UNSERVED`, `COMPLETION_UNSERVED`). Fields vLLM does not
know are ignored, as vLLM ignores them (it logs them): OpenAI's `metadata`, `store`, `service_tier`,
`prompt_cache_key`, `safety_identifier`, `modalities`, `prediction`, `verbosity`, `web_search_options`...;
`user` is declared and ignored, as in vLLM; `return_token_offsets` and `return_mm_kwargs` vLLM itself
ignores outside its render endpoints.

Extensions (vLLM names): `top_k`, `min_p`, `ignore_eos`, `stop_token_ids`, `include_stop_str_in_output`,
`skip_special_tokens`, `cache_salt`; chat also `chat_template_kwargs`, `add_generation_prompt` and
`include_reasoning`.
Served vLLM sampling fields: `n`, penalties, `logit_bias`, `allowed_token_ids`, `min_tokens`, top
logprobs, `priority` (with --scheduling-policy priority), completions' `echo` (not with logprobs: prompt
logprobs are not computed, so `echo` with `logprobs` and `prompt_logprobs` are 400s).
Not supported, answered with 400 when asked for: `best_of` other than `n`, `suffix`, non-text content parts.
Output constraints (`response_format`, `structured_outputs`, `guided_*`): server/structured_fields.py.
"""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flashstate.sampling_params import SamplingParams
from flashstate.server.errors import bad_request
from flashstate.server.structured_fields import ResponseFormat, StructuredOutputsField, structured_output
from flashstate.tokenizer import JsonObject

MAX_CACHE_SALT_CHARS = 1024
# vLLM request fields this server does not serve -> the values that mean "not used" (a 400 otherwise).
# A field a request model declares is served, and never checked here.
UNSERVED: dict[str, tuple[Any, ...]] = {
    "use_beam_search": (False,),
    "watermarking": (None, False),
    "length_penalty": (1.0,),
    "spaces_between_special_tokens": (True,),
    "truncate_prompt_tokens": (None,),
    "truncation_side": (None,),
    "prompt_logprobs": (None,),
    "logprob_token_ids": (None,),
    "bad_words": (None, []),
    "request_id": (None,),
    "session_id": (None,),
    "return_tokens_as_token_ids": (None, False),
    "routed_experts_prompt_start": (0,),
    "kv_transfer_params": (None,),
    "ec_transfer_params": (None,),
    "vllm_xargs": (None,),
    "repetition_detection": (None,),
    "thinking_token_budget": (None, -1),
    "stream_interval": (None,),
    "logits_processors": (None,),
    "guided_whitespace_pattern": (None,),
    "structural_tag": (None,),
}
CHAT_UNSERVED: dict[str, tuple[Any, ...]] = {
    **UNSERVED,
    "add_special_tokens": (False,),
    "echo": (False,),
    "continue_final_message": (False,),
    "chat_template": (None,),  # per request; the server's is --chat-template
    "documents": (None,),
    "media_io_kwargs": (None,),
    "mm_processor_kwargs": (None,),
    "return_prompt_text": (None, False),
}
COMPLETION_UNSERVED: dict[str, tuple[Any, ...]] = {
    **UNSERVED,
    "add_special_tokens": (True,),
    "prompt_embeds": (None,),
}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Open(BaseModel):
    """A part of the body that reaches the chat template as given: unknown keys are kept."""

    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage on every chunk


class _SamplingFields(_Strict):
    _unserved: ClassVar[dict[str, tuple[Any, ...]]] = UNSERVED

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
    allowed_token_ids: list[int] | None = None
    min_tokens: int = 0
    priority: int = 0  # vLLM: lower first, with --scheduling-policy priority (else only 0)
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

    @model_validator(mode="before")
    @classmethod
    def _refuse_unserved(cls, data: Any) -> Any:
        """A vLLM field this server does not serve, set to something but its default: a 400 naming it."""
        if isinstance(data, dict):
            for name, defaults in cls._unserved.items():
                if name in data and name not in cls.model_fields and data[name] not in defaults:
                    raise bad_request(
                        f"{name} is not supported by this server (only {defaults[0]!r})",
                        param=name,
                        code="unsupported_parameter",
                    )
        return data

    def _sampling_params(
        self, max_tokens: int | None, logprobs: int | None, defaults: dict[str, Any] | None = None
    ) -> SamplingParams:
        """Build SamplingParams; its ValueError ("top_p must be ...") becomes a 400 naming the field.
        `defaults`: the model's (--generation-config) for the fields the request leaves unset; its
        `max_tokens` caps the request's."""
        defaults = defaults or {}
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream=true", param="stream_options")
        if (cap := defaults.get("max_tokens")) is not None:
            max_tokens = cap if max_tokens is None else min(max_tokens, cap)

        def default(name: str) -> Any:
            value = getattr(self, name)
            return defaults.get(name) if value is None else value

        fields: dict[str, Any] = {
            "n": self.n,
            "temperature": default("temperature"),
            "top_p": default("top_p"),
            "top_k": default("top_k"),
            "min_p": default("min_p"),
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": default("repetition_penalty"),
            "logit_bias": _token_bias(self.logit_bias),
            "allowed_token_ids": self.allowed_token_ids,
            "min_tokens": self.min_tokens,
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

    def check_priority(self, policy: str) -> None:
        """vLLM's rule: a priority other than 0 needs the priority scheduling policy."""
        if self.priority != 0 and policy != "priority":
            raise bad_request(
                f"priority must be 0: the server schedules {policy} (start it with --scheduling-policy "
                f"priority), got {self.priority}",
                param="priority",
            )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. `prompt`: text, token ids, or a list of either (a batch: one choice each)."""

    _unserved: ClassVar[dict[str, tuple[Any, ...]]] = COMPLETION_UNSERVED

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

    def to_sampling_params(
        self, defaults: dict[str, Any] | None = None, max_logprobs: int = 20
    ) -> SamplingParams:
        if self.echo and self.logprobs is not None:
            raise bad_request(
                "echo with logprobs needs prompt logprobs, which this server does not compute", param="echo"
            )
        if self.suffix:
            raise bad_request("suffix is not supported", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise bad_request(
                f"best_of must equal n ({self.n}) or be unset: best_of > n is not supported (as in vLLM V1), "
                f"got {self.best_of}",
                param="best_of",
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= max_logprobs:
            raise bad_request(
                f"logprobs must be in [0, {max_logprobs}], got {self.logprobs}", param="logprobs"
            )
        return self._sampling_params(self.max_tokens, self.logprobs, defaults)


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

    _unserved: ClassVar[dict[str, tuple[Any, ...]]] = CHAT_UNSERVED

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
    # vLLM: reaches the chat template as `reasoning_effort`, with `enable_thinking` = effort != "none"
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    include_reasoning: bool = True  # vLLM: False drops the reasoning a reasoning parser splits off

    def to_sampling_params(
        self, defaults: dict[str, Any] | None = None, max_logprobs: int = 20
    ) -> SamplingParams:
        if self.top_logprobs is not None:
            if self.top_logprobs and not self.logprobs:
                raise bad_request("top_logprobs needs logprobs=true", param="top_logprobs")
            if not 0 <= self.top_logprobs <= max_logprobs:
                raise bad_request(
                    f"top_logprobs must be in [0, {max_logprobs}], got {self.top_logprobs}", "top_logprobs"
                )
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._sampling_params(max_tokens, logprobs, defaults)

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
        if self.reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", self.reasoning_effort)
            kwargs.setdefault("enable_thinking", self.reasoning_effort != "none")
        if self.tool_choice is not None:
            choice = self.tool_choice
            kwargs["tool_choice"] = choice.model_dump() if isinstance(choice, NamedToolChoice) else choice
        return kwargs


def _token_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """logit_bias's keys (token ids as JSON strings) as ints; a key that is no token id is a 400."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()):
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
        out[int(key)] = value
    return out


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def now() -> int:
    return int(time.time())
