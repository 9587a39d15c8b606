"""Cached tokens through each dialect: a 4-turn tool conversation over chat completions, Anthropic
Messages and Responses, each turn re-sending the whole conversation (the previous replies as the server
gave them, tool results for their tool calls, else a user message). The prefix cache keeps a checkpoint one
token before each prompt's end (the retry point, which stands for the message ends just below it), so turn k
is served from the cache for at least turn k−1's whole prompt but its last token; checked on the usage
numbers each dialect reports, whatever the model says."""

from __future__ import annotations

import anthropic
import pytest

from tests.server.conftest import running_server

KEY = "sk-test-key"
MODEL = "flashstate-tiny"
TURNS = 4
ARGS = ["--max-model-len", "4k", "--prefill-cost-coefficients", "1e-5", "1e-10"]
ARGS += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
SYSTEM = "You answer questions about the weather. Call get_weather for every city you are asked about."
QUESTIONS = ["Weather in Paris?", "And in Rome?", "Which one is warmer?", "Thanks. Anything else?"]


@pytest.fixture(scope="module")
def server(module_tmp):
    with running_server(module_tmp, ARGS, api_key=KEY) as s:
        yield s


def check(turns: list[tuple[int, int]], calls: int) -> None:
    """(prompt tokens, cached tokens) per turn: each turn's cache read covers the previous prompt but its last
    token. Then,
    that every turn was a tool call (tool_choice required / any, one call: the output is constrained)."""
    assert len(turns) == TURNS
    for (prev_prompt, _), (prompt, cached) in zip(turns, turns[1:], strict=False):
        assert prompt > prev_prompt
        assert cached >= prev_prompt - 1, turns
    assert calls >= TURNS, "the grammar forces a complete call"


def test_chat_completions(server):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    turns, calls = [], 0
    with server.client(timeout=60) as client:
        for k in range(TURNS):
            messages.append({"role": "user", "content": QUESTIONS[k]})
            r = client.chat.completions.create(
                model=MODEL,
                messages=messages,
                tools=tools,
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=60,
                temperature=0.0,
            )
            turns.append((r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens))
            reply = r.choices[0].message
            messages.append(reply.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
            calls += len(reply.tool_calls or [])
            for call in reply.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 25 degrees"})
    check(turns, calls)


def test_anthropic_messages(server):
    tools = [{"name": "get_weather", "input_schema": CITY}]
    messages: list[dict] = []
    turns, calls = [], 0
    with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60) as client:
        for k in range(TURNS):
            results = [
                b for b in (messages[-1]["content"] if messages else []) if b.get("type") == "tool_use"
            ]
            question = {"type": "text", "text": QUESTIONS[k]}
            content = [
                *(
                    {"type": "tool_result", "tool_use_id": b["id"], "content": "sunny, 25 degrees"}
                    for b in results
                ),
                question,
            ]
            messages.append({"role": "user", "content": content})
            m = client.messages.create(
                model=MODEL,
                max_tokens=60,
                system=SYSTEM,
                messages=messages,
                tools=tools,
                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                extra_body={"temperature": 0.0},
            )
            u = m.usage
            turns.append((u.input_tokens + u.cache_read_input_tokens, u.cache_read_input_tokens))
            messages.append({"role": "assistant", "content": [b.to_dict() for b in m.content]})
            calls += sum(isinstance(b.input, dict) for b in m.content if b.type == "tool_use")
    check(turns, calls)


def test_responses(server):
    tools = [{"type": "function", "name": "get_weather", "parameters": CITY}]
    items: list[dict] = []
    turns, calls = [], 0
    with server.client(timeout=60) as client:
        for k in range(TURNS):
            items.append({"role": "user", "content": QUESTIONS[k]})
            r = client.responses.create(
                model=MODEL,
                instructions=SYSTEM,
                input=items,
                tools=tools,
                tool_choice="required",
                parallel_tool_calls=False,
                max_output_tokens=60,
                temperature=0.0,
            )
            turns.append((r.usage.input_tokens, r.usage.input_tokens_details.cached_tokens))
            for item in r.output:
                items.append(item.to_dict())
                if item.type == "function_call":
                    calls += 1
                    items.append({"type": "function_call_output", "call_id": item.call_id, "output": "sunny"})
    check(turns, calls)
