"""One chat reply with reasoning, text and two tool calls, as the chat pipeline gives it: the streamed
chunks (CHUNKS) and the non-streamed body (BODY). The Anthropic and Responses translation tests feed both
through their translators and compare what the SDKs make of them."""

MODEL = "flashstate-tiny"
# the get_weather tool's JSON schema, offered by both dialects' tool tests
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "maximum": 9}},
    "required": ["city"],
    "additionalProperties": False,
}


def _chunk(delta=None, finish=None, usage=None):
    choices = (
        [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    )
    body = {
        "id": "chatcmpl-abc",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return body


USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 9,
    "total_tokens": 39,
    "prompt_tokens_details": {"cached_tokens": 20},
}
CHUNKS = [
    _chunk({"role": "assistant", "content": ""}, usage={**USAGE, "completion_tokens": 0}),
    _chunk({"reasoning_content": "The user wants "}),
    _chunk({"reasoning_content": "the weather."}),
    _chunk({"content": "Checking."}),
    _chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        }
    ),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    _chunk(
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                }
            ]
        },
        finish="tool_calls",
    ),
    _chunk(usage=USAGE),
]
BODY = {
    "id": "chatcmpl-abc",
    "object": "chat.completion",
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "reasoning_content": "The user wants the weather.",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                    },
                ],
            },
            "finish_reason": "tool_calls",
            "stop_reason": None,
        }
    ],
    "usage": USAGE,
}
