"""Request models in process: strict parsing, error paths, and the mapping to SamplingParams."""

import json

import pytest
from pydantic import ValidationError

from flashstate.server.errors import APIError, from_validation_error
from flashstate.server.protocol import ChatCompletionRequest, CompletionRequest, usage


def parse(model, body: dict):
    return model.model_validate_json(json.dumps(body))


def error_of(model, body) -> APIError:
    raw = body if isinstance(body, bytes) else json.dumps(body)
    with pytest.raises(ValidationError) as e:
        model.model_validate_json(raw)
    return from_validation_error(e.value)


@pytest.mark.parametrize(
    ("body", "prompts"),
    [
        ({"prompt": "hi"}, ["hi"]),
        ({"prompt": [1, 2]}, [[1, 2]]),
        ({"prompt": ["a", "b"]}, ["a", "b"]),
        ({"prompt": [[1], [2, 3]]}, [[1], [2, 3]]),
    ],
)
def test_completion_prompt_forms(body, prompts):
    assert parse(CompletionRequest, body).prompts() == prompts


def test_error_names_the_field_path():
    e = error_of(
        ChatCompletionRequest,
        {"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": 3}]},
    )
    assert e.status == 400 and e.param == "messages[1].content" and e.code == "invalid_type"
    e = error_of(CompletionRequest, {"prompt": [[1, "a"]]})
    assert e.param == "prompt"
    e = error_of(CompletionRequest, {"prompt": "x", "stream_options": {"include_usage": 1}})
    assert e.param == "stream_options.include_usage"
    assert error_of(CompletionRequest, {}).code == "missing_required_parameter"
    assert error_of(CompletionRequest, b"\xff").code == "invalid_json"


def test_strict_types_are_not_coerced():
    for body in (
        {"prompt": "x", "max_tokens": "5"},
        {"prompt": "x", "max_tokens": True},
        {"prompt": "x", "seed": 1.5},
    ):
        assert error_of(CompletionRequest, body).param == next(k for k in body if k != "prompt")
    assert parse(CompletionRequest, {"prompt": "x", "temperature": 1}).temperature == 1.0  # int for a float


def test_completion_sampling_params():
    p = parse(
        CompletionRequest,
        {
            "prompt": "x",
            "max_tokens": 9,
            "temperature": 0,
            "top_k": 5,
            "stop": "\n",
            "seed": 4,
            "ignore_eos": True,
        },
    ).to_sampling_params()
    assert (p.max_tokens, p.temperature, p.top_k, p.stop, p.seed, p.ignore_eos) == (9, 0, 5, ("\n",), 4, True)
    assert parse(CompletionRequest, {"prompt": "x"}).to_sampling_params().max_tokens == 16  # OpenAI's default


def test_chat_max_tokens_and_logprobs():
    base = {"messages": [{"role": "user", "content": "x"}]}
    assert parse(ChatCompletionRequest, base).to_sampling_params().max_tokens is None  # up to max_model_len
    both = parse(ChatCompletionRequest, {**base, "max_tokens": 5, "max_completion_tokens": 7})
    assert both.to_sampling_params().max_tokens == 7
    lp = parse(ChatCompletionRequest, {**base, "logprobs": True, "top_logprobs": 2}).to_sampling_params()
    assert lp.logprobs == 2
    assert parse(ChatCompletionRequest, base).to_sampling_params().logprobs is None


def test_sampling_value_errors_name_their_field():
    for field, value in (("temperature", -1), ("top_p", 0), ("min_p", 1.5), ("n", 0), ("max_tokens", 0)):
        with pytest.raises(APIError) as e:
            parse(CompletionRequest, {"prompt": "x", field: value}).to_sampling_params()
        assert e.value.status == 400 and e.value.param == field


def test_tools_reach_the_template():
    tool = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
    req = parse(
        ChatCompletionRequest,
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "a.py", "reasoning_content": "kept"},
            ],
            "tools": [tool],
            "tool_choice": {"type": "function", "function": {"name": "ls"}},
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    assert req.template_tools() == [tool]
    assert req.template_kwargs() == {
        "enable_thinking": False,
        "tool_choice": {"type": "function", "function": {"name": "ls"}},
    }
    call, result = (m.to_template() for m in req.messages)
    assert call == {  # as vLLM gives templates: content "" beside calls, arguments as an object
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": {}}}],
    }
    assert call["tool_calls"][0]["function"]["arguments"].text == "{}"  # what `tojson` writes back
    assert result == {"role": "tool", "tool_call_id": "c1", "content": "a.py", "reasoning_content": "kept"}


def test_tool_choice_must_match_tools():
    msgs = [{"role": "user", "content": "x"}]
    tool = {"type": "function", "function": {"name": "ls"}}
    other = {"type": "function", "function": {"name": "cat"}}
    with pytest.raises(APIError, match="not in tools"):
        parse(
            ChatCompletionRequest, {"messages": msgs, "tools": [tool], "tool_choice": other}
        ).template_tools()
    with pytest.raises(APIError, match="needs tools"):
        parse(ChatCompletionRequest, {"messages": msgs, "tool_choice": "required"}).template_tools()


def test_usage_has_cached_tokens():
    assert usage(10, 3, 8) == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
