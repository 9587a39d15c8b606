"""`kimi_k2`: the calls of the Kimi K2 chat templates (Kimi-Linear's uses the same format and tokens):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

(no newlines in the model's output; shown wrapped). The text before `<|tool_call_argument_begin|>` is
Kimi's own call id, `functions.NAME:IDX`, which K2 Thinking's template writes back into later turns
(`<|tool_call_begin|>{{ tool_call['id'] }}…`), so it is kept as the `ToolCall.id` (as vLLM does); the
name is the id without the `functions.` prefix and the `:IDX` suffix.

A call ends at `<|tool_call_end|>` (or a `<|tool_calls_section_end|>`/`<|tool_call_begin|>` that comes
first) and is valid when its arguments, without the whitespace around them, are a JSON object. With
`stream_arguments` the header goes out once the id is complete (`<|tool_call_argument_begin|>` read) and
the arguments text as it comes. Calls are read inside a section or bare. What is not a call is content:
a malformed id, arguments that are not a JSON object, a call the output stops inside.

Tokens to keep when detokenizing: the five markers (Kimi K2's tokenizer does not mark them special).
"""

from __future__ import annotations

import json
import re

from flashstate.server.tool_parsers.base import ToolParser, Tools, find_first

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENT_BEGIN, CALL_END = (
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
_WS = " \t\r\n"
_MAX_ID = 512
_ID = re.compile(r"(?:functions\.)?(?P<name>[^\s<>]+?)(?::\d+)?")


def name_of(call_id: str) -> str | None:
    """`functions.get_weather:0` → `get_weather` (None when the id names no function)."""
    m = _ID.fullmatch(call_id)
    return m.group("name") if m else None


class KimiK2ToolParser(ToolParser):
    OPEN_TAGS = (SECTION_BEGIN, CALL_BEGIN)
    name = "kimi_k2"
    special_tokens = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END)

    def __init__(self, tools: Tools | None = None, *, stream_arguments: bool = False) -> None:
        super().__init__(tools, stream_arguments=stream_arguments)
        self._state = self._text_state
        self._in_section = False
        self._args_started = False
        self._args_ws = ""

    def _at_open(self, tag: str) -> None:
        if tag == SECTION_BEGIN:
            self._buf = self._buf[len(tag) :]
            self._in_section = True
            self._state = self._section_state
        else:
            self._in_section = False
            self._state = self._id_state

    def _section_state(self, final: bool) -> bool:
        s = self._buf.lstrip(_WS)
        self._buf = s
        if not s:
            return False
        if s.startswith(CALL_BEGIN):
            self._state = self._id_state
            return True
        if s.startswith(SECTION_END):
            self._buf = s[len(SECTION_END) :]
            self._after_call = True
        elif not final and (CALL_BEGIN.startswith(s) or SECTION_END.startswith(s)):
            return False
        self._in_section = False  # stray text ends the section; it is content
        self._state = self._text_state
        return True

    def _id_state(self, final: bool) -> bool:
        """The buffer starts with `<|tool_call_begin|>`: read the id up to `<|tool_call_argument_begin|>`."""
        rest = self._buf[len(CALL_BEGIN) :]
        end = rest.find(ARGUMENT_BEGIN)
        if end == -1:
            lt = rest.find("<")
            viable = len(rest) <= _MAX_ID and (lt == -1 or ARGUMENT_BEGIN.startswith(rest[lt:]))
            if viable and not final:
                return False
            name = None
        else:
            name = name_of(rest[:end].strip())
        if name is None:
            self._content(CALL_BEGIN)
            self._buf = rest
            self._in_section = False
            self._state = self._text_state
            return True
        self._begin_call(name, rest[:end].strip())
        self._buf = rest[end + len(ARGUMENT_BEGIN) :]
        self._args_started, self._args_ws = False, ""
        self._state = self._args_state
        return True

    def _args_state(self, final: bool) -> bool:
        if not self._args_started:
            self._buf = self._buf.lstrip(_WS)
            if not self._buf:
                return False
            self._args_started = True
        i, tag = find_first(self._buf, (CALL_END, SECTION_END, CALL_BEGIN))
        if tag is None:
            if final:
                self._buf = ""
                return False
            self._send(self._buf[:i])
            self._buf = self._buf[i:]
            return False
        self._send(self._buf[:i])
        self._args_ws = ""
        if tag == CALL_BEGIN:
            self._buf = self._buf[i:]
            self._state = self._id_state
        else:
            self._buf = self._buf[i + len(tag) :]
            if tag == SECTION_END:
                self._in_section = False
            self._state = self._section_state if self._in_section else self._text_state
        self._end_call()
        return True

    def _valid(self, arguments: str) -> bool:
        try:
            return isinstance(json.loads(arguments), dict)
        except ValueError:
            return False

    def _send(self, text: str) -> None:
        """Argument text, its trailing whitespace held until more text follows it."""
        text = self._args_ws + text
        body = text.rstrip(_WS)
        self._args(body)
        self._args_ws = text[len(body) :]
