"""The official `openai` client's `responses` against `flashstate serve`'s /v1/responses (the embedded
tiny model, random weights), plain and streamed, with instructions, item inputs, function calls and their
outputs, the refusals of a stateless server; litellm through chat completions (`hosted_vllm/`) and
Responses (`openai/`); and the stream translation checked event by event against the SDK's own
accumulator on chat chunks with tool calls and reasoning."""

from __future__ import annotations

import json
import os

import openai
import pytest
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from flashstate.server.responses.output import ResponseEvents, head, response
from flashstate.server.responses.protocol import ResponsesRequest
from tests.server.chat_reply import BODY, CHUNKS, WEATHER_PARAMETERS
from tests.server.conftest import assert_error, running_server

KEY = "sk-test-key"
MODEL = "flashstate-tiny"
COST = ["--prefill-cost-coefficients", "1e-5", "1e-10"]  # no calibration at start-up
TOOLS_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": WEATHER_PARAMETERS,
}


@pytest.fixture(scope="module")
def server(module_tmp):
    with running_server(module_tmp, ["--max-model-len", "2k", *COST, *TOOLS_ARGS], api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=60) as c:
        yield c


def create(client, input="Write a function that adds two numbers.", **kw):
    return client.responses.create(
        model=MODEL, input=input, **{"max_output_tokens": 8, "temperature": 0.0, **kw}
    )


def test_response(client):
    r = create(client, instructions="Be terse.")
    assert r.object == "response" and r.model == MODEL and r.id.startswith("resp_")
    assert r.instructions == "Be terse." and r.store is False and r.previous_response_id is None
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert r.output_text == item.content[0].text
    u = r.usage
    assert 1 <= u.output_tokens <= 8 and u.total_tokens == u.input_tokens + u.output_tokens
    assert 0 <= u.input_tokens_details.cached_tokens <= u.input_tokens
    assert u.output_tokens_details.reasoning_tokens == 0
    if u.output_tokens == 8:
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert item.status == "incomplete"
    else:
        assert r.status == "completed" and r.completed_at is not None


def test_a_repeated_prompt_is_read_from_the_cache(client):
    first = create(client, "def fibonacci(n): return the nth number")
    again = create(client, "def fibonacci(n): return the nth number")
    assert again.usage.input_tokens == first.usage.input_tokens
    assert again.usage.input_tokens_details.cached_tokens > 0


def test_stream_gives_the_same_response(client):
    plain = create(client, "Sort a list in place.", max_output_tokens=12)
    events = list(create(client, "Sort a list in place.", max_output_tokens=12, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if plain.status == "incomplete" else "response.completed",
    ]
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == plain.output_text
    assert final.status == plain.status and final.usage.output_tokens == plain.usage.output_tokens
    assert final.usage.input_tokens == plain.usage.input_tokens


def test_stream_helper_accumulates_the_events(client):
    with client.responses.stream(model=MODEL, input="hi", max_output_tokens=6, temperature=0.0) as stream:
        last = [e for e in stream][-1]
        snapshot = stream.current_snapshot if hasattr(stream, "current_snapshot") else None
    assert last.type in ("response.completed", "response.incomplete")
    if snapshot is not None:
        assert snapshot.output_text == last.response.output_text


def test_item_inputs_with_function_calls_and_outputs(client):
    items = [
        {"role": "developer", "content": "Answer with the weather."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Look it up."}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is sunny."}],
        },
        {"role": "user", "content": "And tomorrow?"},
    ]
    r = create(client, items, tools=[WEATHER], max_output_tokens=6)
    assert r.usage.output_tokens >= 1 and r.tools[0].name == "get_weather"
    longer = create(
        client,
        items[:4] + [{**items[4], "output": "sunny, 25 degrees, light wind"}] + items[5:],
        tools=[WEATHER],
    )
    assert longer.usage.input_tokens > r.usage.input_tokens  # the output reached the prompt


