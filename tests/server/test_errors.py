"""Bad inputs get an OpenAI-style error with the right status, fast, and the server stays healthy."""

import json

import openai
import pytest

from tests.server.conftest import assert_error, running_server

NAME = "tiny"
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(module_tmp, tiny_model_dir):
    args = [
        tiny_model_dir,
        "--served-model-name", NAME,
        "--max-model-len", "4096",
        "--max-num-seqs", "2",
        "--kv-cache-memory-bytes", "1800Ki",  # a KV cache smaller than max-model-len
        "--max-request-body-bytes", "64Ki",
        "--prefill-cost-coefficients", "1e-4", "1e-8",
    ]  # fmt: skip
    with running_server(module_tmp, args) as s:
        yield s


def kv_capacity_tokens(server) -> int:
    m = server.metrics()
    (info,) = [k for k in m if k.startswith("vllm:cache_config_info")]
    block_size = int(info.split("block_size=")[1].split(",")[0])
    return int(m["flashstate:kv_blocks_total"]) * block_size


BAD = [
    # (endpoint, body, status, code, param)
    ("completions", b"{not json", 400, "invalid_json", None),
    ("completions", b'{"prompt": "\xff\xfe"}', 400, "invalid_json", None),
    ("completions", b"[1, 2]", 400, "invalid_type", None),
    ("completions", {"max_tokens": 2}, 400, "missing_required_parameter", "prompt"),
    ("completions", {"prompt": 5}, 400, "invalid_type", "prompt"),
    ("completions", {"prompt": "x", "max_tokens": "ten"}, 400, "invalid_type", "max_tokens"),
    ("completions", {"prompt": "x", "stream": "yes"}, 400, "invalid_type", "stream"),
    ("completions", {"prompt": ""}, 400, "invalid_value", "prompt"),
    ("completions", {"prompt": []}, 400, "invalid_value", "prompt"),
    ("completions", {"prompt": [1, 10**9]}, 400, "invalid_value", "prompt"),
    ("completions", {"prompt": "x", "temperature": -1}, 400, "invalid_value", "temperature"),
    ("completions", {"prompt": "x", "top_p": 1.5}, 400, "invalid_value", "top_p"),
    ("completions", {"prompt": "x", "top_k": -3}, 400, "invalid_value", "top_k"),
    ("completions", {"prompt": "x", "min_p": 2}, 400, "invalid_value", "min_p"),
    ("completions", {"prompt": "x", "max_tokens": 0}, 400, "invalid_value", "max_tokens"),
    ("completions", {"prompt": "x", "n": 0}, 400, "invalid_value", "n"),
    ("completions", {"prompt": "x", "stop": [""]}, 400, "invalid_value", "stop"),
    ("completions", {"prompt": "x", "echo": True, "logprobs": 1}, 400, "invalid_value", "echo"),
    ("completions", {"prompt": "x", "logprobs": 99}, 400, "invalid_value", "logprobs"),
    ("completions", {"prompt": "x", "presence_penalty": 2.5}, 400, "invalid_value", "presence_penalty"),
    ("completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "invalid_value", None),
    ("completions", {"prompt": "x", "max_tokens": 10**9}, 400, "context_length_exceeded", "max_tokens"),
    ("completions", {"prompt": "x", "model": "gpt-4"}, 404, "model_not_found", "model"),
    ("chat/completions", {"messages": []}, 400, "invalid_type", "messages"),
    ("chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_type", None),
    ("chat/completions", {"messages": [{"role": "user", "content": 7}]}, 400, "invalid_type", None),
    ("chat/completions", {"messages": [{"role": "user"}]}, 400, "invalid_value", "messages"),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "invalid_value",
        None,
    ),
    ("chat/completions", {"messages": CHAT, "tool_choice": "required"}, 400, "invalid_value", "tool_choice"),
    ("chat/completions", {"messages": CHAT, "top_logprobs": 2}, 400, "invalid_value", "top_logprobs"),
    (
        "chat/completions",
        {"messages": CHAT, "max_completion_tokens": 10**9},
        400,
        "context_length_exceeded",
        None,
    ),
    ("chat/completions", {"messages": CHAT, "model": "nope"}, 404, "model_not_found", "model"),
]


@pytest.mark.parametrize(("endpoint", "body", "status", "code", "param"), BAD)
def test_bad_input_gets_openai_error(server, endpoint, body, status, code, param):
    got, reply = server.post_json(f"/v1/{endpoint}", body)
    err = assert_error(got, reply, status, code)
    if param is not None:
        assert err["param"] == param


def test_prompt_over_max_model_len_is_400(server):
    got, reply = server.post_json("/v1/completions", {"prompt": [7] * 5000, "max_tokens": 1})
    assert_error(got, reply, 400, "context_length_exceeded")
    assert "max_model_len" in reply["error"]["message"]


def test_request_larger_than_the_kv_cache_is_400(server):
    capacity = kv_capacity_tokens(server)
    assert capacity < 4096 - 10, "the fixture's KV cache must be smaller than max-model-len"
    got, reply = server.post_json("/v1/completions", {"prompt": [5] * (capacity + 1), "max_tokens": 1})
    assert_error(got, reply, 400, "context_length_exceeded")
    assert "KV cache" in reply["error"]["message"]


def test_body_over_the_size_limit_is_413(server):
    body = json.dumps({"prompt": "x" * (80 << 10)}).encode()
    got, reply = server.post_json("/v1/completions", body)
    assert_error(got, reply, 413, "body_too_large")


def test_unknown_route_and_method_are_openai_errors(server):
    status, raw = server.request("GET", "/v1/nothing")
    assert_error(status, json.loads(raw), 404)
    status, raw = server.request("GET", "/v1/completions")
    assert_error(status, json.loads(raw), 405)


def test_openai_client_sees_the_errors(server):
    with server.client() as c:
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=NAME, prompt="x", temperature=-2)
        assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="nope", messages=CHAT)
        with pytest.raises(openai.BadRequestError):  # streaming too: the error comes before the stream
            c.completions.create(model=NAME, prompt=[7] * 5000, max_tokens=1, stream=True)


def test_server_still_healthy_after_bad_inputs(server):
    assert server.request("GET", "/health")[0] == 200
    with server.client() as c:
        r = c.completions.create(model=NAME, prompt="ok", max_tokens=2)
    assert r.usage.completion_tokens == 2
    m = server.metrics()
    assert m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0
    assert m["flashstate:prefill_cost_coefficient{source=given,term=a}"] == pytest.approx(1e-4)
    assert m["flashstate:prefill_cost_coefficient{source=given,term=b}"] == pytest.approx(1e-8)
