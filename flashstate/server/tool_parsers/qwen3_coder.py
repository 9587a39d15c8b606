"""`qwen3_coder`: the XML calls of the Qwen3-Coder and Qwen3.5/3.6 (`qwen3_5`, `qwen3_5_moe`) chat
templates, which Nemotron 3 Nano's template teaches as well (NVIDIA serves it with vLLM's
`--tool-call-parser qwen3_coder`; registered here also as `nemotron_v3`):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A parameter's value is the text between `<parameter=P>` and `</parameter>` less one newline at each end
(the templates write strings as they are and objects/arrays as JSON). With `tools`, a value becomes the
type its JSON schema gives: integer, number, boolean, null, object/array (JSON, or a Python literal);
a value that does not read as that type, a parameter not in the schema, and every value without
`tools` stay strings. `arguments` is `{"P": value, ...}` as `json.dumps` writes it.

A call is `<tool_call>` (whitespace) `<function=NAME>`, its parameters, and `</function>` (which also
closes a parameter left open); several `<function=…>` in one `<tool_call>` are several calls, and a
missing `</tool_call>` after `</function>` is let go. With `stream_arguments` the header goes out at
`<function=NAME>` and each parameter when its `</parameter>` arrives (`{"city": "Paris"`, then
`, "days": 3`), the closing `}` at `</function>`; output that stops inside a parameter drops it. A
`<tool_call>` not followed by `<function=NAME>` is content, and so (unless `stream_arguments`) is a call
the output stops inside.

Tokens to keep when detokenizing: `<tool_call>`, `</tool_call>` (the `<function=`/`<parameter=` tags
are ordinary text in these tokenizers, listed too so that a tokenizer marking them special keeps them).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from flashstate.server.tool_parsers.base import ToolParser, Tools, find_first, tool_schemas

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
_WS = " \t\r\n"
_MAX_NAME = 256
_INT = re.compile(r"[-+]?\d+")


def _tag_name(s: str, prefix: str, final: bool) -> tuple[str, str | None, int]:
    """`s` starts with `prefix`: read `NAME>` after it → ("ok", NAME, end), ("need", None, 0) or
    ("bad", None, 0). A name has no `<` or newline and is not empty."""
    end = s.find(">", len(prefix))
    name = s[len(prefix) : end if end != -1 else len(s)]
    if "<" in name or "\n" in name or len(name) > _MAX_NAME:
        return "bad", None, 0
    if end == -1:
        return ("bad" if final else "need"), None, 0
    if not name.strip():
        return "bad", None, 0
    return "ok", name.strip(), end + 1


def _types(schema: Any) -> list[str]:
    """The JSON types a parameter schema allows (`type` as a string or list, or the branches of
    `anyOf`/`oneOf`), in the schema's order; [] when it names none."""
    if not isinstance(schema, Mapping):
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t.strip().lower()]
    if isinstance(t, list):
        return [x.strip().lower() for x in t if isinstance(x, str)]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or []:
            out += [x for x in _types(branch) if x not in out]
    return out


def convert(raw: str, types: list[str]) -> Any:
    """A parameter's text as the first of `types` it reads as; the text itself when none fits (or no
    types are known)."""
    text = raw.strip()
    for t in types:
        if t in ("string", "str", "text"):
            return raw
        if t == "null" and text.lower() in ("null", "none"):
            return None
        if t in ("integer", "int") and _INT.fullmatch(text):
            return int(text)
        if t in ("number", "float"):
            if _INT.fullmatch(text):
                return int(text)
            try:
                value = float(text)
            except ValueError:
                continue
            if math.isfinite(value):
                return value
        if t in ("boolean", "bool") and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if t in ("object", "array", "dict", "list"):
            want = dict if t in ("object", "dict") else list
            for load in (json.loads, ast.literal_eval):
                try:
                    value = load(text)
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    continue
                if isinstance(value, want) and _is_json(value):
                    return value
    if types and "string" not in types and text.lower() == "null":
        return None
    return raw


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