def test_tool_choice_required_gives_function_calls_matching_the_schema(client):
    r = create(
        client,
        "What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and r.status != "incomplete", "the grammar forces a complete call"
    assert len(calls) == 1 and r.status == "completed"
    for call in calls:
        args = json.loads(call.arguments)
        assert call.name == "get_weather" and args["city"] in ("Paris", "Rome") and call.call_id
        assert call.id.startswith("fc_") and call.status == "completed"


def test_codex_tools_namespaces_and_offline_web_search(client):
    """What Codex CLI sends: functions grouped in a `namespace` tool, and a `web_search` tool without
    external access (accepted, not offered). A call to a namespaced function names its namespace."""
    grouped = {k: v for k, v in WEATHER.items() if k != "type"} | {"type": "function"}
    tools = [
        {"type": "namespace", "name": "forecast", "description": "Weather tools.", "tools": [grouped]},
        {"type": "web_search", "external_web_access": False},
    ]
    r = create(client, "Weather in Rome?", tools=tools, tool_choice="required", parallel_tool_calls=False,
               max_output_tokens=200)  # fmt: skip
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.namespace == "forecast"
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0]"),
        ({"input": 5}, "input"),
    ],
)
def test_bad_requests_are_400_naming_the_field(server, extra, named):
    status, body = server.post_json(
        "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2, **extra}
    )
    err = assert_error(status, body, 400)
    assert err["param"] == named or named in err["message"], err


def test_accepted_without_effect(client):
    r = create(
        client,
        store=True,
        metadata={"k": "v"},
        user="u1",
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        prompt_cache_key="session-1",
        parallel_tool_calls=False,
        service_tier="auto",
    )
    assert r.store is False and r.metadata == {"k": "v"} and r.parallel_tool_calls is False


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-nonexistent", input="hi", max_output_tokens=2)


# ---- litellm ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    try:
        import litellm as module
    except Exception as e:  # noqa: BLE001 — any import failure means: not available here
        pytest.skip(f"litellm does not import: {e}")
    return module


def test_litellm_chat_completions_hosted_vllm(server, litellm):
    r = litellm.completion(
        model=f"hosted_vllm/{MODEL}",
        api_base=f"{server.url}/v1",
        api_key=KEY,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0.0,
    )
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens >= 1


def test_litellm_responses_openai(server, litellm):
    r = litellm.responses(
        model=f"openai/{MODEL}",
        api_base=f"{server.url}/v1",
        api_key=KEY,
        input="hi",
        max_output_tokens=4,
        temperature=0.0,
    )
    assert r.output[0].type == "message" and r.usage.output_tokens >= 1


# ---- the stream translation on chat chunks with reasoning and tool calls -------------------------------


def _items(resp: Response) -> list[dict]:
    return [{k: v for k, v in item.to_dict().items() if k != "id"} for item in resp.output]


def test_stream_translation_accumulates_to_the_plain_response():
    """The SDK parses every event and, accumulating them, arrives at the non-streamed response."""
    req = ResponsesRequest.model_validate(
        {"model": MODEL, "input": "weather?", "tools": [WEATHER], "stream": True}
    )
    count = len  # a stand-in token count: characters
    events = ResponseEvents(head(req, "resp_1", MODEL), count, {})
    out = events.start() + [e for c in CHUNKS for e in events.feed(c)] + events.finish()
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    adapter = TypeAdapter(ResponseStreamEvent)
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for data in out:
        state.handle_event(adapter.validate_python(data))
    streamed = out[-1]["response"]
    assert out[-1]["type"] == "response.completed"
    plain = Response.model_validate(response(head(req, "resp_1", MODEL), BODY, count, {}))
    final = Response.model_validate(streamed)
    assert _items(final) == _items(plain)
    assert [i.type for i in plain.output] == ["reasoning", "message", "function_call", "function_call"]
    assert plain.output[2].call_id == "call_1" and json.loads(plain.output[2].arguments) == {"city": "Paris"}
    assert final.usage == plain.usage and plain.usage.input_tokens_details.cached_tokens == 20
    assert plain.usage.output_tokens_details.reasoning_tokens == len("The user wants the weather.")
    assert state._completed_response is not None
    assert [i.type for i in state._completed_response.output] == [i.type for i in plain.output]


def test_streamed_function_call(client):
    events = list(
        create(
            client,
            "What is the weather in Rome?",
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=200,
            stream=True,
        )
    )
    final = events[-1].response
    calls = [item for item in final.output if item.type == "function_call"]
    assert calls and final.status != "incomplete", "the grammar forces a complete call"
    (call,) = calls
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments == call.arguments and json.loads(call.arguments)["city"] in (
        "Paris",
        "Rome",
    )
