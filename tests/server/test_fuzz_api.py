"""API fuzzing from the server's own OpenAPI schema (schemathesis on hypothesis), against a real
`flashstate serve` process: bodies valid and invalid for every route, /v1/completions and
/v1/chat/completions above all. Whatever a client sends, the server never answers 5xx, its JSON answers
conform to the schema, its errors have the OpenAI shape, and afterwards the engine is alive
(/health 200, the process running) and /reset_prefix_cache shows the pools whole.

Bounded for CI: FUZZ_EXAMPLES cases per route (default 100), seeded by FUZZ_SEED (default 0, so CI runs
the same cases every time). A long run is the same test with more, e.g.
`FUZZ_EXAMPLES=2000 FUZZ_SEED=7 pytest tests/server/test_fuzz_api.py`; FUZZ_REPORT=PATH writes the counts
(cases and statuses per route) as JSON.

Generated `max_tokens` / `max_completion_tokens` that are missing, null or integers over MAX_TOKENS are
set to MAX_TOKENS before sending (a chat without them would run to the 256-token context limit, seconds
of CPU each): a wrong type or a value below 1 is sent as generated."""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import os
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.server.conftest import running_server

COST = ["--prefill-cost-coefficients", "1e-5", "1e-10"]  # no calibration at start-up
MAX_MODEL_LEN = 256
MAX_TOKENS = 4
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "100"))
SEED = int(os.environ.get("FUZZ_SEED", "0"))
OPERATIONS = [
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("POST", "/reset_prefix_cache"),
    ("GET", "/health"),
    ("GET", "/version"),
    ("GET", "/metrics"),
]
NOT_JSON = ("/health", "/metrics")
COUNTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="module")
def server(module_tmp):
    args = ["--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4", "--enable-dev-endpoints", *COST]
    with running_server(module_tmp, args) as s:
        yield s
    if report := os.environ.get("FUZZ_REPORT"):
        out = {route: dict(sorted(c.items())) for route, c in COUNTS.items()}
        Path(report).write_text(json.dumps({"examples": EXAMPLES, "seed": SEED, "routes": out}, indent=1))


@pytest.fixture(scope="module")
def schema(server):
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


# Request fields narrowed to what the server serves (everything else in the schema is a 400 by design:
# n > 1, penalties, logit_bias, ...), so that the "served" cases reach the engine: sampling, stops, seeds,
# logprobs, streams, token-id prompts, tools, salts.
_NULL = {"type": "null"}
_ID = {"type": "integer", "minimum": 0, "maximum": 2047}  # the tiny model's vocabulary
_SERVED = {
    "model": {"enum": ["flashstate-tiny", None]},
    "temperature": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1e6}, _NULL]},
    "top_p": {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1}, _NULL]},
    "top_k": {"anyOf": [{"type": "integer", "minimum": -1, "maximum": 2**63}, _NULL]},
    "min_p": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, _NULL]},
    "seed": {"anyOf": [{"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}, _NULL]},
    "stop": {"anyOf": [{"type": "string", "minLength": 1}, _NULL,
                       {"type": "array", "maxItems": 4, "items": {"type": "string", "minLength": 1}}]},
    "stop_token_ids": {"anyOf": [{"type": "array", "maxItems": 8,
                                  "items": _ID}, _NULL]},
    "n": {"const": 1},
    "presence_penalty": {"enum": [0, None]},
    "frequency_penalty": {"enum": [0, None]},
    "repetition_penalty": {"enum": [1, None]},
    "logit_bias": _NULL,
    "stream_options": _NULL,
    "prompt": {"anyOf": [{"type": "string", "minLength": 1},
                         {"type": "array", "minItems": 1, "maxItems": 300, "items": _ID}]},
    "max_tokens": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_TOKENS}, _NULL]},
    "max_completion_tokens": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_TOKENS}, _NULL]},
    "logprobs": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 20}, _NULL]},
    "echo": {"const": False},
    "best_of": {"enum": [1, None]},
    "suffix": _NULL,
    "top_logprobs": _NULL,
    "tool_choice": {"enum": ["none", "auto", None]},
    "response_format": _NULL,
}  # fmt: skip


