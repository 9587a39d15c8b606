"""The chat path's prompt and checkpoint positions, with the embedded model's real tokenizer and template."""

import pytest

from flashstate.server.errors import APIError
from flashstate.server.protocol import ChatCompletionRequest
from flashstate.server.serving_chat import render_chat
from flashstate.tokenizer import Tokenizer

MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Open main.py"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "print('hi')"},
]
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return Tokenizer.from_dir(tiny_model_dir)


def request(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": MESSAGES, **kw})


def test_prompt_is_the_rendered_template_and_positions_end_messages(tokenizer):
    ids, positions = render_chat(tokenizer, request(tools=TOOLS))
    text = tokenizer.apply_chat_template(MESSAGES, TOOLS)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert positions == sorted(set(positions)) and positions[-1] == len(ids)
    assert len(positions) == len(MESSAGES) + 1  # each message's end, then the generation prompt
    for k, end in enumerate(positions[:-1]):  # each is the token length of the conversation so far
        prefix = tokenizer.apply_chat_template(MESSAGES[: k + 1], TOOLS, add_generation_prompt=False)
        assert tokenizer.decode(ids[:end], skip_special_tokens=False) == prefix


def test_tools_change_the_prompt(tokenizer):
    plain, _ = render_chat(tokenizer, request())
    with_tools, _ = render_chat(tokenizer, request(tools=TOOLS, tool_choice="auto"))
    assert len(with_tools) > len(plain)


def test_without_generation_prompt_the_last_message_ends_the_prompt(tokenizer):
    ids, positions = render_chat(tokenizer, request(add_generation_prompt=False))
    assert len(positions) == len(MESSAGES) and positions[-1] == len(ids)


def test_reserved_template_kwargs_are_refused(tokenizer):
    with pytest.raises(APIError, match="may not set"):
        render_chat(tokenizer, request(chat_template_kwargs={"messages": []}))
