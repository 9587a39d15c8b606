"""Chat output → the OpenAI message: `reasoning_content`, `content` and `tool_calls`, whole or as deltas.

Per request (`ChatParsing.plan`), the tool choice decides how tool calls come out (vLLM's rules):

    no tools, or tool_choice "none"   the text is content (tools still reach the template)
    "auto" (the default with tools)   the server's `--tool-call-parser` reads calls out of the text; without
                                      `--enable-auto-tool-choice` the request is a 400
    "required", a named function      the output is constrained to JSON and read as calls (tool_choice.py)

and a `--reasoning-parser` splits the reasoning off first (not under "required" or a named function,
whose output is constrained JSON from its first token). One `ChoiceParser` reads a choice's text
through: special-token filter → reasoning parser → tool parser, the same machine whether the text comes
whole or in deltas, so a streamed reply carries what the non-streamed one does.

Special tokens: a parser's tags must be in the text. Where the tokenizer marks one of them special,
`skip_special_tokens` would drop it, so the request decodes with special tokens kept and the filter
removes the other special tokens' text (what skipping would have removed).

finish_reason: "tool_calls" when a call came out and the engine stopped on its own ("stop"), for "auto"
and "required"; a named function keeps "stop" (OpenAI's and vLLM's answer); "length" stays "length".
`parallel_tool_calls: false`: at most the first call (for "required", the schema allows one).

Calls in a streamed reply go out as `--tool-parser-stream-arguments` says (by default vLLM's way: the
header once the name is complete, then argument fragments as generated, so a client sees a long argument
grow and no stream goes quiet for the minutes a large file edit takes); a whole reply has no reason to
commit early and holds each call until it is complete and valid, so a malformed call is content there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from flashstate.config import EngineConfig
from flashstate.engine.structured import compile_grammar
from flashstate.sampling_params import SamplingParams
from flashstate.server.errors import bad_request
from flashstate.server.protocol import ChatCompletionRequest, NamedToolChoice
from flashstate.server.reasoning import ReasoningParser, get_reasoning_parser
from flashstate.server.tool_choice import (
    NamedCallParser,
    RequiredCallsParser,
    constraint,
    named_schema,
    required_schema,
)
from flashstate.server.tool_parsers import (
    ContentDelta,
    Delta,
    ToolCallDelta,
    ToolParser,
    collect,
    delta_message,
    get_tool_parser,
)
from flashstate.server.tool_parsers.base import find_first
from flashstate.structured_output import StructuredOutput
from flashstate.tokenizer import Tokenizer

Mode = Literal["none", "auto", "required", "named"]
AUTO_NEEDS_FLAGS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


class SpecialTextFilter:
    """Removes the given special tokens' texts from streamed text (a tail that may still become one is
    held until the next piece tells)."""

    def __init__(self, texts: frozenset[str]) -> None:
        self._texts = tuple(sorted(texts, key=len, reverse=True))  # the longest wins at one position
        self._buf = ""

    def feed(self, text: str) -> str:
        buf, out, i = self._buf + text, [], 0
        while True:
            at, tag = find_first(buf, self._texts, i)
            out.append(buf[i:at])
            if tag is None:
                self._buf = buf[at:]
                return "".join(out)
            i = at + len(tag)

    def finish(self) -> str:
        rest, self._buf = self._buf, ""
        return rest


@dataclass(frozen=True)
class OutputPlan:
    """How one request's output is read (see the module docstring)."""

    mode: Mode
    tools: list[dict[str, Any]] = field(default_factory=list)
    named: str | None = None
    parallel: bool = True
    tool_parser: type[ToolParser] | None = None  # "auto" only
    stream_arguments: bool = True
    reasoning_parser: type[ReasoningParser] | None = None  # None also under required / named
    reasons: bool = False  # the server splits reasoning off: the message has reasoning fields
    include_reasoning: bool = True
    structured_output: StructuredOutput | None = None
    keep_special_tokens: bool = False  # decode with special tokens, `strip` filtered out
    strip: frozenset[str] = frozenset()

    @property
    def parses(self) -> bool:
        """Whether the output is read at all (else the text is the content, as it comes)."""
        return self.mode != "none" or self.reasoning_parser is not None

    def sampling_params(self, params: SamplingParams) -> SamplingParams:
        changes: dict[str, Any] = {}
        if self.structured_output is not None:
            if params.structured_output is not None:
                raise bad_request(
                    "tool_choice required or a named function constrains the output itself; it cannot be "
                    "combined with another output constraint (response_format, structured_outputs)",
                    param="tool_choice",
                )
            changes["structured_output"] = self.structured_output
        if self.keep_special_tokens and params.skip_special_tokens:
            changes["skip_special_tokens"] = False
        return replace(params, **changes) if changes else params

    def parser(self, prompt: str, streamed: bool) -> ChoiceParser | None:
        """A parser for one choice of a request whose rendered prompt is `prompt` (None: not parsed).
        A streamed one gives calls' arguments as they come when the server says so; a whole reply
        gives only calls that completed valid (the rest of the text is content)."""
        return ChoiceParser(self, prompt, streamed and self.stream_arguments) if self.parses else None

    def finish_reason(self, reason: str | None, called: bool) -> str | None:
        if called and reason == "stop" and self.mode in ("auto", "required"):
            return "tool_calls"
        return reason


