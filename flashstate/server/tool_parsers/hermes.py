"""`hermes`: the JSON-in-tags calls that the Qwen2.5, Qwen3 and Qwen3-Next chat templates teach:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(the templates' system prompt: "For each function call, return a json object with function name and
arguments within <tool_call></tool_call> XML tags"). Several calls are several such blocks.

A call is complete when its arguments object closes and is valid JSON (then `}` and `</tool_call>` are
expected; a missing `</tool_call>` at the end of the output is let go). `arguments` is the model's own
JSON text for the object, not re-serialized. With `stream_arguments` the header goes out once
`<tool_call>{"name": "NAME", "arguments": {` has been read and the object's text follows as it comes;
a `</tool_call>` outside a string ends arguments that never closed.

A block in another shape (keys in the other order, arguments given as a JSON string, "parameters" for
"arguments") is held whole until `</tool_call>` and parsed then. What is not a call is content: a
`<tool_call>` not followed by `{`, a block that does not parse, a call the output stops inside.

Tokens to keep when detokenizing: `<tool_call>`, `</tool_call>`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from flashstate.server.tool_parsers.base import ToolParser, Tools

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_WS = " \t\r\n"
_ARG_KEYS = ("arguments", "parameters")
_SPECIAL = re.compile(r'["\\{}\[\]<]')
_IN_STRING = re.compile(r'["\\]')


class _Need(Exception):
    pass


class _Fail(Exception):
    pass


def match_header(s: str) -> tuple[str, int]:
    """`{"name": "NAME", "arguments": {` at the start of `s` (whitespace allowed between the tokens) →
    (NAME, index after the `{` that opens the arguments). Raises _Need when `s` is a prefix of such a
    header, _Fail when it cannot be one."""
    i = 0

    def ws(i: int) -> int:
        while i < len(s) and s[i] in _WS:
            i += 1
        if i == len(s):
            raise _Need
        return i

    def lit(i: int, options: tuple[str, ...]) -> int:
        i = ws(i)
        rest = s[i:]
        for o in options:
            if rest.startswith(o):
                return i + len(o)
        if any(o.startswith(rest) for o in options):
            raise _Need
        raise _Fail

    i = lit(i, ("{",))
    i = lit(i, ('"name"',))
    i = lit(i, (":",))
    i = ws(i)
    if s[i] != '"':
        raise _Fail
    j = i + 1
    while True:
        if j >= len(s):
            raise _Need
        if s[j] == "\\":
            j += 2
        elif s[j] == '"':
            break
        elif s[j] in "\n\r" or j - i > 512:
            raise _Fail
        else:
            j += 1
    try:
        name = json.loads(s[i : j + 1])
    except ValueError:
        raise _Fail from None
    if not name.strip():
        raise _Fail
    i = lit(j + 1, (",",))
    i = lit(i, tuple(f'"{k}"' for k in _ARG_KEYS))
    i = lit(i, (":",))
    i = lit(i, ("{",))
    return name.strip(), i


def parse_call(obj: Any) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a decoded `{"name": ..., "arguments": {...}}`, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        return None
    args = next((obj[k] for k in _ARG_KEYS if k in obj), {})
    if isinstance(args, str):  # arguments given as JSON text
        try:
            decoded = json.loads(args)
        except ValueError:
            return None
        return (obj["name"].strip(), args) if isinstance(decoded, dict) else None
    if not isinstance(args, dict):
        return None
    return obj["name"].strip(), json.dumps(args, ensure_ascii=False)


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


class HermesToolParser(ToolParser):
    OPEN_TAGS = (OPEN,)
    name = "hermes"
    special_tokens = (OPEN, CLOSE)

    def __init__(self, tools: Tools | None = None, *, stream_arguments: bool = False) -> None:
        super().__init__(tools, stream_arguments=stream_arguments)
        self._state = self._text_state
        self._depth = 0
        self._in_str = False
        self._escape = False
        self._tail_brace = False
        self._scan_from = 0

    def _valid(self, arguments: str) -> bool:
        return _is_object(arguments)

    def _at_open(self, tag: str) -> None:
        self._state = self._open_state

    def _not_a_call(self) -> bool:
        """The `<tool_call>` at the head of the buffer starts no call: it is content; rescan the rest."""
        self._content(OPEN)
        self._buf = self._buf[len(OPEN) :]
        self._state = self._text_state
        return True

    def _open_state(self, final: bool) -> bool:
        rest = self._buf[len(OPEN) :]
        try:
            name, end = match_header(rest)
        except _Need:
            return self._not_a_call() if final else False
        except _Fail:
            if rest.lstrip(_WS).startswith("{"):
                self._state, self._scan_from = self._whole_state, len(OPEN)
                return True
            return self._not_a_call()
        self._begin_call(name)
        self._args("{")
        self._buf = rest[end:]
        self._depth, self._in_str, self._escape, self._tail_brace = 1, False, False, False
        self._state = self._args_state
        return True

    def _whole_state(self, final: bool) -> bool:
        """A block not in the streamable shape: wait for `</tool_call>`, then parse it whole."""
        end = self._buf.find(CLOSE, self._scan_from)
        if end == -1:
            if final:
                return self._not_a_call()
            self._scan_from = max(len(OPEN), len(self._buf) - len(CLOSE) + 1)
            return False
        try:
            call = parse_call(json.loads(self._buf[len(OPEN) : end]))
        except ValueError:
            call = None
        if call is None:
            return self._not_a_call()
        self._begin_call(call[0])
        self._args(call[1])
        self._buf = self._buf[end + len(CLOSE) :]
        self._end_call()
        self._state = self._text_state
        return True

    def _args_state(self, final: bool) -> bool:
        """Inside the arguments object: pass its text on until the brace that closes it."""
        buf, pos = self._buf, 0
        while True:
            if self._in_str:
                if self._escape:
                    if pos >= len(buf):
                        break
                    self._escape, pos = False, pos + 1
                    continue
                m = _IN_STRING.search(buf, pos)
                if m is None:
                    pos = len(buf)
                    break
                pos = m.end()
                if m.group() == "\\":
                    self._escape = True
                else:
                    self._in_str = False
                continue
            m = _SPECIAL.search(buf, pos)
            if m is None:
                pos = len(buf)
                break
            c, at = m.group(), m.start()
            pos = m.end()
            if c == '"':
                self._in_str = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._args(buf[:pos])
                    self._buf = buf[pos:]
                    self._state = self._tail_state
                    return True
            elif c == "<":  # not JSON: a `</tool_call>` here ends a call whose arguments never closed
                tail = buf[at:]
                if tail.startswith(CLOSE):
                    self._args(buf[:at])
                    self._buf = tail[len(CLOSE) :]
                    self._end_call()
                    self._state = self._text_state
                    return True
                if CLOSE.startswith(tail) and not final:
                    self._args(buf[:at])
                    self._buf = tail
                    return False
        self._args(buf[:pos])
        self._buf = buf[pos:]
        return False

    def _tail_state(self, final: bool) -> bool:
        """After the arguments: the object's `}` and `</tool_call>`; anything else ends the call early."""
        s = self._buf.lstrip(_WS)
        self._buf = s
        if not s:
            if final:  # the arguments are complete; a missing `</tool_call>` is let go
                self._end_call()
                self._state = self._text_state
            return False
        if not self._tail_brace and s.startswith("}"):
            self._tail_brace = True
            self._buf = s[1:]
            return True
        if s.startswith(CLOSE):
            self._buf = s[len(CLOSE) :]
        elif CLOSE.startswith(s) and not final:
            return False
        self._end_call()
        self._state = self._text_state
        return True
