"""The official `openai` client (sync and async) against `flashstate serve` on the embedded default model."""

import asyncio
import re

import openai
import pytest

from tests.server.conftest import assert_error, running_server

KEY = "sk-test-key"
MODEL = "flashstate-tiny"  # the embedded default's served name


@pytest.fixture(scope="module")
def server(module_tmp):
    with running_server(module_tmp, ["--max-model-len", "2k"], api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=60) as c:
        yield c


def greedy(**kw):
    return {"temperature": 0.0, "extra_body": {"ignore_eos": True}, **kw}


def test_models_lists_the_served_model(client):
    (card,) = client.models.list().data
    assert card.id == MODEL and card.owned_by == "flashstate"
    assert card.model_extra["max_model_len"] == 2000


def test_the_server_shortens_the_gil_switch_interval(server):
    """The event loop and host-tier threads wait at most 1 ms (not Python's 5) for the engine thread."""
    assert "GIL switch interval 1 ms" in server.log_tail(100_000)


def test_the_server_freezes_its_start_up_for_the_collector_and_logs_threads_and_pauses_at_exit(tmp_path):
    with running_server(tmp_path, ["--max-model-len", "2k"]) as s:
        with s.client(timeout=60) as c:
            c.completions.create(model=MODEL, prompt="def", max_tokens=3, **greedy())
        started = s.log_tail(100_000)
    frozen = r"garbage collector: \d{4,} start-up objects frozen, generation 0 threshold 50000"
    assert re.search(frozen, started)
    log = s.log_tail(100_000)  # after SIGTERM
    assert re.search(r"threads' CPU seconds: .*flashstate-engine \d+\.\d s", log)
    assert re.search(r"garbage collector pauses: gen0 \d+ × [\d.]+ ms \(longest", log)


def test_health_version_and_metrics_need_no_key(server):
    assert server.request("GET", "/health")[0] == 200
    status, body = server.request("GET", "/version")
    assert status == 200 and b"version" in body
    assert server.request("GET", "/metrics")[0] == 200


def test_api_key_is_required_on_v1(server):
    with server.client() as c, pytest.raises(openai.AuthenticationError) as e:
        c.with_options(api_key="wrong").models.list()
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    status, body = server.post_json("/v1/completions", {"prompt": "x"}, auth=False)
    assert_error(status, body, 401, "invalid_api_key")


def test_completion_text_prompt(client):
    r = client.completions.create(model=MODEL, prompt="def fib(n):", max_tokens=5, **greedy())
    (choice,) = r.choices
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")
    assert choice.finish_reason == "length" and isinstance(choice.text, str)
    u = r.usage
    assert u.completion_tokens == 5 and u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + 5
    assert 0 <= u.prompt_tokens_details.cached_tokens <= u.prompt_tokens


def test_completion_token_ids_and_batch(client):
    one = client.completions.create(model=MODEL, prompt=[11, 12, 13, 14], max_tokens=3, **greedy())
    assert one.usage.prompt_tokens == 4 and len(one.choices) == 1
    batch = client.completions.create(
        model=MODEL, prompt=[[11, 12, 13, 14], [21, 22]], max_tokens=3, **greedy()
    )
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == one.choices[0].text  # greedy: the same prompt gives the same text
    assert batch.usage.prompt_tokens == 6 and batch.usage.completion_tokens == 6
    texts = client.completions.create(model=MODEL, prompt=["a b c"], max_tokens=2, **greedy())
    assert len(texts.choices) == 1


def test_streamed_completion_equals_unstreamed(client):
    kw = greedy(model=MODEL, prompt="class Stack:", max_tokens=8)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 8
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.prompt_tokens_details.cached_tokens is not None


def test_chat_streamed_equals_unstreamed(client):
    kw = greedy(
        model=MODEL, messages=[{"role": "user", "content": "Write a haiku."}], max_completion_tokens=6
    )
    whole = client.chat.completions.create(**kw)
    msg = whole.choices[0].message
    assert whole.object == "chat.completion" and msg.role == "assistant"
    assert whole.usage.completion_tokens == 6 and whole.usage.prompt_tokens_details.cached_tokens is not None
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content
    assert (
        chunks[-1].usage.completion_tokens == 6
        and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    )


def test_second_turn_reports_cached_tokens(server, client):
    """The next turn re-sends the first turn's messages and reply: that prefix comes from the cache, and the
    usage says how much, as /metrics does (vLLM's token-based prefix_cache_hits)."""
    messages = [
        {"role": "system", "content": "You are a careful coding agent. " * 8},
        {"role": "user", "content": "List the files."},
    ]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, **greedy())
    hits_before = server.metrics()["vllm:prefix_cache_hits_total"]
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Now open main.py."},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, **greedy())
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens <= cached < second.usage.prompt_tokens
    assert server.metrics()["vllm:prefix_cache_hits_total"] - hits_before == cached


