"""StructuredOutput: the constraint a request puts on its output (vLLM's StructuredOutputsParams names).

Exactly one constraint is set:

- `json`: a JSON schema, as a dict or as its JSON text.
- `regex`: the output fullmatches this regular expression.
- `choice`: the output is exactly one of these strings.
- `grammar`: a grammar in the syntax the grammar backend accepts (EBNF / GBNF / Lark).
- `json_object`: the output is any JSON object.
- `structural_tag`: a structural-tag specification (JSON text) as the backend accepts.

This module only checks the shape of the constraint; whether a schema, regex or grammar compiles is
checked by the engine's grammar compiler (engine/structured/), which the server calls at request time.
"""

from __future__ import annotations

import json as _json
from dataclasses import dataclass

# The request fields that each carry one constraint, in the order errors name them.
CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
MAX_CHOICES = 1024


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    json: dict | str | None = None  # a JSON schema (dict or its JSON text)
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None  # EBNF / GBNF / Lark as the backend accepts
    json_object: bool = False  # any JSON object
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    parsed = _json.loads(self.json)
                except ValueError as e:
                    raise ValueError(f"json must be a JSON schema; its text does not parse: {e}") from None
                if not isinstance(parsed, dict | bool):
                    raise ValueError("json must be a JSON schema (an object)")
            elif not isinstance(self.json, dict):
                raise ValueError(f"json must be a JSON schema (a dict or its JSON text), got {self.json!r}")
        for name in ("regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or value == ""):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            choice = self.choice
            if not isinstance(choice, list | tuple) or not all(isinstance(c, str) for c in choice):
                raise ValueError(f"choice must be a list of strings, got {choice!r}")
            if not choice:
                raise ValueError("choice must hold at least one string")
            if len(choice) > MAX_CHOICES:
                raise ValueError(f"choice may hold at most {MAX_CHOICES} strings, got {len(choice)}")
            object.__setattr__(self, "choice", tuple(choice))
        if not isinstance(self.json_object, bool):
            raise ValueError(f"json_object must be a bool, got {self.json_object!r}")
        set_fields = self.set_fields()
        if len(set_fields) != 1:
            if not set_fields:
                raise ValueError(f"structured output needs exactly one of {', '.join(CONSTRAINT_FIELDS)}")
            raise ValueError(f"structured output takes exactly one constraint, got {', '.join(set_fields)}")

    def set_fields(self) -> tuple[str, ...]:
        """The constraint fields this instance sets (one, once constructed)."""
        unset = {name: None for name in CONSTRAINT_FIELDS} | {"json_object": False}
        return tuple(name for name in CONSTRAINT_FIELDS if getattr(self, name) is not unset[name])

    @property
    def kind(self) -> str:
        """The name of the one constraint field that is set."""
        return self.set_fields()[0]

    def key(self) -> tuple[str, str]:
        """A hashable key naming the constraint (for caching compiled grammars)."""
        kind = self.kind
        if kind == "json":
            # not sorted: the schema's key order is the order its properties are generated in
            text = self.json if isinstance(self.json, str) else _json.dumps(self.json)
            return (kind, text)
        if kind == "choice":
            return (kind, _json.dumps(list(self.choice)))
        if kind == "json_object":
            return (kind, "")
        return (kind, getattr(self, kind))
