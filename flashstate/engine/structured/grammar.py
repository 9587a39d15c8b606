"""A StructuredOutput as llguidance grammar text, checked once and cached by the constraint's key.

The text does not depend on the tokenizer, so the server checks a request's constraint here before it
reaches the engine (a 400 naming the field), and the engine's matchers reuse the cached text.

JSON schemas and `json_object` produce JSON without free whitespace: `, ` between items, `: ` after keys,
nothing else (as Python's json.dumps writes it). A grammar with free whitespace lets a model pad forever
instead of closing the object, and with none after the last brace the grammar ends there, so the request
finishes as soon as the JSON is complete. Properties come in the schema's order. Schema keywords a
grammar cannot express (`uniqueItems`, `not`, `if`/`then`, `dependentRequired`) are left unenforced rather
than refused, as tool schemas carry them; a malformed schema (an unknown type, a dangling `$ref`) is
refused.
"""

from __future__ import annotations

import json
from functools import lru_cache

import llguidance

from flashstate.structured_output import StructuredOutput

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}
MAX_ERROR_CHARS = 400
GRAMMAR_CACHE_SIZE = 1024


class GrammarError(ValueError):
    """A constraint that does not compile; `field` names the StructuredOutput field."""

    def __init__(self, field: str, detail: str):
        super().__init__(f"{field} is not a valid {_WHAT[field]}: {detail}")
        self.field, self.what, self.detail = field, _WHAT[field], detail


_WHAT = {
    "json": "JSON schema",
    "json_object": "JSON object constraint",
    "regex": "regular expression",
    "choice": "list of choices",
    "grammar": "grammar (Lark or GBNF)",
    "structural_tag": "structural tag",
}


def compile_grammar(so: StructuredOutput) -> str:
    """The llguidance grammar for `so`; GrammarError if it does not compile."""
    return _compile(*so.key())


@lru_cache(maxsize=GRAMMAR_CACHE_SIZE)
def _compile(kind: str, text: str) -> str:
    try:
        grammar = _grammar(kind, text)
    except (ValueError, TypeError, KeyError, AssertionError) as e:  # the converters' errors on bad input
        raise GrammarError(kind, str(e) or type(e).__name__) from None
    error = llguidance.LLMatcher.validate_grammar(grammar, None)
    if error:
        raise GrammarError(kind, " ".join(error.split())[:MAX_ERROR_CHARS])
    return grammar


def _grammar(kind: str, text: str) -> str:
    if kind == "json":
        return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(text)
    if kind == "choice":
        choices = json.loads(text)
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, choices)))
    if kind == "grammar":
        return llguidance.grammar_from("grammar", text)  # Lark as it is; GBNF converted to Lark
    if kind == "structural_tag":
        return _structural_tag(text)
    raise ValueError(f"unknown constraint {kind!r}")


def _structural_tag(text: str) -> str:
    """vLLM's structural tag, `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`: free text in
    which each structure, once its trigger (a prefix of its `begin`) appears, is its begin, a JSON value
    of its schema, then its end."""
    spec = json.loads(text)
    if not isinstance(spec, dict) or not isinstance(spec.get("structures"), list):
        raise ValueError('a structural tag is a JSON object {"structures": [...], "triggers": [...]}')
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not all(isinstance(t, str) and t for t in triggers):
        raise ValueError("triggers must be a list of non-empty strings")
    tags = []
    for s in spec["structures"]:
        if not isinstance(s, dict) or not all(isinstance(s.get(k), str) for k in ("begin", "end")):
            raise ValueError("each structure needs string fields begin and end, and a schema")
        trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
        if trigger is None:
            raise ValueError(f"no trigger is a prefix of the structure's begin {s['begin']!r}")
        schema = s.get("schema", {})
        if not isinstance(schema, dict):
            raise ValueError("a structure's schema must be a JSON schema (an object)")
        schema = {"x-guidance": JSON_OPTIONS, **schema}
        tags.append(llguidance.StructTag(trigger=trigger, begin=s["begin"], grammar=schema, end=s["end"]))
    if not tags:
        raise ValueError("structures must not be empty")
    # Lark text; triggers written <...> are taken for special tokens (as Qwen's <tool_call> is)
    return llguidance.LLMatcher.grammar_from_lark(llguidance.StructTag.to_grammar(tags))
