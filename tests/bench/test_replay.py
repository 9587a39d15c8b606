"""The replay client against the in-test fake server (tests/bench/fake_server.py) on 127.0.0.1."""

import pytest

from flashstate.bench.metrics import summarize
from flashstate.bench.replay import SessionSource
from flashstate.bench.synthetic import session_stream
from flashstate.bench.workloads import Request, Session

from .fake_server import FakeServer
from .helpers import chain, run


def test_closed_loop_lanes_think_times_and_request_bodies():
    server = FakeServer(token_delay_s=0.01)
    res = run(server, [chain("a"), chain("b"), chain("c")], agents=2, max_sessions=3, time_scale=0.05)
    assert len(server.seen) == len(res.requests) == 9
    body = server.seen[0].body
    assert body["max_tokens"] == 2 and body["ignore_eos"] and body["stream"]
    assert body["stream_options"] == {"include_usage": True} and body["model"] == "fake"
    by_session = {}
    for r, seen in zip(sorted(res.requests, key=lambda r: r.t_send), server.seen, strict=True):
        by_session.setdefault(r.session, []).append(seen)
        assert len(seen.prompt) == r.sent_tokens == r.prompt_tokens
    assert sorted(k.split("#")[0] for k in by_session) == ["a", "b", "c"]
    assert sorted(k.split("#")[1] for k in by_session) == ["0", "1", "2"]
    for seen in by_session.values():  # a turn is sent think_time · time_scale after the previous ended
        assert [len(s.prompt) for s in seen] == [10, 16, 22]
        for prev, nxt in zip(seen, seen[1:], strict=False):
            assert nxt.t_arrive - prev.t_done >= 0.05 - 0.005
    events = sorted([(s.t_arrive, 1) for s in server.seen] + [(s.t_done, -1) for s in server.seen])
    running = peak = 0
    for _, d in events:
        running += d
        peak = max(peak, running)
    assert peak == 2  # two lanes, never more requests at once
    assert all(s.complete for s in res.sessions) and {s.lane for s in res.sessions} == {0, 1}


def test_subagents_run_concurrently_in_the_lane_and_join_before_the_next_turn():
    subs = (Session("s/x", chain("x").requests[:2], 4, "s"), Session("s/y", chain("y").requests[:2], 4, "s"))
    server = FakeServer(token_delay_s=0.02)
    res = run(server, [chain("s", subagents=subs)], agents=1, max_sessions=1, time_scale=0.01)
    names = [(r.session, r.depth, r.turn) for r in sorted(res.requests, key=lambda r: r.t_send)]
    assert names[0] == ("s#0", 0, 0) and names[-2:] == [("s#0", 0, 1), ("s#0", 0, 2)]
    assert sorted(names[1:5]) == [("s#0/x", 1, 0), ("s#0/x", 1, 1), ("s#0/y", 1, 0), ("s#0/y", 1, 1)]
    seen = server.seen
    first_x, first_y = seen[1], seen[2]
    assert first_y.t_arrive < first_x.t_done  # the sub-agents overlap
    assert seen[5].t_arrive >= max(s.t_done for s in seen[1:5])  # joined before the parent's turn 1
    assert res.sessions[0].complete and res.sessions[0].done == 7 == res.sessions[0].turns


def test_cached_tokens_from_usage_and_cross_check():
    server = FakeServer(policy="vllm", block=4)
    res = run(server, [chain("a", 4), chain("b", 4)], agents=2, max_sessions=2, time_scale=0.0)
    assert [r.cached_tokens for r in res.requests] == [s.cached for s in server.seen]
    # Prompts of 10, 16, 22, 28 tokens; a vLLM-like cache hits the previous prompt floored to 4 tokens.
    assert {r.cached_tokens for r in res.requests if r.turn > 0} == {8, 16, 20}
    s = summarize(res.requests, res.sessions, 0.0, res.stopped_s)
    assert s["token_hit_rate"] == pytest.approx(server.cached_tokens / server.prompt_tokens)
    assert s["uncached_tokens"] == server.prompt_tokens - server.cached_tokens
    assert s["run_cached_tokens"] == server.cached_tokens
    assert res.server_after['vllm:prefix_cache_hits_total{model_name="fake"}'] == server.cached_tokens
    assert all(r.ttft is not None and 0 < r.ttft <= r.e2e for r in res.requests)


def test_echoed_output_stays_in_the_agent_context():
    server = FakeServer(echo_ids=True)
    res = run(server, [chain("a")], agents=1, max_sessions=1, time_scale=0.0)
    p0, p1 = server.seen[0].prompt, server.seen[1].prompt
    out0 = [(sum(p0) + i) % 1000 for i in range(2)]
    assert p1[:12] == p0 + out0 and len(p1) == 16  # prompt + output + the trace's new tokens
    assert server.seen[1].cached == 12  # the fake flashstate cache holds prompt + output
    assert all(r.echoed for r in res.requests)


