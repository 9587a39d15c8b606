"""The official `anthropic` client against `flashstate serve`'s /v1/messages (the embedded tiny model,
random weights): messages plain and streamed, system prompts, stop sequences, token counts, tools and
tool results, thinking, the refusals and Anthropic's error shape; and the stream translation checked
event by event against the SDK's own accumulator on chat chunks with tool calls and reasoning."""

from __future__ import annotations

import json

import anthropic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from flashstate.server.anthropic.messages import MessageEvents, message
from tests.server.chat_reply import BODY, CHUNKS, WEATHER_PARAMETERS
from tests.server.conftest import running_server

KEY = "sk-test-key"
MODEL = "flashstate-tiny"
COST = ["--prefill-cost-coefficients", "1e-5", "1e-10"]  # no calibration at start-up
TOOLS_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
GREEDY = {"extra_body": {"temperature": 0.0}}  # the SDK no longer has sampling arguments
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": WEATHER_PARAMETERS,
}


@pytest.fixture(scope="module")
def server(module_tmp):
    with running_server(module_tmp, ["--max-model-len", "2k", *COST, *TOOLS_ARGS], api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def ask(client, content="Write a function that adds two numbers.", **kw):
    kw = {"max_tokens": 8, "messages": [{"role": "user", "content": content}], **GREEDY, **kw}
    return client.messages.create(model=MODEL, **kw)


def error_of(status: int, body: dict, want: int, kind: str) -> str:
    """Anthropic's error shape; returns the message."""
    assert status == want, body
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] == kind, body
    return body["error"]["message"]


def test_message(client):
    m = ask(client)
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL and m.id.startswith("msg_")
    assert all(b.type == "text" for b in m.content)
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    u = m.usage
    assert 1 <= u.output_tokens <= 8 and u.cache_creation_input_tokens == 0
    counted = client.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "Write a function that adds two numbers."}]
    )
    # Anthropic's convention: input_tokens excludes what the cache served
    assert u.input_tokens + u.cache_read_input_tokens == counted.input_tokens


def test_a_repeated_prompt_is_read_from_the_cache(client):
    first = ask(client, "def fibonacci(n): return the nth number")
    again = ask(client, "def fibonacci(n): return the nth number")
    whole = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == whole
    assert again.usage.cache_read_input_tokens > 0 and again.usage.input_tokens < whole


def test_stream_gives_the_same_message(client):
    plain = ask(client, "Sort a list in place.", max_tokens=12)
    with client.messages.stream(
        model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Sort a list in place."}], **GREEDY
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds[-2] == "message_delta"
    assert [b.text for b in final.content] == [b.text for b in plain.content]
    assert final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens
    whole = plain.usage.input_tokens + plain.usage.cache_read_input_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == whole


def test_raw_stream_events_are_framed_with_event_lines(server):
    body = {"model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    status, raw = server.request(
        "POST",
        "/v1/messages",
        json.dumps(body).encode(),
        {"x-api-key": KEY, "content-type": "application/json"},
    )
    assert status == 200
    frames = [f for f in raw.decode().split("\n\n") if f]
    for frame in frames:
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == name[7:]
    assert frames[0].startswith("event: message_start") and frames[-1].startswith("event: message_stop")


def test_system_prompt_string_or_blocks(client):
    msgs = [{"role": "user", "content": "hello"}]
    bare = client.messages.count_tokens(model=MODEL, messages=msgs).input_tokens
    text = client.messages.count_tokens(model=MODEL, messages=msgs, system="You are terse.").input_tokens
    blocks = client.messages.count_tokens(
        model=MODEL,
        messages=msgs,
        system=[{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}],
    ).input_tokens
    assert text == blocks > bare
    m = ask(client, "hello", system="You are terse.")
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == text


def test_stop_sequences(client):
    """A stop sequence taken from the greedy output ends it there: stop_reason stop_sequence, the
    sequence named, the text before it."""
    free = "".join(b.text for b in ask(client, "Explain recursion.", max_tokens=24).content)
    stop = free[len(free) // 2 :][:3]
    assert stop.strip(), free
    m = ask(client, "Explain recursion.", max_tokens=24, stop_sequences=["@@never@@", stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert "".join(b.text for b in m.content) == free[: free.index(stop)]
    with client.messages.stream(
        model=MODEL,
        max_tokens=24,
        messages=[{"role": "user", "content": "Explain recursion."}],
        stop_sequences=["@@never@@", stop],
        extra_body={"temperature": 0.0},
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence == stop


def test_count_tokens_counts_tools_and_tool_results(client):
    msgs = [{"role": "user", "content": "weather?"}]
    bare = client.messages.count_tokens(model=MODEL, messages=msgs).input_tokens
    tooled = client.messages.count_tokens(model=MODEL, messages=msgs, tools=[WEATHER]).input_tokens
    assert tooled > bare

    def with_result(result: str) -> int:
        turns = [
            *msgs,
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}],
            },
        ]
        return client.messages.count_tokens(model=MODEL, messages=turns, tools=[WEATHER]).input_tokens

    assert with_result("sunny, 25 degrees, light wind from the west") > with_result("sunny") > tooled


def test_tool_result_turn(client):
    """A conversation with a tool call and its results (text blocks, an error) is served."""
    turns = [
        {"role": "user", "content": "What is the weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "sunny"}],
                },
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "timeout", "is_error": True},
                {"type": "text", "text": "Summarize."},
            ],
        },
    ]
    m = client.messages.create(model=MODEL, max_tokens=6, messages=turns, tools=[WEATHER], **GREEDY)
    assert m.type == "message" and m.usage.output_tokens >= 1