class ChoiceParser:
    """One choice's text → message fields, in deltas (`feed`, `finish`) or whole (`message`)."""

    def __init__(self, plan: OutputPlan, prompt: str, stream_arguments: bool) -> None:
        self.plan = plan
        self.called = False  # a tool call came out
        self._filter = SpecialTextFilter(plan.strip) if plan.keep_special_tokens and plan.strip else None
        self._reasoning: ReasoningParser | None = None
        if plan.reasoning_parser is not None:
            starts = plan.reasoning_parser.starts_in_reasoning_for(prompt)
            self._reasoning = plan.reasoning_parser(True if starts is None else starts)
        self._tools: ToolParser | NamedCallParser | RequiredCallsParser | None = None
        if plan.mode == "auto" and plan.tool_parser is not None:
            self._tools = plan.tool_parser(plan.tools, stream_arguments=stream_arguments)
        elif plan.mode == "required":
            self._tools = RequiredCallsParser()
        elif plan.mode == "named":
            assert plan.named is not None
            self._tools = NamedCallParser(plan.named)

    def feed(self, text: str) -> dict[str, Any] | None:
        """The chunk delta for a new piece of text (None when it settles nothing yet)."""
        return self._delta(*self._step(text, final=False))

    def finish(self) -> dict[str, Any] | None:
        """The chunk delta of what was held back, once the output has ended."""
        return self._delta(*self._step("", final=True))

    def message(self, text: str) -> dict[str, Any]:
        """The chat.completion message for a finished output."""
        reasoning, events = self._step(text, final=True)
        content, calls = collect(events)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        if self.plan.reasons:
            shown = (reasoning or None) if self.plan.include_reasoning else None
            message["reasoning"] = message["reasoning_content"] = shown
        return message

    def _step(self, text: str, final: bool) -> tuple[str, list[Delta]]:
        if self._filter is not None:
            text = self._filter.feed(text) + (self._filter.finish() if final else "")
        reasoning = ""
        if self._reasoning is not None:
            d = self._reasoning.feed(text)
            reasoning, text = d.reasoning, d.content
            if final:
                d = self._reasoning.finish()
                reasoning, text = reasoning + d.reasoning, text + d.content
        if self._tools is not None:
            events = self._tools.feed(text) + (self._tools.finish() if final else [])
        else:
            events = [ContentDelta(text)] if text else []
        if not self.plan.parallel:
            events = [e for e in events if not (isinstance(e, ToolCallDelta) and e.index > 0)]
        self.called = self.called or any(isinstance(e, ToolCallDelta) for e in events)
        return reasoning, events

    def _delta(self, reasoning: str, events: list[Delta]) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        if reasoning and self.plan.include_reasoning:
            out["reasoning"] = out["reasoning_content"] = reasoning
        out.update(delta_message(events) or {})
        return out or None


class ChatParsing:
    """The server's parsers (`--tool-call-parser`, `--reasoning-parser`) and the tokenizer's special
    tokens; `plan` applies them to a request."""

    def __init__(self, config: EngineConfig, tokenizer: Tokenizer) -> None:
        name = config.tool_call_parser
        self.tool_parser = get_tool_parser(name) if name is not None else None
        self.auto_tools = config.enable_auto_tool_choice and self.tool_parser is not None
        name = config.reasoning_parser
        self.reasoning_parser = get_reasoning_parser(name) if name is not None else None
        self.stream_arguments = config.tool_parser_stream_arguments
        self.special_texts = tokenizer.special_token_texts

    def plan(self, req: ChatCompletionRequest) -> OutputPlan:
        """Raises APIError 400 for a tool choice the request or the server cannot serve."""
        tools = req.template_tools() or []
        choice = req.tool_choice
        parallel = req.parallel_tool_calls is not False
        if not tools or choice == "none":
            mode: Mode = "none"
        elif choice is None or choice == "auto":
            if not self.auto_tools:
                raise bad_request(AUTO_NEEDS_FLAGS, param="tool_choice")
            mode = "auto"
        elif choice == "required":
            mode = "required"
        else:
            mode = "named"
        named = choice.function.get("name") if isinstance(choice, NamedToolChoice) else None
        structured = None
        if mode == "required":
            structured = constraint(required_schema(tools, parallel))
        elif mode == "named":
            assert named is not None
            structured = constraint(named_schema(tools, named))
        if structured is not None:
            try:
                compile_grammar(structured)  # cached: the engine's matcher reuses it
            except ValueError as e:
                raise bad_request(
                    f"tools: a parameters schema cannot constrain the output: {e}", "tools"
                ) from e
        reasoning = self.reasoning_parser if mode in ("none", "auto") else None
        needed = set(reasoning.special_tokens if reasoning is not None else ())
        if mode == "auto" and self.tool_parser is not None:
            needed |= set(self.tool_parser.special_tokens)
        keep = bool(needed & self.special_texts) and req.skip_special_tokens
        return OutputPlan(
            mode=mode,
            tools=tools if mode != "none" else [],
            named=named,
            parallel=parallel,
            tool_parser=self.tool_parser if mode == "auto" else None,
            stream_arguments=self.stream_arguments,
            reasoning_parser=reasoning,
            reasons=self.reasoning_parser is not None,
            include_reasoning=req.include_reasoning,
            structured_output=structured,
            keep_special_tokens=keep,
            strip=frozenset(self.special_texts - needed) if keep else frozenset(),
        )