def test_chat_mode_sends_messages_with_the_assistant_turns():
    server = FakeServer()
    res = run(server, [chain("a")], agents=1, max_sessions=1, time_scale=0.0, mode="chat")
    assert [s.path for s in server.seen] == ["/v1/chat/completions"] * 3
    msgs = server.seen[1].body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"].split() == [
        f"w{t}" for t in [(sum(server.seen[0].prompt) + i) % 1000 for i in range(2)]
    ]
    assert msgs[0]["content"] == server.seen[0].body["messages"][0]["content"]
    assert server.seen[1].cached > 0 and all(
        r.cached_tokens == s.cached for r, s in zip(res.requests, server.seen, strict=True)
    )


def test_warmup_window_and_drain():
    server = FakeServer(token_delay_s=0.03)
    res = run(
        server,
        session_stream(seed=0),
        agents=3,
        warmup_s=0.3,
        duration_s=0.6,
        length_scale=0.002,
        max_output_tokens=4,
        time_scale=0.0,
    )
    assert 0.9 <= res.stopped_s < 1.2 and res.cut_requests == 0
    assert len(res.requests) == len(server.seen)  # everything sent before the end finished and counts
    assert max(r.t_send for r in res.requests) <= res.stopped_s
    s = summarize(res.requests, res.sessions, 0.3, 0.9)
    assert s["requests"] == sum(0.3 <= r.t_send < 0.9 for r in res.requests) < len(res.requests)
    assert 0 < s["output_tokens"] < sum(r.output_tokens for r in res.requests)


def test_max_requests_bounds_the_run():
    server = FakeServer()
    res = run(
        server,
        session_stream(seed=1),
        agents=3,
        max_requests=5,
        length_scale=0.002,
        time_scale=0.0,
        max_output_tokens=2,
    )
    assert len(server.seen) == len(res.requests) == 5


def test_max_context_truncates_a_session_and_scales_apply():
    server = FakeServer(max_model_len=40)
    long = Session("l", tuple(Request(20 + 20 * k, 8, tuple(range(1, 6 + 5 * k))) for k in range(4)), 4, "l")
    res = run(server, [long], agents=1, max_sessions=1, time_scale=0.0, length_scale=0.5)
    # Scaled by 0.5: prompts 10, 20, 30, 40 with max_tokens 4; the last would need 44 > 40 tokens.
    assert [len(s.prompt) for s in server.seen] == [10, 20, 30]
    assert all(s.body["max_tokens"] == 4 for s in server.seen)
    assert res.sessions[0].truncated and res.sessions[0].complete and res.max_context == 40


def test_a_prompt_the_server_refuses_as_too_long_ends_the_session():
    server = FakeServer(max_model_len=20)
    res = run(server, [chain("a")], agents=1, max_sessions=1, time_scale=0.0, max_context=1000)
    assert [len(s.prompt) for s in server.seen] == [10, 16, 22]  # 22 + 2 > 20: refused
    s = summarize(res.requests, res.sessions, 0.0, res.stopped_s)
    assert (s["requests"], s["too_long"], s["errors"]) == (2, 1, 0)
    assert res.sessions[0].truncated and res.sessions[0].complete


def test_failed_request_fails_its_session_and_the_lane_goes_on():
    server = FakeServer(fail=lambda body: len(body["prompt"]) == 16)
    res = run(server, [chain("a"), chain("b")], agents=1, max_sessions=2, time_scale=0.0)
    errors = [r for r in res.requests if r.error]
    assert len(errors) == 2 and "HTTP 500" in errors[0].error  # turn 1 of each session fails
    assert [s.failed for s in res.sessions] == [True, True] and len(server.seen) == 4
    assert summarize(res.requests, res.sessions, 0.0, res.stopped_s)["errors"] == 2


def test_session_source_cycles_with_fresh_scopes_in_a_seeded_order():
    sessions = [chain(x) for x in "abc"]
    src = SessionSource(sessions, seed=5)
    draws = [src.draw() for _ in range(6)]
    assert sorted(d[0].id for d in draws[:3]) == ["a", "b", "c"]
    assert [d[1] for d in draws[:3]] == [d[0].id for d in draws[:3]]  # first pass: the trace's scope
    assert all(d[1] == d[0].id + "@1" for d in draws[3:])  # a repeat does not hit the first pass's cache
    assert [d[2] for d in draws] == [f"{d[0].id}#{k}" for k, d in enumerate(draws)]
    again = SessionSource(sessions, seed=5)
    assert [again.draw()[0].id for _ in range(6)] == [d[0].id for d in draws]
    limited = SessionSource(sessions, limit=1)
    assert limited.draw() is not None and limited.draw() is None


def test_chat_and_token_modes_replay_the_same_turns_under_max_context():
    """The chat template adds tokens the trace does not count (here: role markers); a session still ends at
    the turn the trace's lengths say, in both modes, as in the simulator."""
    for mode in ("completions", "chat"):
        server = FakeServer()
        res = run(
            server, [chain("a", turns=6)], agents=1, max_sessions=1, time_scale=0.0, max_context=30, mode=mode
        )
        # prompts of 10, 16, 22, 28 tokens with max_tokens 2 fit 30; the fifth (34) does not
        assert len(server.seen) == 4 and res.sessions[0].truncated, mode
        assert mode == "completions" or all(s.body.get("messages") for s in server.seen)