def _served(raw: dict) -> dict:
    raw = copy.deepcopy(raw)
    chat = raw["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    for path in ("/v1/completions", "/v1/chat/completions"):
        body = raw["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        for name in body["properties"]:
            if name in _SERVED and not (path.endswith("chat/completions") and name == "logprobs"):
                body["properties"][name] = _SERVED[name]
    message = chat["schema"]["$defs"]["ChatMessage"]
    message["properties"]["content"] = {"type": "string"}
    message["required"] = ["role", "content"]
    return raw


@pytest.fixture(scope="module")
def served_schema(schema):
    return schemathesis.openapi.from_dict(_served(schema.raw_schema))


def test_the_schema_describes_the_request_bodies(schema):
    """The POST routes read their bodies by hand: their schemas come from protocol.py's models, with the
    models' $defs resolvable (generated messages are ChatMessage objects)."""
    raw = schema.raw_schema
    for path, required in (("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")):
        body = raw["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert required in body["required"]
    chat = schema["/v1/chat/completions"]["POST"]

    @given(chat.as_strategy())
    @settings(max_examples=20, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @seed(SEED)
    def generate(case):
        assert case.body["messages"]
        for message in case.body["messages"]:
            assert message["role"] in ("system", "developer", "user", "assistant", "tool")

    generate()


def _bounded(body: object) -> None:
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None or (type(value) is int and value > MAX_TOKENS):
            body[key] = MAX_TOKENS


def _check_answer(path: str, response: schemathesis.Response) -> None:
    """Errors in the OpenAI shape; a completion's JSON or stream carries choices or an error event."""
    status = response.status_code
    kind = (response.headers.get("content-type") or [""])[0]
    if status >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["type"] == "invalid_request_error", body
    elif kind.startswith("text/event-stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", response.text[-500:]
        for event in map(json.loads, events[:-1]):
            assert "choices" in event or "error" in event, event
    elif path.endswith("completions"):
        body = response.json()
        assert body["choices"] and "usage" in body, body


@pytest.mark.parametrize("method, path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_no_request_is_a_server_error(server, schema, served_schema, method, path):
    """Cases valid for the schema, invalid ones (wrong types, missing fields), and, for the completion
    routes, valid ones narrowed to what the server serves, in about equal shares."""
    operation = schema[path][method]
    session = requests.Session()
    counts = COUNTS[f"{method} {path}"]
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    strategies = [operation.as_strategy(mode) for mode in modes]
    if path.endswith("completions"):
        strategies.append(served_schema[path][method].as_strategy())
    strategy = st.one_of(*strategies)

    @given(strategy)
    @settings(max_examples=EXAMPLES, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @seed(SEED)
    def fuzz(case):
        _bounded(case.body)
        response = case.call(base_url=server.url, session=session, timeout=300)
        counts["cases"] += 1
        counts[str(response.status_code)] += 1
        if response.status_code >= 400 and os.environ.get("FUZZ_REPORT"):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                error = response.json()["error"]
                counts[f"{response.status_code} {error['code']} {error['param']}"] += 1
        # /health and /metrics are documented as JSON but answer an empty body and Prometheus text
        checks = [not_a_server_error] + ([] if path in NOT_JSON else [response_schema_conformance])
        case.validate_response(response, checks=checks)
        _check_answer(path, response)
        assert server.proc.poll() is None, server.log_tail()

    try:
        fuzz()
    finally:
        session.close()
    assert server.request("GET", "/health")[0] == 200, server.log_tail()


def test_the_engine_lives_and_the_pools_are_whole_after_the_fuzzing(server):
    assert server.proc.poll() is None, server.log_tail()
    assert server.request("GET", "/health")[0] == 200
    status, pools = server.post_json("/reset_prefix_cache", b"")
    assert status == 200, pools
    assert (pools["running"], pools["waiting"]) == (0, 0), pools
    assert pools["free_blocks"] == pools["num_blocks"], pools
    assert pools["free_state_slots"] == pools["num_state_slots"], pools