def test_tool_choice_any_gives_tool_use_blocks_matching_the_schema(client):
    m = client.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        **GREEDY,
    )
    assert m.stop_reason != "max_tokens", "the grammar forces a complete call"
    assert isinstance(getattr(m.content[-1], "input", None), dict)
    calls = [b for b in m.content if b.type == "tool_use"]
    assert len(calls) == 1 and m.stop_reason == "tool_use"
    for call in calls:
        assert call.name == "get_weather" and call.input["city"] in ("Paris", "Rome")
        assert set(call.input) <= {"city", "days"} and isinstance(call.input.get("days", 0), int)


def test_thinking_is_accepted_and_its_budget_checked(client):
    m = ask(client, thinking={"type": "disabled"})
    assert m.type == "message"
    msgs = [{"role": "user", "content": "hi"}]
    thinking = {"type": "enabled", "budget_tokens": 1024}
    assert client.messages.count_tokens(model=MODEL, messages=msgs, thinking=thinking).input_tokens > 0
    with pytest.raises(anthropic.BadRequestError) as e:
        ask(client, max_tokens=8, thinking={"type": "enabled", "budget_tokens": 1024})
    assert "budget_tokens" in e.value.body["error"]["message"]
    assert e.value.body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"max_tokens": 4, "messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"max_tokens": 4, "messages": [{"role": "tool", "content": "hi"}]}, "messages[0].role"),
        (
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            },
            "context_management.edits[0]",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "container": "c1"}, "container"),
        (
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools[0].type",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "tool_choice": {"type": "any"},
            },
            "tool_choice",
        ),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "speed": "fast"}, "speed"),
    ],
)
def test_bad_requests_are_400_naming_the_field(server, body, named):
    status, out = server.post_json("/v1/messages", {"model": MODEL, **body})
    assert named in error_of(status, out, 400, "invalid_request_error")


def test_what_claude_code_sends_is_served(server):
    """A `system` turn inside `messages` (rendered in place as a user turn) and a `context_management`
    edit that keeps everything, as Claude Code sends on every request."""
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            },
            {"role": "system", "content": "Available agent types: claude."},
        ],
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "u"},
    }
    status, out = server.post_json("/v1/messages", body)
    assert status == 200 and out["type"] == "message", out


def test_errors_have_anthropic_shape(server, client):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(
            model="claude-nonexistent", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError) as e:
        client.with_options(api_key="wrong").messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.body["error"]["type"] == "authentication_error"
    status, out = server.request("POST", "/v1/messages/count_tokens", b"{not json", {"x-api-key": KEY})
    error_of(status, json.loads(out), 400, "invalid_request_error")


def test_bearer_and_x_api_key_both_authorize(server):
    with anthropic.Anthropic(base_url=server.url, auth_token=KEY, max_retries=0) as bearer:
        assert (
            bearer.messages.count_tokens(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            ).input_tokens
            > 0
        )
    status, _ = server.request("GET", "/v1/models", headers={"x-api-key": KEY})
    assert status == 200


# ---- the stream translation on chat chunks with reasoning and tool calls -------------------------------


def test_stream_translation_accumulates_to_the_plain_message():
    """The SDK parses every event and, accumulating them, arrives at the non-streamed message."""
    events = MessageEvents(None)
    pairs = [p for c in CHUNKS for p in events.feed(c)] + events.finish()
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, bufs = None, {}
    for name, data in pairs:
        assert data["type"] == name
        event = adapter.validate_python(data)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    plain = message(BODY, None)
    assert snapshot.model_dump(exclude_none=True) == anthropic.types.Message.model_validate(plain).model_dump(
        exclude_none=True
    )
    assert [b["type"] for b in plain["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert plain["content"][2]["input"] == {"city": "Paris"} and plain["stop_reason"] == "tool_use"
    assert plain["usage"] == {
        "input_tokens": 10,
        "output_tokens": 9,
        "cache_read_input_tokens": 20,
        "cache_creation_input_tokens": 0,
    }


def test_streamed_tool_use_block(client):
    with client.messages.stream(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": "What is the weather in Rome?"}],
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        **GREEDY,
    ) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use", "the grammar forces a complete call"
    (call,) = [b for b in final.content if b.type == "tool_use"]
    assert call.input["city"] in ("Paris", "Rome") and ("content_block_delta", "input_json_delta") in kinds
