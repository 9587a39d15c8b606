"""The request fields that constrain the output, as one StructuredOutput (both /v1/completions and
/v1/chat/completions):

- `response_format`: OpenAI's `{"type": "text" | "json_object" | "json_schema", "json_schema": {"name",
  "schema", "strict", "description"}}`, and vLLM's `{"type": "structural_tag", "structures", "triggers"}`.
- `structured_outputs`: vLLM's object, `{json, regex, choice, grammar, json_object, structural_tag}` (one
  of them); `disable_any_whitespace` and `disable_fallback` are accepted as what the engine always does
  (no free whitespace in JSON; no fallback backend). Any other key is a 400 naming it.
- vLLM's older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` (deprecated there), with
  `guided_decoding_backend` accepted and ignored when it names a backend vLLM knows.

Two fields that both constrain the output are a 400 naming both. The constraint is compiled here, at
request time (the engine's compile cache keeps the result): one that does not compile is a 400 naming
the field it came from.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from flashstate.engine.structured import GrammarError, compile_grammar
from flashstate.server.errors import bad_request
from flashstate.structured_output import StructuredOutput

# vLLM's structured-output backends: a guided_decoding_backend naming one of them is accepted and ignored.
BACKENDS = {
    "auto",
    "xgrammar",
    "guidance",
    "llguidance",
    "outlines",
    "lm-format-enforcer",
    "lm_format_enforcer",
}
# Keys of vLLM's structured_outputs object that hold the constraint, and those the engine honours as is.
_CONSTRAINT_KEYS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_ACCEPTED_FLAGS = ("disable_any_whitespace", "disable_fallback")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class JsonSchemaFormat(_Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format; other keys are kept (vLLM's structural tag carries its spec beside
    `type`)."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(BaseModel):
    """vLLM's `structured_outputs`; keys beyond the known ones are kept, to be refused by name."""

    model_config = ConfigDict(strict=True, extra="allow")
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: bool | None = None
    disable_fallback: bool | None = None


class _Body(Protocol):
    """The fields as the request bodies declare them (server/protocol.py, _SamplingFields)."""

    response_format: ResponseFormat | None
    structured_outputs: StructuredOutputsField | None
    guided_json: dict[str, Any] | str | None
    guided_regex: str | None
    guided_choice: list[str] | None
    guided_grammar: str | None
    guided_decoding_backend: str | None


def structured_output(body: _Body) -> StructuredOutput | None:
    """The request's constraint, compiled (None: unconstrained); APIError 400 naming the field for a
    malformed one, one that does not compile, or two fields that both constrain the output."""
    if body.guided_decoding_backend is not None and body.guided_decoding_backend not in BACKENDS:
        raise bad_request(
            f"guided_decoding_backend {body.guided_decoding_backend!r} is not a backend vLLM knows "
            f"({', '.join(sorted(BACKENDS))})",
            param="guided_decoding_backend",
        )
    found = [*_response_format(body), *_structured_outputs(body), *_guided(body)]
    if not found:
        return None
    if len(found) > 1:
        (a, _, _), (b, _, _) = found[:2]
        raise bad_request(f"{a} and {b} both constrain the output; give only one", param=b)
    field, kind, value = found[0]
    try:
        so = StructuredOutput(**{kind: value})
        compile_grammar(so)
    except GrammarError as e:
        raise bad_request(f"{field} is not a valid {e.what}: {e.detail}", param=field) from e
    except ValueError as e:
        raise bad_request(f"{field}: {e}", param=field) from e
    return so


# Each gives (request field, StructuredOutput field, value) per constraint it carries.


def _response_format(body: _Body) -> list[tuple[str, str, Any]]:
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return []
    if fmt.type == "json_object":
        return [("response_format", "json_object", True)]
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise bad_request(
                "response_format of type json_schema needs json_schema.schema",
                param="response_format.json_schema.schema",
            )
        return [("response_format.json_schema.schema", "json", fmt.json_schema.schema_)]
    if fmt.type == "structural_tag":
        spec = {k: v for k, v in (fmt.model_extra or {}).items()}
        return [("response_format", "structural_tag", json.dumps(spec))]
    raise bad_request(
        f"response_format type {fmt.type!r} is not supported (text, json_object, json_schema, "
        "structural_tag)",
        param="response_format.type",
    )


def _structured_outputs(body: _Body) -> list[tuple[str, str, Any]]:
    so = body.structured_outputs
    if so is None:
        return []
    if unknown := sorted(so.model_extra or {}):
        raise bad_request(
            f"structured_outputs.{unknown[0]} is not supported (structured_outputs takes "
            f"{', '.join(_CONSTRAINT_KEYS + _ACCEPTED_FLAGS)})",
            param=f"structured_outputs.{unknown[0]}",
        )
    values = {
        "json": so.json_,
        "regex": so.regex,
        "choice": so.choice,
        "grammar": so.grammar,
        "json_object": so.json_object or None,
        "structural_tag": (
            json.dumps(so.structural_tag) if isinstance(so.structural_tag, dict) else so.structural_tag
        ),
    }
    given = [k for k in _CONSTRAINT_KEYS if values[k] is not None]
    if len(given) > 1:
        raise bad_request(
            f"structured_outputs takes one constraint, got {', '.join(given)}",
            param=f"structured_outputs.{given[1]}",
        )
    return [(f"structured_outputs.{k}", k, values[k]) for k in given]


def _guided(body: _Body) -> list[tuple[str, str, Any]]:
    fields = (
        ("guided_json", "json", body.guided_json),
        ("guided_regex", "regex", body.guided_regex),
        ("guided_choice", "choice", body.guided_choice),
        ("guided_grammar", "grammar", body.guided_grammar),
    )
    return [f for f in fields if f[2] is not None]
