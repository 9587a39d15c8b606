"""Retryable failures (a replica behind a router dying): a stream that ends before [DONE], a transport
error or a 502-504 is sent again up to `retries` times; the failed attempts stay recorded as errors."""

from flashstate.bench.metrics import summarize

from .fake_server import FakeServer
from .helpers import chain, run


def _cut_first_attempt_of_turn_1():
    seen = set()

    def cut(body) -> bool:
        key = tuple(body["prompt"])
        if len(key) != 16 or key in seen:
            return False
        seen.add(key)
        return True

    return cut


def test_a_cut_stream_is_retried_and_the_session_goes_on():
    server = FakeServer(cut=_cut_first_attempt_of_turn_1())
    res = run(server, [chain("a"), chain("b")], agents=2, max_sessions=2, time_scale=0.0, retries=2)
    errors = [r for r in res.requests if r.error]
    assert len(errors) == 2 and all("before [DONE]" in r.error for r in errors)
    assert [s.failed for s in res.sessions] == [False, False] and all(s.done == 3 for s in res.sessions)
    assert len(server.seen) == 8  # 2 sessions × 3 turns, and one retry each
    assert summarize(res.requests, res.sessions, 0.0, res.stopped_s)["errors"] == 2


def test_without_retries_a_cut_stream_fails_its_session():
    server = FakeServer(cut=_cut_first_attempt_of_turn_1())
    res = run(server, [chain("a")], agents=1, max_sessions=1, time_scale=0.0)
    assert res.sessions[0].failed and "before [DONE]" in res.requests[-1].error


def test_a_500_is_not_retried():
    server = FakeServer(fail=lambda body: len(body["prompt"]) == 16)
    res = run(server, [chain("a")], agents=1, max_sessions=1, time_scale=0.0, retries=3)
    assert res.sessions[0].failed and len(server.seen) == 2


def test_a_routers_500_for_an_unreachable_replica_is_retried():
    """vllm-router answers 500 `Request failed: error sending request ...` when the replica it picked
    refuses the connection (it died): retried, unlike a server's own 500."""
    import asyncio

    import httpx

    from flashstate.bench import client

    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(500, text="Request failed: error sending request for url (http://x/v1)")
        return httpx.Response(500, json={"error": {"message": "boom", "type": "server_error"}})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return [await client.stream(http, "http://r/v1/completions", {}, 5.0) for _ in range(2)]

    routed, own = asyncio.run(go())
    assert routed.retryable and "Request failed" in routed.error
    assert not own.retryable and own.error.startswith("HTTP 500")
