"""`tool_choice: "required"` and a named function: the output is constrained to JSON (a structured-output
schema), and that JSON is read straight into tool calls, not through the model's tool-call format.

    required   `[{"name": NAME, "parameters": {...}}, ...]`: a non-empty array whose items are, for some
               tool, its name and an object its `parameters` schema accepts (at most one item with
               `parallel_tool_calls: false`); each item is a call
    named      the named function's `parameters` object itself: one call of that function

(vLLM's schemas, with no keys beside name and parameters in an item.) `$defs` of the tools' schemas are
gathered at the root of the array schema, where their `#/$defs/...` references point; two tools defining
one name differently is a 400.

The parsers read the constrained output as it streams: a call's header (index, id, name) goes out once its
name is complete, and its arguments — the text the model wrote for the object — as they come. Text that
is not of the expected shape (only if the constraint was not applied) is content from there on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flashstate.server.errors import bad_request
from flashstate.server.tool_parsers import ContentDelta, Delta, ToolCall, ToolCallDelta, collect, new_call_id
from flashstate.server.tool_parsers.base import append_delta
from flashstate.structured_output import StructuredOutput

_WS = " \t\r\n"
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def _parameters(function: Mapping[str, Any]) -> dict[str, Any]:
    params = function.get("parameters")
    return dict(params) if isinstance(params, Mapping) and params else dict(EMPTY_PARAMETERS)


def required_schema(tools: list[Mapping[str, Any]], parallel: bool = True) -> dict[str, Any]:
    """The JSON schema of `tool_choice: "required"` over OpenAI-shaped `tools`."""
    defs: dict[str, Any] = {}
    items = []
    for tool in tools:
        function = tool["function"]
        params = _parameters(function)
        own = params.pop("$defs", None) or {}
        if not isinstance(own, Mapping):
            raise bad_request(f"tools: $defs of {function['name']!r} must be an object", param="tools")
        for name, schema in own.items():
            if name in defs and defs[name] != schema:
                raise bad_request(
                    f"tools define $defs/{name} differently; tool_choice required needs them to agree",
                    param="tools",
                )
            defs[name] = schema
        items.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [function["name"]]}, "parameters": params},
                "required": ["name", "parameters"],
                "additionalProperties": False,  # else a grammar lets the model add keys without end
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def named_schema(tools: list[Mapping[str, Any]], name: str) -> dict[str, Any]:
    """The JSON schema of a named `tool_choice`: that function's parameters."""
    function = next(t["function"] for t in tools if t["function"]["name"] == name)
    return _parameters(function)


def _key(raw: str) -> str:
    """An object key from the text between its quotes ("" when its escapes are not JSON's)."""
    try:
        return json.loads('"' + raw + '"')
    except ValueError:
        return ""


def constraint(schema: dict[str, Any]) -> StructuredOutput:
    return StructuredOutput(json=schema)


