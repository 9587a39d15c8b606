"""Client disconnects abort their requests and give every KV block and state slot back; past the waiting
bound the server answers 503 at once. One running slot (`--max-num-seqs 1`) and prefix caching off, so
an idle engine has exactly full pools."""

import asyncio

import openai
import pytest

from tests.server.conftest import assert_error, running_server

NAME = "tiny"
LONG = {"max_tokens": 20000, "temperature": 0.0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(module_tmp, tiny_model_dir):
    args = [
        tiny_model_dir,
        "--served-model-name", NAME,
        "--max-num-seqs", "1",
        "--max-waiting-requests", "2",
        "--no-enable-prefix-caching",
        "--prefill-cost-coefficients", "1e-4", "0",
    ]  # fmt: skip
    with running_server(module_tmp, args) as s:
        yield s


def idle(m: dict) -> bool:
    return (
        m["vllm:num_requests_running"] == 0
        and m["vllm:num_requests_waiting"] == 0
        and m["flashstate:kv_blocks_free"] == m["flashstate:kv_blocks_total"]
        and m["flashstate:state_slots_free"] == m["flashstate:state_slots_total"]
    )


def test_disconnect_mid_stream_frees_blocks_and_slots(server):
    aborted = server.metrics().get("flashstate:requests_aborted_total", 0)
    with server.client(timeout=60) as client:
        stream = client.completions.create(model=NAME, prompt="def main():" * 20, stream=True, **LONG)
        got = [chunk for _, chunk in zip(range(3), stream, strict=False)]
        busy = server.metrics()
        stream.close()  # the client goes away mid-stream
    assert len(got) == 3
    assert busy["vllm:num_requests_running"] == 1
    assert busy["flashstate:kv_blocks_free"] < busy["flashstate:kv_blocks_total"]
    m = server.wait_metrics(idle)
    assert m["flashstate:requests_aborted_total"] == aborted + 1
    assert m["vllm:generation_tokens_total"] < 20000  # it stopped early


def test_chat_disconnect_mid_stream_frees(server):
    with server.client(timeout=60) as client:
        stream = client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "go on"}], stream=True, **LONG
        )
        next(iter(stream))
        stream.close()
    server.wait_metrics(idle)


def test_overload_gets_503_and_waiting_disconnects_free(server):
    """1 running + 2 waiting fills the bound; the next request is refused at once with 503. Cancelling the
    waiting (not yet started, non-streaming) and the running requests leaves the engine idle."""

    async def main():
        async with server.async_client(timeout=60) as client:
            running = await client.completions.create(model=NAME, prompt="a b c", stream=True, **LONG)
            first = await anext(aiter(running))
            waiting = [
                asyncio.create_task(client.completions.create(model=NAME, prompt=f"wait {i}", **LONG))
                for i in range(2)
            ]
            busy = await asyncio.to_thread(server.wait_metrics, lambda m: m["vllm:num_requests_waiting"] == 2)
            with pytest.raises(openai.APIStatusError) as refused:
                await client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}])
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            await asyncio.to_thread(server.wait_metrics, lambda m: m["vllm:num_requests_waiting"] == 0)
            still = server.metrics()["vllm:num_requests_running"]
            await running.close()
            return first, refused.value, still, busy

    first, refused, still_running, busy = asyncio.run(main())
    assert first.choices[0].index == 0
    assert_error(refused.status_code, refused.body and {"error": refused.body}, 503, "overloaded")
    assert "overloaded" in refused.message
    assert int(refused.response.headers["retry-after"]) >= 1
    assert busy["flashstate:queue_oldest_wait_seconds"] > 0
    assert busy["flashstate:preemptions_total{kind=checkpoint}"] == 0
    assert "flashstate:preemptions_total{kind=recompute}" in busy
    assert still_running == 1  # cancelling the waiting ones left the running one alone
    m = server.wait_metrics(idle)
    assert m["flashstate:requests_rejected_total{reason=overload}"] == 1
    assert server.request("GET", "/health")[0] == 200
    with server.client() as client:  # and it serves again
        assert client.completions.create(model=NAME, prompt="ok", max_tokens=2).usage.completion_tokens == 2