class Qwen3CoderToolParser(ToolParser):
    OPEN_TAGS = (OPEN,)
    name = "qwen3_coder"
    special_tokens = (OPEN, CLOSE, FUNCTION, FUNCTION_END, PARAMETER, PARAMETER_END)

    def __init__(self, tools: Tools | None = None, *, stream_arguments: bool = False) -> None:
        super().__init__(tools, stream_arguments=stream_arguments)
        self._schemas = tool_schemas(self.tools)
        self._state = self._text_state
        self._function = ""
        self._param = ""
        self._value: list[str] = []
        self._nparams = 0

    def _at_open(self, tag: str) -> None:
        self._state = self._open_state

    def _open_state(self, final: bool) -> bool:
        """After `<tool_call>`: a call when `<function=NAME>` follows, else the tag is content."""
        rest = self._buf[len(OPEN) :]
        found = self._function_head(rest.lstrip(_WS), final)
        if found == "need":
            return False
        if found == "bad":
            self._content(OPEN)
            self._buf = rest
            self._state = self._text_state
        return True

    def _function_head(self, s: str, final: bool) -> str:
        """`s` at a possible `<function=NAME>`: "call" (begun, buffer past it), "need" or "bad"."""
        if not s.startswith(FUNCTION):
            return "need" if FUNCTION.startswith(s) and not final else "bad"
        status, name, end = _tag_name(s, FUNCTION, final)
        if status != "ok":
            return status
        self._begin_call(name or "")
        self._function, self._nparams = name or "", 0
        self._buf = s[end:]
        self._state = self._function_state
        return "call"

    def _function_state(self, final: bool) -> bool:
        """Inside `<function=…>`: parameters until `</function>` (or `</tool_call>`)."""
        s = self._buf.lstrip(_WS)
        self._buf = s
        if not s:
            return False
        if s.startswith(PARAMETER):
            status, name, end = _tag_name(s, PARAMETER, final)
            if status == "need":
                return False
            if status == "ok":
                self._param, self._value = name or "", []
                self._buf = s[end:]
                self._state = self._value_state
                return True
            self._buf = s[len(PARAMETER) :]  # a broken tag: skip it like any stray text
            return True
        if s.startswith(FUNCTION_END):
            self._buf = s[len(FUNCTION_END) :]
            self._close_function()
            self._state = self._after_function_state
            return True
        if s.startswith(CLOSE):
            self._buf = s[len(CLOSE) :]
            self._close_function()
            self._state = self._text_state
            return True
        if not final and any(t.startswith(s) for t in (PARAMETER, FUNCTION_END, CLOSE)):
            return False
        nxt = s.find("<", 1)  # stray text inside the function: skipped
        self._buf = s[nxt:] if nxt != -1 else ""
        return bool(self._buf)

    def _value_state(self, final: bool) -> bool:
        i, tag = find_first(self._buf, (PARAMETER_END, FUNCTION_END))
        if tag is None:
            if final:  # the output stopped inside the value: the parameter is dropped
                self._buf, self._value = "", []
                return False
            self._value.append(self._buf[:i])
            self._buf = self._buf[i:]
            return False
        self._value.append(self._buf[:i])
        self._buf = self._buf[i + len(tag) :]
        self._close_parameter()
        if tag == FUNCTION_END:
            self._close_function()
            self._state = self._after_function_state
        else:
            self._state = self._function_state
        return True

    def _after_function_state(self, final: bool) -> bool:
        """After `</function>`: `</tool_call>`, or another `<function=…>` in the same block; other text
        closes the block and is content."""
        s = self._buf.lstrip(_WS)
        self._buf = s
        if not s:
            return False
        if s.startswith(CLOSE):
            self._buf = s[len(CLOSE) :]
            self._state = self._text_state
            return True
        if s.startswith(FUNCTION) or (FUNCTION.startswith(s) and not final):
            found = self._function_head(s, final)
            if found == "need":
                return False
            if found == "call":
                return True
        elif CLOSE.startswith(s) and not final:
            return False
        self._state = self._text_state
        return True

    def _close_parameter(self) -> None:
        raw = "".join(self._value)
        raw = raw[1:] if raw.startswith("\n") else raw
        raw = raw[:-1] if raw.endswith("\n") else raw
        schema = self._schemas.get(self._function, {})
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        param_schema = props.get(self._param) if isinstance(props, Mapping) else None
        value = convert(raw, _types(param_schema)) if param_schema is not None else raw
        key = json.dumps(self._param, ensure_ascii=False)
        self._args(("{" if self._nparams == 0 else ", ") + key + ": " + json.dumps(value, ensure_ascii=False))
        self._nparams += 1
        self._value = []

    def _close_function(self) -> None:
        self._args(self._truncated())
        self._end_call()

    def _truncated(self) -> str:
        return "}" if self._nparams else "{}"
