"""Output constraints through a real `flashstate serve` (the embedded tiny model, random weights) with the
`openai` SDK: `response_format`, vLLM's `structured_outputs` and the older `guided_*` fields on both
endpoints, streamed and not; malformed or conflicting constraints are 400s naming the field."""

from __future__ import annotations

import concurrent.futures
import json
import re

import openai
import pytest

from tests.server.conftest import assert_error, running_server

MODEL = "flashstate-tiny"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "address"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]

try:
    import jsonschema_rs
except ImportError:  # pragma: no cover - the test extra installs it (through schemathesis)
    jsonschema_rs = None


def assert_person(text: str) -> None:
    value = json.loads(text)
    if jsonschema_rs is not None:
        jsonschema_rs.validate(PERSON, value)
    else:  # pragma: no cover
        assert set(value) == set(PERSON["required"]) and isinstance(value["age"], int)
        assert re.fullmatch(r"[0-9]{5}", value["address"]["zip"])


@pytest.fixture(scope="module")
def server(module_tmp):
    args = ["--max-model-len", "2k", "--prefill-cost-coefficients", "1e-5", "1e-10"]
    with running_server(module_tmp, args) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=120) as c:
        yield c


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def test_chat_response_format_json_schema(client):
    for seed in (None, 1, 2):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=128,
            temperature=0 if seed is None else 1.0,
            seed=seed,
            response_format=schema_format(PERSON),
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "stop"
        assert_person(choice.message.content)


def test_chat_response_format_json_object_is_an_object_prefix(client):
    """Random weights rarely close a JSON string: the reply is an object as far as max_tokens lets it go."""
    reply = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
        response_format={"type": "json_object"},
    )
    choice = reply.choices[0]
    assert choice.message.content.startswith("{")
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)


def test_completions_choice_regex_and_grammar(client):
    choices = ["positive", "negative", "neutral"]
    for extra in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        out = client.completions.create(
            model=MODEL, prompt="Sentiment:", max_tokens=8, temperature=0, extra_body=extra
        )
        assert out.choices[0].text in choices and out.choices[0].finish_reason == "stop"
    pattern = r"[0-9]{3}-[a-z]{2,5}"
    for extra in (
        {"structured_outputs": {"regex": pattern}},
        {"guided_regex": pattern, "guided_decoding_backend": "xgrammar"},
    ):
        out = client.completions.create(
            model=MODEL, prompt="Code:", max_tokens=16, temperature=0.8, seed=3, extra_body=extra
        )
        assert re.fullmatch(pattern, out.choices[0].text)
    out = client.completions.create(
        model=MODEL,
        prompt="Answer:",
        max_tokens=8,
        temperature=0,
        extra_body={"guided_grammar": 'root ::= "yes" | "no" | "n/a"'},
    )
    assert out.choices[0].text in ("yes", "no", "n/a")


def test_completions_response_format_and_structured_outputs_json(client):
    out = client.completions.create(
        model=MODEL,
        prompt=["Person one:", "Person two:"],
        max_tokens=128,
        temperature=0,
        extra_body={"response_format": schema_format(PERSON)},
    )
    for choice in out.choices:
        assert_person(choice.text)
    out = client.completions.create(
        model=MODEL,
        prompt="Person:",
        max_tokens=128,
        temperature=0,
        extra_body={"structured_outputs": {"json": json.dumps(PERSON)}},
    )
    assert_person(out.choices[0].text)


def test_streaming(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=128,
        temperature=0,
        stream=True,
        response_format=schema_format(PERSON),
    )
    parts, reasons = [], []
    for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert len([p for p in parts if p]) > 3 and reasons[-1] == "stop"
    assert_person("".join(parts))
    whole = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=128, temperature=0, response_format=schema_format(PERSON)
    )
    assert whole.choices[0].message.content == "".join(parts)
    stream = client.completions.create(
        model=MODEL,
        prompt="x",
        max_tokens=8,
        temperature=0,
        stream=True,
        extra_body={"guided_choice": ["aa", "bb"]},
    )
    assert "".join(c.choices[0].text for c in stream) in ("aa", "bb")


def test_constrained_and_unconstrained_requests_together(client):
    """Unconstrained requests sharing steps with constrained ones get what they get alone (greedy)."""
    plain = {"model": MODEL, "prompt": "The quick brown", "max_tokens": 24, "temperature": 0}
    alone = client.completions.create(**plain, extra_body={"ignore_eos": True}).choices[0].text
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        constrained = [
            pool.submit(
                client.completions.create,
                model=MODEL,
                prompt=f"Person {i}:",
                max_tokens=128,
                temperature=0,
                extra_body={"response_format": schema_format(PERSON)},
            )
            for i in range(4)
        ]
        free = [
            pool.submit(client.completions.create, **plain, extra_body={"ignore_eos": True}) for _ in range(2)
        ]
        for f in constrained:
            assert_person(f.result().choices[0].text)
        assert [f.result().choices[0].text for f in free] == [alone, alone]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": schema_format({"type": "objectx"})}, "response_format.json_schema.schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "start: nowhere"}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
        ({"guided_json": {"$ref": "#/$defs/none"}}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": "a", "guided_decoding_backend": "magic"}, "guided_decoding_backend"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
        ({"guided_json": {"type": "object"}, "structured_outputs": {"regex": "a"}}, "guided_json"),
        ({"guided_regex": 5}, "guided_regex"),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(server, body, param):
    for path, base in (
        ("/v1/chat/completions", {"model": MODEL, "messages": MESSAGES}),
        ("/v1/completions", {"model": MODEL, "prompt": "x"}),
    ):
        status, reply = server.post_json(path, {**base, "max_tokens": 4, **body})
        err = assert_error(status, reply, 400)
        assert err["param"] == param, err
    if "response_format" in body and "guided_regex" in body:
        assert "response_format" in err["message"] and "guided_regex" in err["message"]


def test_the_sdk_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError, match="not a valid JSON schema"):
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=4, response_format=schema_format({"type": "objectx"})
        )