def test_chat_message_ends_reach_the_engine_as_checkpoints(server, client):
    """The chat path hands the engine each message's end; the flashstate policy keeps a checkpoint at each
    (plus the prompt end and the frontier), where a plain completion keeps two."""
    messages = [
        {"role": "system", "content": "Session 7f3e: a fresh context."},
        {"role": "user", "content": "Open the parser."},
        {"role": "assistant", "content": "Opened parser.py."},
        {"role": "user", "content": "Fix the bug."},
    ]
    before = server.metrics()["flashstate:checkpoints"]
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, **greedy())
    assert server.metrics()["flashstate:checkpoints"] - before >= len(messages) + 1


def test_chat_with_tools_and_tool_results(client):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "user", "content": "Open main.py"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "main.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "print('hello')"},
    ]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, **greedy())
    with_tools = client.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, tool_choice="none", max_tokens=2, **greedy()
    )
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens  # the schemas are in the prompt
    named = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "read_file"}},
        max_tokens=2,
        **greedy(),
    )
    assert named.choices[0].finish_reason == "length"


def test_stop_string_ends_the_output(client):
    kw = greedy(model=MODEL, prompt="import os\n", max_tokens=12)
    text = client.completions.create(**kw).choices[0].text
    cut = next(i for i in range(2, len(text)) if text[i].strip())  # a non-blank character past the start
    stop = text[cut : cut + 1]
    r = client.completions.create(stop=[stop], **kw)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == text[: text.index(stop)]


def test_seeded_sampling_repeats(client):
    kw = dict(model=MODEL, prompt="x = ", max_tokens=6, temperature=1.0, top_p=0.9, seed=7)
    kw["extra_body"] = {"top_k": 50, "min_p": 0.01, "ignore_eos": True}
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


def test_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="for i in", max_tokens=3, logprobs=0, **greedy())
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 3 and all(x <= 0 for x in lp.token_logprobs)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, logprobs=True, **greedy()
    )
    assert [c.logprob <= 0 for c in chat.choices[0].logprobs.content] == [True] * 3


def test_async_client_concurrent_streams(server):
    async def one(client, i):
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"task {i}"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
            **greedy(),
        )
        return [chunk async for chunk in stream]

    async def main():
        async with server.async_client(timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(4)))

    for chunks in asyncio.run(main()):
        assert chunks[-1].usage.completion_tokens == 4
        assert chunks[-2].choices[0].finish_reason == "length"


def test_metrics_in_prometheus_format(server):
    m = server.metrics()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "flashstate:checkpoints",
        "flashstate:checkpoint_bytes",
        "flashstate:host_cache_hits_total",
    ):
        assert name in m, name
    assert any(k.startswith("flashstate:prefill_cost_coefficient{") and "term=a" in k for k in m)
    assert m["vllm:prompt_tokens_total"] > 0 and m["vllm:generation_tokens_total"] > 0
    finished = sum(v for k, v in m.items() if k.startswith("vllm:request_success_total"))
    assert m["vllm:e2e_request_latency_seconds_count"] == finished > 0
    assert m["vllm:prefix_cache_hits_total"] <= m["vllm:prefix_cache_queries_total"]


def test_one_token_streams_finish_in_their_first_chunk(client):
    chat = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1, stream=True, **greedy()
        )
    )
    assert chat[0].choices[0].delta.role == "assistant" and chat[-1].choices[0].finish_reason == "length"
    batch = list(
        client.completions.create(model=MODEL, prompt=[[1, 2], [3, 4]], max_tokens=1, stream=True, **greedy())
    )
    assert sorted(c.choices[0].index for c in batch if c.choices[0].finish_reason) == [0, 1]


def test_return_token_ids_lets_an_agent_resend_its_reply_exactly(client):
    kw = {"temperature": 0.0, "extra_body": {"ignore_eos": True, "return_token_ids": True}}
    prompt = list(range(40, 140))
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, **kw)
    ids = whole.choices[0].model_extra["token_ids"]
    streamed = [
        i
        for c in client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, stream=True, **kw)
        for i in (c.choices[0].model_extra.get("token_ids") or [] if c.choices else [])
    ]
    assert len(ids) == 6 and streamed == ids
    # The next turn re-sends prompt + reply: the frontier checkpoint covers all but the last token.
    second = client.completions.create(model=MODEL, prompt=prompt + ids + [7, 8, 9], max_tokens=1, **kw)
    assert second.usage.prompt_tokens_details.cached_tokens == len(prompt) + len(ids) - 1


def test_chat_return_token_ids_are_the_generated_ids_whole_and_streamed(client):
    kw = {"temperature": 0.0, "max_tokens": 6, "extra_body": {"ignore_eos": True, "return_token_ids": True}}
    messages = [{"role": "user", "content": "Count with me."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, **kw)
    ids = whole.choices[0].model_extra["token_ids"]
    streamed = [
        i
        for c in client.chat.completions.create(model=MODEL, messages=messages, stream=True, **kw)
        for i in (c.choices[0].model_extra.get("token_ids") or [] if c.choices else [])
    ]
    assert len(ids) == whole.usage.completion_tokens == 6 and streamed == ids