class NamedCallParser:
    """The output is the arguments of one call of `name` (feed/finish/extract as a ToolParser)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._started = False
        self._finished = False

    def feed(self, text: str) -> list[Delta]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if not self._started:
            text = text.lstrip(_WS)
            if not text:
                return []
            self._started = True
            return [ToolCallDelta(0, "", new_call_id(), self.name), ToolCallDelta(0, text)]
        return [ToolCallDelta(0, text)] if text else []

    def finish(self) -> list[Delta]:
        if self._finished:
            return []
        self._finished = True
        if self._started:
            return []
        self._started = True
        return [ToolCallDelta(0, "{}", new_call_id(), self.name)]

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        parser = NamedCallParser(self.name)
        return collect(parser.feed(text) + parser.finish())


class RequiredCallsParser:
    """The output is `[{"name": ..., "parameters": {...}}, ...]`, read character by character (keys in
    either order; the arguments of a call whose name comes later are held until it does)."""

    def __init__(self) -> None:
        self._stage = "start"  # start → array → item → array ... → done; or content
        self._depth = 0  # open brackets, the array's included
        self._in_string = False
        self._escape = False
        self._member = "key"  # inside an item: key → colon → value → after → key ...
        self._key: list[str] = []
        self._value_key = ""
        self._value: list[str] = []
        self._value_kind = ""  # container | string | scalar
        self._name: str | None = None
        self._args: list[str] = []  # this item's arguments not yet out
        self._has_args = False
        self._index = 0
        self._header = False
        self._seen: list[str] = []  # everything before the first call, in case it turns out content
        self._out: list[Delta] = []
        self._finished = False

    # -- the public API

    def feed(self, text: str) -> list[Delta]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        for i, c in enumerate(text):
            if self._stage == "content":
                self._emit(ContentDelta(text[i:]))
                break
            before_calls = not self._index and not self._header
            if before_calls:
                self._seen.append(c)
            self._char(c)
            if self._stage == "content":  # this character broke the shape
                self._emit(ContentDelta("".join(self._seen) + text[i + 1 :] if before_calls else text[i:]))
                break
        self._flush_args()
        return self._take()

    def finish(self) -> list[Delta]:
        if self._finished:
            return []
        self._finished = True
        if self._stage == "item" and self._header:  # the output stopped inside a call: it stands
            self._close_item()
        elif self._stage != "content" and not self._index and self._seen:  # no call in it: content
            self._emit(ContentDelta("".join(self._seen)))
        return self._take()

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        parser = RequiredCallsParser()
        return collect(parser.feed(text) + parser.finish())

    # -- the machine

    def _char(self, c: str) -> None:
        if self._stage == "start":
            if c == "[":
                self._stage, self._depth = "array", 1
            elif c not in _WS:
                self._to_content()
            return
        if self._stage == "array":
            if c == "{":
                self._stage, self._depth, self._member = "item", 2, "key"
            elif c == "]":
                self._stage, self._depth = "done", 0
            elif c not in _WS and c != ",":
                self._to_content()
            return
        if self._stage == "done":
            if c not in _WS:
                self._to_content()
            return
        self._item_char(c)

    def _item_char(self, c: str) -> None:
        """One character inside an item object (depth 2 is the item's own level)."""
        if self._member == "value":
            self._value_char(c)
            return
        if self._member == "in_key":
            self._lex_string(c)
            if self._in_string:
                self._key.append(c)
            else:
                self._member = "colon"
            return
        if c in _WS:
            return
        if self._member == "key" and c == '"':
            self._member, self._in_string, self._key = "in_key", True, []
        elif self._member == "key" and c == "}":
            self._close_item()
        elif self._member == "colon" and c == ":":
            self._member, self._value_key = "value_start", _key("".join(self._key))
        elif self._member == "value_start":
            self._member, self._value = "value", []
            self._value_kind = "container" if c in "{[" else "string" if c == '"' else "scalar"
            if c in "{[":
                self._depth += 1
            elif c == '"':
                self._in_string = True
            self._take_value_char(c)
        elif self._member == "after" and c == ",":
            self._member = "key"
        elif self._member == "after" and c == "}":
            self._close_item()
        else:
            self._to_content()

    def _value_char(self, c: str) -> None:
        kind = self._value_kind
        if kind == "scalar" and (c in _WS or c in ",}"):
            self._end_value()
            self._item_char(c)
            return
        if kind == "string" or self._in_string:
            self._lex_string(c)
        elif c in "{[":
            self._depth += 1
        elif c in "}]":
            self._depth -= 1
        elif c == '"':
            self._in_string = True
        self._take_value_char(c)
        if (kind == "container" and self._depth == 2) or (kind == "string" and not self._in_string):
            self._end_value()

    def _lex_string(self, c: str) -> None:
        if self._escape:
            self._escape = False
        elif c == "\\":
            self._escape = True
        elif c == '"':
            self._in_string = False

    def _take_value_char(self, c: str) -> None:
        if self._value_key == "parameters":
            self._args.append(c)
            self._has_args = True
        elif self._value_key == "name":
            self._value.append(c)

    def _end_value(self) -> None:
        self._member = "after"
        if self._value_key == "name" and self._name is None:
            try:
                name = json.loads("".join(self._value))
            except ValueError:
                name = None
            if isinstance(name, str) and name:
                self._name = name
                self._emit(ToolCallDelta(self._index, "", new_call_id(), name))
                self._header = True

    def _close_item(self) -> None:
        """The item closed (or the output stopped inside it): its call, if it named a function."""
        if self._header:
            if not self._has_args:
                self._args.append("{}")
            self._flush_args()
            self._index += 1
        self._stage, self._depth = "array", 1
        self._name, self._header, self._has_args, self._args = None, False, False, []
        self._in_string = self._escape = False

    def _flush_args(self) -> None:
        if self._header and self._args:
            self._emit(ToolCallDelta(self._index, "".join(self._args)))
            self._args = []

    def _to_content(self) -> None:
        """Not the constrained shape: with no call out yet, everything is content; after one, the rest
        (`feed` says which)."""
        self._stage = "content"

    def _emit(self, event: Delta) -> None:
        append_delta(self._out, event)

    def _take(self) -> list[Delta]:
        out, self._out = self._out, []
        return out
